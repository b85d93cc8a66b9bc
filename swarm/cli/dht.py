"""`swarm dht`: a DHT-only peer that prints the multiaddrs others join with (`swarm.dht.node`)."""

from __future__ import annotations

from swarm.cli.args import add_peer_args, add_relay_args, net, relay_limits
from swarm.netaddr import check_net_config


def register(sub) -> None:
    """Add `dht` to the `swarm` subparsers `sub`."""
    d = sub.add_parser("dht", help="run a DHT-only peer and print the multiaddrs others join with")
    add_peer_args(d)
    add_relay_args(d, serving=False)
    d.set_defaults(func=_dht)


def _dht(args) -> None:
    check_net_config(net(args))  # before the node's imports (hivemind, torch: 2-3 s), as `serve`
    from swarm.dht.node import run_dht_only

    from functools import partial

    from swarm.relay.service import start_relay

    service = None if args.no_relay_service else partial(
        start_relay, host=args.host, port=args.relay_port, public_address=args.public_address,
        limits=relay_limits(args))
    run_dht_only(args.initial_peers, args.host, args.port, args.data_dir, args.public_address, service)
