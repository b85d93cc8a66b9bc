"""sim/vloop.py and sim/records.py: virtual time, and records that appear, vanish and expire in it."""

import asyncio

import pytest

from sim import vloop
from sim.records import EXPIRY_PERIODS, RecordBoard
from swarm.route.plan import PeerSpan
from tests.helpers.factories import peer_span


def test_concurrent_tasks_interleave_in_virtual_time():
    async def main():
        loop = asyncio.get_running_loop()
        seen = []

        async def sleeper(d: float, tag: str):
            await asyncio.sleep(d)
            seen.append((tag, loop.time()))

        async def waiter():
            try:
                await asyncio.wait_for(asyncio.sleep(100.0), 2.5)
            except asyncio.TimeoutError:
                seen.append(("timed out", loop.time()))

        loop.call_at(1.5, lambda: seen.append(("call_at", loop.time())))
        await asyncio.gather(sleeper(2.0, "b"), waiter(), sleeper(1.0, "a"), sleeper(3600.0, "hour"))
        return seen

    assert vloop.run(main()) == [
        ("a", 1.0),
        ("call_at", 1.5),
        ("b", 2.0),
        ("timed out", 2.5),
        ("hour", 3600.0),
    ]


def test_waiting_for_what_never_comes_is_a_deadlock_not_a_hang():
    async def main():
        await asyncio.get_running_loop().create_future()

    with pytest.raises(vloop.VirtualTimeDeadlock):
        vloop.run(main())


def _span(peer_id: str, start: int = 0, end: int = 4) -> PeerSpan:
    return peer_span(peer_id, start, end)


def test_records_appear_after_the_delay_vanish_on_withdraw_and_linger_after_a_crash():
    period, delay = 30.0, 2.0

    async def main():
        loop = asyncio.get_running_loop()
        board = RecordBoard(loop, delay, period)
        board.publish(_span("a"))
        board.publish(_span("b"))
        board.publish(_span("c"))
        seen = {"before": sorted(board.records)}
        await asyncio.sleep(delay)
        seen["landed"] = sorted(board.records)
        board.withdraw("a")  # graceful: gone at once
        board.publish(_span("b", 4, 8))
        board.withdraw("b")  # a store in flight when withdrawn never lands
        board.abandon("c")  # crashed at t = 2 s, last published at t = 0
        await asyncio.sleep(delay)
        seen["after_withdraw"] = sorted(board.records)
        await asyncio.sleep(EXPIRY_PERIODS * period - 2 * delay - 0.001)
        seen["just_before_expiry"] = sorted(board.records)
        await asyncio.sleep(0.002)
        seen["expired"] = sorted(board.records)
        return seen

    assert vloop.run(main()) == {
        "before": [],
        "landed": ["a", "b", "c"],
        "after_withdraw": ["c"],
        "just_before_expiry": ["c"],
        "expired": [],
    }
