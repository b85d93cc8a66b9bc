"""`swarm status`: the peers serving a model, whether their spans chain into a route, dead ends."""

from __future__ import annotations

import json

from swarm.models import DEFAULT_MODEL

NO_ROUTE_EXIT = 3
"""`swarm status` exit status when no chain of spans joins the first layer to the last."""


def register(sub) -> None:
    """Add `status` to the `swarm` subparsers `sub`."""
    st = sub.add_parser(
        "status",
        help="peers serving a model, whether their spans chain into a route, dead ends; "
        "exit status 3 when no complete route exists",
    )
    st.add_argument("--model", default=DEFAULT_MODEL, help="NAME, PATH or MODEL_ID of the model")
    st.add_argument("--initial-peers", nargs="*", default=[], metavar="MADDR")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_status)


def _status(args) -> int:
    from swarm.client.status import swarm_status

    report = swarm_status(args.model, args.initial_peers)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        report.print_table()
    return 0 if report.chains.complete else NO_ROUTE_EXIT
