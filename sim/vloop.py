"""An asyncio event loop on a virtual clock: time jumps to the next timer when nothing is ready.

`loop.time()` starts at 0.0 and moves only when every ready callback has run and the loop would
otherwise block: it then jumps straight to the earliest scheduled timer. So `asyncio.sleep`,
`asyncio.wait_for` / `asyncio.timeout` deadlines and `loop.call_at` all run in virtual seconds, and
any number of concurrent tasks (peers, clients' route sessions) interleave exactly as they would in
real time, however long the simulated span and however little wall time it costs. Ties at one
instant run in the order they were scheduled (asyncio's own rule), so a run is deterministic.

Why not `looptime` (PyPI): it wraps a real selector, polls real I/O with `select(0)` on every
iteration and spins 42 no-op iterations before every time jump (so that tests written against real
time settle); a simulation that makes millions of jumps and does no I/O wants neither.

This module does not: do I/O (a loop with nothing ready and no timer raises instead of blocking:
that is a deadlock in virtual time), run callbacks from other threads, or support subprocesses,
sockets or executors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeDeadlock(RuntimeError):
    """Nothing is ready and no timer is scheduled: the awaited result can never come."""


class _TimeJump:
    """Stands in for the loop's selector: 'waiting' for `timeout` seconds advances the clock."""

    def __init__(self, loop: "VirtualTimeLoop"):
        self._loop = loop

    def select(self, timeout: float | None) -> list:
        if timeout is None:
            raise VirtualTimeDeadlock("nothing is ready and no timer is scheduled in virtual time")
        if timeout > 0:
            self._loop.now_s += timeout
        return []

    def close(self) -> None:
        pass


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """An event loop whose `time()` is virtual seconds (see the module docstring).

    Attributes:
        now_s: virtual time, seconds since the loop was made.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now_s = 0.0
        self._selector = _TimeJump(self)

    def time(self) -> float:
        """Virtual seconds since the loop was made."""
        return self.now_s

    def _process_events(self, event_list: list) -> None:
        pass  # no I/O ever becomes ready

    def _write_to_self(self) -> None:
        pass  # one thread: nothing to wake


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a fresh `VirtualTimeLoop`; tasks still pending are cancelled.

    Raises:
        VirtualTimeDeadlock: `main` waits for something nothing will ever do.
    """
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
