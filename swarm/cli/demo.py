"""`swarm demo`: start a local swarm (a first peer + span peers), answer one prompt through it, stop it."""

from __future__ import annotations

import sys

from swarm.cli.args import positive
from swarm.cli.chat import print_stream
from swarm.models import DEFAULT_MODEL


def register(sub) -> None:
    """Add `demo` to the `swarm` subparsers `sub`."""
    dm = sub.add_parser(
        "demo", help="start a local swarm (a first peer + span peers), answer a prompt, stop it"
    )
    dm.add_argument("--model", default=DEFAULT_MODEL, help="NAME or PATH")
    dm.add_argument("--spans", type=positive, default=3, help="serving peers, each with a contiguous span")
    dm.add_argument("--prompt", default="Name three planets of the solar system.")
    dm.add_argument("--max-new-tokens", type=int, default=64)
    dm.add_argument("--json", action="store_true", help="print text and telemetry as one JSON object")
    dm.set_defaults(func=_demo)


def _demo(args) -> int:
    import tempfile
    from pathlib import Path

    from swarm.client.api import Client
    from swarm.localswarm import start_local_swarm
    from swarm.manifest import build_manifest
    from swarm.models import resolve_model

    path = resolve_model(args.model, progress=True)
    n_layers = build_manifest(path).n_layers
    with tempfile.TemporaryDirectory(prefix="swarm-demo-") as root:
        print(
            f"starting a local swarm: a first peer + {args.spans} peers serving {n_layers} layers",
            file=sys.stderr,
        )
        peers = start_local_swarm(Path(root), path, n_layers, args.spans)
        try:
            for p in peers.started[1:]:
                print(f"  peer {p.peer_id[:16]}… ready", file=sys.stderr)
            print(f"prompt: {args.prompt}", file=sys.stderr)
            with Client(str(path), initial_peers=peers.started[0].maddrs) as client:
                stream = client.chat_stream(
                    [{"role": "user", "content": args.prompt}], max_new_tokens=args.max_new_tokens
                )
                result = print_stream(stream, args.json)
            if not args.json:
                print(result.telemetry.summary(), file=sys.stderr)
        finally:
            peers.stop_all()
    return 0
