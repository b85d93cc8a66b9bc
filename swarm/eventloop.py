"""The asyncio event loop of a peer process and of the client's loop thread: uvloop's in peers and
asyncio's own in clients by default; `SWARM_EVENT_LOOP=uvloop` or `=asyncio` sets both (uvloop is a
dependency of this package and of hivemind).

uvloop (libuv) hands a process a socket's bytes with less work per wake-up: a loopback round trip
of two processes costs ~0.08 ms with uvloop vs ~0.21 ms with asyncio's selector loop on this
project's machine kind, ~0.36 vs ~0.48 ms when both wake from idle (scripts/bench_event_loop.py),
and 0.03-0.13 ms less overhead per hop on 3 loopback peers, 0.04-0.16 ms more with the client on
it too (scripts/bench_hops.py --loops; docs/benchmarks.md, "Event loop"). Peers run it by default:
each is a process of its own, whose loop is the only one in it. Clients keep asyncio's: a full
test run with uvloop in the client's loop thread (a second loop in a process that runs others)
ended in a segmentation fault of the test process during a test's teardown, and the cause was not
found.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from swarm.errors import SwarmError

T = TypeVar("T")

EVENT_LOOP_ENV = "SWARM_EVENT_LOOP"
"""Environment variable: "uvloop" or "asyncio" for every loop of the process; unset or empty: the
role's default (`DEFAULT_LOOPS`)."""

DEFAULT_LOOPS = {"peer": "uvloop", "client": "asyncio"}
"""The loop of each role when `EVENT_LOOP_ENV` is unset (see the module docstring)."""


def loop_kind(role: str = "client") -> str:
    """"uvloop" or "asyncio": the loop `new_event_loop(role)` makes in this environment. `role`:
    "peer" (a `swarm serve` process) or "client" (the client's loop thread). A peer's default falls
    back to asyncio where uvloop is not installed (it does not support every platform).

    Raises:
        SwarmError: SWARM_EVENT_LOOP names another loop, or uvloop is asked for but not installed.
    """
    asked = os.environ.get(EVENT_LOOP_ENV, "")
    want = asked or DEFAULT_LOOPS[role]
    if want not in ("uvloop", "asyncio"):
        raise SwarmError(f"{EVENT_LOOP_ENV} must be 'uvloop' or 'asyncio', got {want!r}")
    if want == "uvloop":
        try:
            import uvloop  # noqa: F401 - only whether it is installed
        except ImportError:
            if not asked:
                return "asyncio"
            raise SwarmError(f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed") from None
    return want


def new_event_loop(role: str = "client") -> asyncio.AbstractEventLoop:
    """A new event loop of `loop_kind(role)`."""
    if loop_kind(role) == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T], role: str = "client") -> T:
    """`asyncio.run(main)` on a loop of `loop_kind(role)`."""
    with asyncio.Runner(loop_factory=lambda: new_event_loop(role)) as runner:
        return runner.run(main)
