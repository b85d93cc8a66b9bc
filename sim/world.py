"""Membership of one simulated swarm: volunteers join through placement, serve, rebalance, and go.

A joining peer draws its means (memory, speed, place on the globe), reads the announcements
(`dht_read_s` of virtual time), picks its span with the real `swarm.route.placement.choose_span`
over that read (or, to compare, a naive rule), loads it (`load_s`), then serves: it publishes its
record every announce period and runs the real `swarm.peer.rebalance.Rebalancer`, whose every
decision is the real `rebalance` (random delay, at most once per period, drain before moving).
A move withdraws the record, loads the new span and announces it.

Churn: during `churn(...)` peers leave at `churn_per_min` × n_peers per minute (a Poisson
process, victims drawn uniformly among the living, whatever they are doing), each gracefully,
by a resetting crash or by a freezing crash, and as many new peers join, so the swarm keeps about
n_peers. A graceful leaver withdraws its record at once; a crashed peer's record lingers until it
expires (`sim.records`).

The layout (spans served now) is reported to `sim.metrics.Metrics` at every change.

This module does not: route or generate (`sim.clients`), or decide what a frame costs (`sim.peers`).
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from dataclasses import dataclass

from sim.geo import random_point
from sim.metrics import Layout, Metrics
from sim.peers import Profile, SimPeer
from sim.records import RecordBoard
from swarm.errors import RequestError
from swarm.kv.budget import SpanBudget
from swarm.peer.rebalance import Rebalancer
from swarm.route.placement import MIN_GAIN, choose_span
from swarm.route.plan import PeerSpan

PLACEMENTS = ("placement", "least_covered", "random")
"""Span rules: the real `choose_span`; the old least-covered window (starts only at reachable
boundaries, takes as many layers as fit); a random start with as many layers as fit."""


@dataclass(frozen=True)
class ModelShape:
    """The served model's sizes (illustrative: only their ratios to peers' memory matter).

    Attributes:
        name: label.
        n_layers: depth.
        layer_bytes: weight bytes per block.
        head_bytes: output norm + head, on the last span.
        kv_bytes_per_layer_token: KV cache per layer per token.
    """

    name: str
    n_layers: int
    layer_bytes: int
    head_bytes: int
    kv_bytes_per_layer_token: int


@dataclass(frozen=True)
class PeerMix:
    """How volunteers differ; ranges are (low, high), drawn log-uniformly unless noted.

    Attributes:
        memory_layers: memory, in layers' worth (each with its KV cache); 2 to 1.1 × depth holds
            from a couple of layers to the whole model.
        layer_steps_per_s: speed, decode steps/s × layers.
        prefill_factor: prefill tokens/s per decode step/s.
        kv_tokens: KV-cache tokens each peer reserves for its sessions.
        max_sessions: session slots per peer.
        load_s: seconds to fetch and load a span (uniform).
        access_ms: last-mile share of a round trip (uniform).
    """

    memory_layers: tuple[float, float]
    layer_steps_per_s: tuple[float, float] = (300.0, 3000.0)
    prefill_factor: float = 8.0
    kv_tokens: int = 16_384
    max_sessions: int = 16
    load_s: tuple[float, float] = (10.0, 60.0)
    access_ms: tuple[float, float] = (1.0, 5.0)


@dataclass(frozen=True)
class Membership:
    """How peers come, go, announce and rebalance.

    Attributes:
        n_peers: the swarm's size (joins while growing; kept about constant under churn).
        churn_per_min: fraction of n_peers leaving (and joining) per virtual minute.
        graceful: fraction of leavers that leave gracefully; the rest crash.
        freeze: fraction of crashes that freeze (the rest reset their connections).
        placement: one of PLACEMENTS.
        rebalance_period_s: a serving peer re-evaluates its span every this many seconds (plus a
            random delay up to half of it); None: never.
        min_gain: relative gain in routable throughput a move needs.
        announce_period_s, announce_delay_s: record refresh period; publish → visible delay.
        dht_read_s: one read of the announcements.
    """

    n_peers: int
    churn_per_min: float = 0.10
    graceful: float = 0.5
    freeze: float = 0.5
    placement: str = "placement"
    rebalance_period_s: float | None = 600.0
    min_gain: float = MIN_GAIN
    announce_period_s: float = 30.0
    announce_delay_s: float = 2.0
    dht_read_s: float = 0.3


class World:
    """The peers of one swarm (see the module docstring).

    Args:
        model, mix, members: the scenario.
        rng: the run's one random source.
        metrics: where the layout, joins, departures and moves are recorded.
    Attributes:
        board: the announcement records.
        peers: every peer that ever joined, by id (clients may still hold records of gone ones).
        layout: spans served now.
    """

    def __init__(
        self, model: ModelShape, mix: PeerMix, members: Membership, rng: random.Random, metrics: Metrics
    ):
        if members.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {members.placement!r}")
        self.model, self.mix, self.members, self.rng, self.metrics = model, mix, members, rng, metrics
        self._loop = asyncio.get_running_loop()
        self.board = RecordBoard(self._loop, members.announce_delay_s, members.announce_period_s)
        self.peers: dict[str, SimPeer] = {}
        self.layout: Layout = {}
        self._layer_bytes = (model.layer_bytes,) * model.n_layers
        self._alive: list[str] = []
        self._alive_at: dict[str, int] = {}
        self._lives: dict[str, asyncio.Task] = {}
        self._refresh: dict[str, asyncio.TimerHandle] = {}
        self._published: dict[str, PeerSpan] = {}

    # -- coming and going --------------------------------------------------------------------------

    def join(self) -> SimPeer:
        """A new volunteer starts now: read, place, load, serve, rebalance (as a task)."""
        # each peer draws from its own random source: events of different peers at one virtual
        # instant may run in either order, and must not take each other's draws
        rng = random.Random(self.rng.getrandbits(64))
        peer = SimPeer(f"p{len(self.peers):06d}", self._profile(), self._loop.time(), rng)
        peer.network = self.peers
        self.peers[peer.peer_id] = peer
        self._alive_at[peer.peer_id] = len(self._alive)
        self._alive.append(peer.peer_id)
        self._lives[peer.peer_id] = self._loop.create_task(self._life(peer))
        self.metrics.count("joins")
        return peer

    def depart(self, peer: SimPeer, how: str) -> None:
        """`peer` goes now: "leave" (graceful), "reset" or "freeze" (crashes)."""
        if not peer.alive:
            return
        self._lives.pop(peer.peer_id).cancel()
        if peer.state == "serving":
            self._unserve(peer)
        peer.depart(how)
        if how == "leave":
            self.board.withdraw(peer.peer_id)
        else:
            self.board.abandon(peer.peer_id)
        handle = self._refresh.pop(peer.peer_id, None)
        if handle is not None:
            handle.cancel()
        self._forget(peer)
        self.metrics.count(f"departures_{how}")

    def _forget(self, peer: SimPeer) -> None:
        """Drop `peer` from the living (O(1): the last one takes its place)."""
        i, last = self._alive_at.pop(peer.peer_id), self._alive.pop()
        if last != peer.peer_id:
            self._alive[i], self._alive_at[last] = last, i

    async def grow(self, n: int, over_s: float) -> None:
        """`n` joins at Poisson times spread over about `over_s` seconds."""
        for _ in range(n):
            await asyncio.sleep(self.rng.expovariate(n / over_s))
            self.join()

    async def churn(self, until_s: float) -> None:
        """Leaves and joins, each at churn_per_min × n_peers per minute, until virtual `until_s`."""
        rate = self.members.churn_per_min * self.members.n_peers / 60.0
        if rate > 0:
            await asyncio.gather(self._leaves(rate, until_s), self._joins(rate, until_s))

    async def _leaves(self, rate: float, until_s: float) -> None:
        while True:
            await asyncio.sleep(self.rng.expovariate(rate))
            if self._loop.time() >= until_s:
                return
            if self._alive:
                victim = self.peers[self.rng.choice(self._alive)]
                if self.rng.random() < self.members.graceful:
                    self.depart(victim, "leave")
                else:
                    self.depart(victim, "freeze" if self.rng.random() < self.members.freeze else "reset")

    async def _joins(self, rate: float, until_s: float) -> None:
        while True:
            await asyncio.sleep(self.rng.expovariate(rate))
            if self._loop.time() >= until_s:
                return
            self.join()

    def stop(self) -> None:
        """Cancel every peer's task and refresh (end of the run)."""
        for task in self._lives.values():
            task.cancel()
        for handle in self._refresh.values():
            handle.cancel()

    # -- one peer's life ---------------------------------------------------------------------------

    async def _life(self, peer: SimPeer) -> None:
        view = await self.read()
        try:
            start, end = self._place(view, peer)
        except RequestError:  # not even one layer fits where a chain reaches: the volunteer gives up
            self.metrics.count("joins_refused")
            peer.depart("leave")
            self._lives.pop(peer.peer_id)
            self._forget(peer)
            return
        await asyncio.sleep(peer.rng.uniform(*self.mix.load_s))
        self._serve(peer, start, end)
        period = self.members.rebalance_period_s
        if period is None:
            return
        await Rebalancer(
            peer_id=peer.peer_id,
            budget=peer.profile.budget,
            period_s=period,
            announcements=self.read,
            me=peer.record,
            sessions=peer.sessions,
            move=functools.partial(self._move, peer),
            drain=peer.drain,
            min_gain=self.members.min_gain,
            rng=peer.rng,
        ).run()

    async def read(self) -> list[PeerSpan]:
        """A fresh read of the announcements (costs dht_read_s)."""
        await asyncio.sleep(self.members.dht_read_s)
        return self.board.snapshot()

    async def _move(self, peer: SimPeer, start: int, end: int) -> None:
        """The rebalancer's move: withdraw, load the new span, serve and announce it."""
        self.metrics.moved(
            self._loop.time(), peer.peer_id, (peer.start, peer.end), (start, end), peer.sessions()
        )
        self._unserve(peer)
        self.board.withdraw(peer.peer_id)
        self._refresh.pop(peer.peer_id).cancel()
        peer.unload()
        await asyncio.sleep(peer.rng.uniform(*self.mix.load_s))
        self._serve(peer, start, end)

    def _serve(self, peer: SimPeer, start: int, end: int) -> None:
        peer.load(start, end)
        entry = self.layout.setdefault((start, end), [0, 0.0])
        entry[0] += 1
        entry[1] += peer.record().decode_steps_per_s
        self.metrics.layout_changed(self._loop.time(), self.layout)
        self._announce(peer)

    def _unserve(self, peer: SimPeer) -> None:
        key = (peer.start, peer.end)
        entry = self.layout[key]
        entry[0] -= 1
        entry[1] -= peer.record().decode_steps_per_s
        if entry[0] == 0:
            del self.layout[key]
        self.metrics.layout_changed(self._loop.time(), self.layout)

    def _announce(self, peer: SimPeer) -> None:
        """Publish the peer's record now and every announce period (an unchanged record is
        republished as the same object, so readers' caches stay valid)."""
        record, last = peer.record(), self._published.get(peer.peer_id)
        if record == last:
            record = last
        self._published[peer.peer_id] = record
        self.board.publish(record)
        self._refresh[peer.peer_id] = self._loop.call_later(
            self.members.announce_period_s, self._announce, peer
        )

    # -- means and placement -----------------------------------------------------------------------

    def _profile(self) -> Profile:
        rng, mix, model = self.rng, self.mix, self.model
        per_layer = model.layer_bytes + mix.kv_tokens * model.kv_bytes_per_layer_token
        memory = int(_log_uniform(rng, mix.memory_layers) * per_layer) + model.head_bytes
        budget = SpanBudget(
            memory, self._layer_bytes, model.head_bytes, model.kv_bytes_per_layer_token, mix.kv_tokens
        )
        return Profile(
            budget=budget,
            layer_steps_per_s=_log_uniform(rng, mix.layer_steps_per_s),
            prefill_factor=mix.prefill_factor,
            max_sessions=mix.max_sessions,
            location=random_point(rng),
            access_ms=rng.uniform(*mix.access_ms),
        )

    def _place(self, view: list[PeerSpan], peer: SimPeer) -> tuple[int, int]:
        """The span a joining peer serves, by the scenario's rule. Raises RequestError: nothing fits."""
        budget, rule = peer.profile.budget, self.members.placement
        if rule == "placement":
            choose = self.metrics.stopwatch.timed("choose_span", choose_span)
            p = choose(view, budget, peer.profile.layer_steps_per_s)
            return p.start, p.end
        n = budget.n_layers
        if rule == "random":
            starts = [peer.rng.randrange(n)]
        else:
            starts = sorted({0} | {p.end for p in view if 0 < p.end < n})
        cover = [0.0] * n
        for p in view:
            for layer in range(p.start, p.end):
                cover[layer] += p.decode_steps_per_s
        fits = [(sorted(cover[s : budget.longest_end(s)]), s) for s in starts if budget.longest_end(s) > s]
        if not fits:
            raise RequestError("not one layer fits")
        start = min(fits)[1]
        return start, budget.longest_end(start)


def _log_uniform(rng: random.Random, bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))
