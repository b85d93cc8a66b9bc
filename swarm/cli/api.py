"""`swarm api`: an OpenAI-compatible HTTP API and health page for a model on the swarm (`swarm.api`)."""

from __future__ import annotations

from swarm.errors import SwarmError
from swarm.models import DEFAULT_MODEL


def register(sub) -> None:
    """Add `api` to the `swarm` subparsers `sub`."""
    ap = sub.add_parser("api", help="OpenAI-compatible HTTP API and health page for a model on the swarm")
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"NAME, PATH or MODEL_ID ({DEFAULT_MODEL})")
    ap.add_argument("--local", action="store_true", help="run the whole model in this process")
    ap.add_argument("--initial-peers", nargs="*", default=[], metavar="MADDR", help="peers to join through")
    ap.add_argument("--host", default="127.0.0.1", help="HTTP listen address, an IP literal")
    ap.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000; 0: any free port)")
    ap.add_argument("--threads", type=int, default=None, help="prompt threads (--local; each generated token runs on 1)")
    ap.add_argument("--draft", default="lookup", metavar="DRAFT",
                    help="guesses of requests with \"speculate\": lookup (prompt lookup, the default), mtp "
                         "(the model's multi-token-prediction head, on the last peer), self "
                         "(the model requantized to Q3_K_M, run here), self:TYPE, or a draft .gguf path")
    ap.add_argument("--status-period", type=float, default=2.0, help="seconds between health-page reads")
    ap.set_defaults(func=_api)


def _api(args) -> None:
    from swarm.api.server import ApiConfig, run_api

    if not args.local and not args.initial_peers:
        raise SwarmError("pass --initial-peers MADDR to serve the swarm's model, or --local")
    run_api(
        ApiConfig(
            model=args.model,
            local=args.local,
            initial_peers=tuple(args.initial_peers),
            host=args.host,
            port=args.port,
            n_threads=args.threads,
            draft=args.draft,
            status_period_s=args.status_period,
        )
    )
