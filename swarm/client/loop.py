"""The client's asyncio loop in a background thread, for synchronous callers.

The DHT node and every stream of a client live on one asyncio loop (one loop per process); the
public engine methods are synchronous, as the generation loop expects, and wait on it with `run`.

This module does not: know about the DHT, peers or frames.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from swarm import eventloop
from swarm.errors import SwarmError

_STOP_WAIT_S = 10.0  # for the loop's tasks to end after cancellation, then for its thread to end


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` executes a coroutine there and waits."""

    def __init__(self):
        self.loop = eventloop.new_event_loop("client")
        self._thread = threading.Thread(target=self.loop.run_forever, name="swarm-client-loop", daemon=True)
        self._thread.start()

    def run(self, coro, timeout_s: float | None = None):
        """Run `coro` on the loop thread and return its result (or raise its exception).

        If the wait ends early (timeout, Ctrl-C in the caller), the coroutine is cancelled.
        Raises:
            SwarmError: the coroutine did not finish within timeout_s.
        """
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise SwarmError(f"no answer from the swarm within {timeout_s:.0f} s") from None
        except BaseException:
            fut.cancel()
            raise

    def submit(self, coro) -> None:
        """Start `coro` on the loop without waiting (for cleanup called from the loop thread itself)."""
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    @property
    def on_loop_thread(self) -> bool:
        """True when called from the loop's own thread (where `run` would deadlock)."""
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        """Cancel the loop's remaining tasks, stop it, join the thread and close the loop (idempotent).

        Closed here because a loop left open is finalized at interpreter exit, possibly after its
        self-pipe socket: its `__del__` then prints a traceback on a clean exit. Must not be called
        from the loop thread.
        """
        if self.loop.is_closed():
            return
        try:
            self.run(self._cancel_tasks(), timeout_s=_STOP_WAIT_S)
        except SwarmError:
            pass  # a task that ignores cancellation: stop the loop under it anyway
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=_STOP_WAIT_S)
        if not self._thread.is_alive():
            self.loop.close()

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_WAIT_S / 2)
        await self.loop.shutdown_asyncgens()
