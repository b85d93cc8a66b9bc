"""swarm.eventloop: which loop a process runs, chosen by SWARM_EVENT_LOOP."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from swarm import eventloop
from swarm.errors import SwarmError


@pytest.mark.parametrize("role, value, kind", [("client", None, "asyncio"), ("client", "", "asyncio"),
                                               ("client", "uvloop", "uvloop"), ("peer", None, "uvloop"),
                                               ("peer", "", "uvloop"), ("peer", "asyncio", "asyncio")])
def test_the_loop_follows_the_role_and_the_environment(monkeypatch, role, value, kind):
    if value is None:
        monkeypatch.delenv(eventloop.EVENT_LOOP_ENV, raising=False)
    else:
        monkeypatch.setenv(eventloop.EVENT_LOOP_ENV, value)
    assert eventloop.loop_kind(role) == kind
    loop = eventloop.new_event_loop(role)
    try:
        assert (kind == "uvloop") == isinstance(loop, uvloop.Loop)
    finally:
        loop.close()

    async def running():
        return type(asyncio.get_running_loop())

    assert (kind == "uvloop") == issubclass(eventloop.run(running(), role), uvloop.Loop)


def test_an_unknown_loop_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(eventloop.EVENT_LOOP_ENV, "Asyncio")
    with pytest.raises(SwarmError, match="must be 'uvloop' or 'asyncio', got 'Asyncio'"):
        eventloop.new_event_loop()


def test_a_stopped_client_loop_thread_is_closed_with_its_tasks_cancelled():
    # A loop left open is finalized at interpreter exit, possibly after its self-pipe socket, and
    # its __del__ then printed a traceback under a clean CLI error (seen in CI).
    from swarm.client.loop import LoopThread

    thread = LoopThread()
    forever = asyncio.run_coroutine_threadsafe(asyncio.sleep(3600), thread.loop)
    thread.stop()
    assert thread.loop.is_closed()
    assert forever.cancelled()
    thread.stop()  # idempotent
