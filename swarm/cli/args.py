"""Argument types and options shared by several commands: checked at parse time (exit status 2).

This module does not start anything; `net` and `check_swarm_choice` only read parsed arguments.
"""

from __future__ import annotations

import argparse

from swarm.errors import SwarmError
from swarm.netaddr import NetConfig
from swarm.relay.rules import RelayLimits


def add_peer_args(p: argparse.ArgumentParser, bittorrent: bool = False) -> None:
    """Add the options of a peer that joins the DHT: --initial-peers, --host, --port, --public-address,
    --data-dir, and with `bittorrent` --bt-port."""
    p.add_argument(
        "--initial-peers", nargs="*", default=[], metavar="MADDR", help="peers to join the DHT through"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="listen address, an IPv4 or IPv6 literal (default 127.0.0.1); 0.0.0.0 or :: listens on "
        "every interface and advertises each interface address",
    )
    p.add_argument("--port", type=int, default=0, help="libp2p listen port (0: any free port)")
    if bittorrent:
        p.add_argument(
            "--bt-port",
            type=int,
            default=0,
            help="BitTorrent listen port for model bytes (0: any free port, the same on every interface)",
        )
    p.add_argument(
        "--public-address",
        default=None,
        metavar="IP",
        help="advertise only this address (e.g. a NAT's public IP forwarding --port"
        + (" and --bt-port" if bittorrent else "")
        + " here); needs a fixed --port",
    )
    p.add_argument("--data-dir", default=None, help="peer identity directory (default $SWARM_HOME)")


def add_relay_args(p: argparse.ArgumentParser, serving: bool = True) -> None:
    """Add the relay options (swarm.relay): --relay-port and --no-relay-service, and for a serving peer
    --reachability (swarm.reach) and --relay."""
    p.add_argument(
        "--relay-port", type=int, default=0,
        help="TCP port of the relay service this peer offers to peers behind NATs (0: any free port)",
    )
    p.add_argument(
        "--no-relay-service", action="store_true",
        help="do not relay streams for peers that cannot be dialled (a reachable peer does by default, "
        "within the budget below, which its offer announces)",
    )
    defaults = RelayLimits()
    p.add_argument("--relay-max-peers", type=positive, default=defaults.max_peers,
                   help=f"peers relayed for at once (default {defaults.max_peers})")
    p.add_argument("--relay-max-conns", type=positive, default=defaults.max_conns_per_peer,
                   help=f"relayed connections open at once per peer (default {defaults.max_conns_per_peer})")
    p.add_argument("--relay-rate", type=byte_size, default=defaults.bytes_per_s, metavar="SIZE",
                   help="relayed bytes per second per peer, e.g. 16MiB (default 16MiB)")
    if serving:
        p.add_argument(
            "--reachability", choices=("auto", "public", "private"), default="auto",
            help="auto: ask other peers to dial this one back and announce whether they could (and a "
            "public address they reached, so a port forward needs no --public-address); a peer found "
            "private takes a relay. public/private: announce that without asking (default auto)",
        )
        p.add_argument(
            "--relay", choices=("auto", "off"), default="auto",
            help="auto: a private peer is reached through a relay; off: never (default auto)",
        )


def relay_limits(args) -> RelayLimits:
    """The relay budget of parsed `add_relay_args` options."""
    return RelayLimits(max_peers=args.relay_max_peers, max_conns_per_peer=args.relay_max_conns,
                       bytes_per_s=args.relay_rate, burst_bytes=min(args.relay_rate, RelayLimits().burst_bytes))


def net(args) -> NetConfig:
    """The listen and advertised addresses of parsed `add_peer_args` options (unchecked)."""
    bt_port = getattr(args, "bt_port", 0)
    return NetConfig(host=args.host, port=args.port, bt_port=bt_port, public_address=args.public_address)


def check_swarm_choice(args) -> None:
    """Raises SwarmError unless exactly one of --initial-peers and --new-swarm was given."""
    if bool(args.initial_peers) == bool(args.new_swarm):
        raise SwarmError("pass either --initial-peers MADDR to join a swarm, or --new-swarm to start one")


def positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def byte_size(text: str) -> int:
    """argparse type: a size such as 512MiB or 4GB, in bytes."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(ByteSize).validate_python(text))
    except ValidationError:
        raise argparse.ArgumentTypeError(f"expected a size such as 512MiB or 4GB, got {text!r}") from None


def layers(text: str) -> tuple[int, int]:
    """argparse type: `A:B`, global layers [A, B) with 0 <= A < B."""
    try:
        a, b = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B with integers, got {text!r}") from None
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"need 0 <= A < B, got {text!r}")
    return a, b
