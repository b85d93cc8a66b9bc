"""`swarm publish`: seed a model file to the swarm and publish its manifest, in the foreground."""

from __future__ import annotations

from swarm.cli.args import add_peer_args, check_swarm_choice, net
from swarm.netaddr import check_net_config


def register(sub) -> None:
    """Add `publish` to the `swarm` subparsers `sub`."""
    pb = sub.add_parser(
        "publish", help="seed a model file to the swarm and publish its manifest (foreground)"
    )
    pb.add_argument("model", metavar="NAME|PATH")
    add_peer_args(pb, bittorrent=True)
    pb.add_argument("--new-swarm", action="store_true", help="start a new swarm (no --initial-peers)")
    pb.set_defaults(func=_publish)


def _publish(args) -> None:
    check_swarm_choice(args)
    addresses = check_net_config(net(args))  # before the publisher's imports (hivemind, torch: 2-3 s), as `serve`
    from swarm.artifacts.publisher import run_publisher

    run_publisher(args.model, args.initial_peers, addresses, args.data_dir)
