"""`swarm publish`: seed a model file to the swarm and publish its manifest, in the foreground."""

from __future__ import annotations

from swarm.cli.args import add_peer_args, check_swarm_choice, net


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
    from swarm.artifacts.publisher import run_publisher

    check_swarm_choice(args)
    run_publisher(args.model, args.initial_peers, net(args), args.data_dir)
