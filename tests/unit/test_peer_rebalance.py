"""swarm.peer.rebalance: a serving peer moves only after draining, and only while the move still pays.

The DHT read and the move are plain functions here (the real ones are wired in swarm.peer.server
and exercised by tests/integration/test_placement.py).
"""

import asyncio

from swarm.kv.budget import SpanBudget
from swarm.peer.rebalance import Drain, Rebalancer
from tests.helpers.factories import peer_span

RATE = 120.0


def span(pid, start, end):
    return peer_span(pid, start, end, decode=RATE / (end - start))


class World:
    """The announcements a peer reads, its open sessions, and the moves it made."""

    def __init__(self, others, me):
        self.others, self.me = list(others), me
        self.sessions = 0
        self.moved: list[tuple[int, int]] = []
        self.reads = 0
        self.read_hook = None

    async def announcements(self):
        self.reads += 1
        if self.read_hook is not None:
            await self.read_hook(self.reads)
        return [*self.others, self.me]

    async def move(self, start, end):
        self.moved.append((start, end))
        self.me = span(self.me.peer_id, start, end)

    def rebalancer(self, period_s=60.0):
        return Rebalancer(
            peer_id="me",
            budget=SpanBudget(15_000_000, (1_000_000,) * 30, 0, 0, 0),
            period_s=period_s,
            announcements=self.announcements,
            me=lambda: self.me,
            sessions=lambda: self.sessions,
            move=self.move,
            drain=Drain(),
        )


THREE_ON_15_30 = [span("a", 0, 15), span("b", 15, 30), span("b2", 15, 30)]


def run(coro):
    return asyncio.run(coro)


def test_a_peer_on_the_bottleneck_stays():
    w = World([span("a", 0, 15), span("b", 15, 30)], span("me", 0, 15))
    assert run(w.rebalancer().evaluate_once()) is None
    assert w.moved == []


def test_an_idle_peer_moves_to_the_bottleneck():
    # 15:30 is served three times, 0:15 once: the flow doubles if "me" moves from 15:30 to 0:15
    w = World(THREE_ON_15_30, span("me", 15, 30))
    r = w.rebalancer()
    decision = run(r.evaluate_once())
    assert (decision.start, decision.end) == (0, 15) and w.moved == [(0, 15)] and r.moves == [(0, 15)]
    assert decision.routable_after == 2 * decision.routable_before
    assert not r.drain.active


def test_a_busy_peer_drains_before_moving_and_refuses_new_sessions_meanwhile():
    w = World(THREE_ON_15_30, span("me", 15, 30))
    w.sessions = 2
    r = w.rebalancer()

    async def scenario():
        task = asyncio.create_task(r.evaluate_once())
        while not r.drain.active:  # the first read decided to move: draining starts
            await asyncio.sleep(0)
        assert "moving to layers 0:15" in r.drain.active
        assert w.moved == []
        w.sessions = 1
        r.drain.session_ended(1)
        await asyncio.sleep(0)
        assert w.moved == [] and r.drain.active  # one session still runs
        w.sessions = 0
        r.drain.session_ended(0)
        return await task

    decision = run(scenario())
    assert (decision.start, decision.end) == (0, 15) and w.moved == [(0, 15)]
    assert not r.drain.active


def test_a_drain_that_does_not_finish_within_a_period_is_abandoned():
    w = World(THREE_ON_15_30, span("me", 15, 30))
    w.sessions = 1
    r = w.rebalancer(period_s=0.05)
    assert run(r.evaluate_once()) is None
    assert w.moved == [] and not r.drain.active


def test_the_swarm_changing_during_the_drain_cancels_the_move():
    w = World(THREE_ON_15_30, span("me", 15, 30))
    r = w.rebalancer()

    async def another_peer_took_the_bottleneck(reads):
        if reads == 2:
            w.others.append(span("c", 0, 15))

    w.read_hook = another_peer_took_the_bottleneck
    assert run(r.evaluate_once()) is None
    assert w.moved == [] and w.reads == 2
