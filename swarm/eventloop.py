"""The asyncio event loop of a peer process and of the client's loop thread: asyncio's own, or
uvloop's with `SWARM_EVENT_LOOP=uvloop` (uvloop is installed as a hivemind dependency).

uvloop (libuv) hands a process a socket's bytes with less work per wake-up: a loopback round trip
of two processes costs ~0.08 ms with uvloop vs ~0.21 ms with asyncio's selector loop on this
project's machine kind, ~0.36 vs ~0.48 ms when both wake from idle (scripts/bench_event_loop.py),
and 0.10-0.25 ms less overhead per hop on 3 loopback peers (scripts/bench_hops.py --loops;
docs/benchmarks.md, "Event loop"). It is not the default: a full test run with uvloop in the
client's loop thread ended in a segmentation fault of the test process (that thread's loop, during
a test's teardown), and the cause was not found.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from swarm.errors import SwarmError

T = TypeVar("T")

EVENT_LOOP_ENV = "SWARM_EVENT_LOOP"
"""Environment variable: "uvloop" for uvloop's loop; unset or "asyncio" for asyncio's."""


def loop_kind() -> str:
    """"uvloop" or "asyncio": the loop `new_event_loop` makes in this environment.

    Raises:
        SwarmError: SWARM_EVENT_LOOP names another loop, or uvloop is asked for but not installed.
    """
    want = os.environ.get(EVENT_LOOP_ENV, "asyncio") or "asyncio"
    if want not in ("uvloop", "asyncio"):
        raise SwarmError(f"{EVENT_LOOP_ENV} must be 'uvloop' or 'asyncio', got {want!r}")
    if want == "uvloop":
        try:
            import uvloop  # noqa: F401 - only whether it is installed
        except ImportError:
            raise SwarmError(f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed") from None
    return want


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of `loop_kind()`."""
    if loop_kind() == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a loop of `loop_kind()`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
