"""Simulated serving peers and the client's links to them, in virtual time.

A `SimPeer` is one volunteer: a memory budget, a layer rate (decode steps/s × layers, its measured
speed), a point on the globe, and, while it serves, a span [start, end) with a real
`swarm.kv.sessions.SessionTable` (admission by slots and KV tokens) and a real
`swarm.peer.rebalance.Drain` (refuses new sessions with BUSY while it drains to move). It answers
the frames of `swarm.wire` as `swarm.peer.handler` does, by the same rules (`swarm.peer.rules`: the
order of Open refusals, rewinds, which pushed step runs, the announced record), computing the
stand-in of `sim.compute`.

Time: a frame reaches the peer half a round trip after it is sent; its compute (rows / prefill
tokens/s for a prefill chunk, 1 / decode steps/s for one token) starts when the peer has finished
the work queued before it (one executor: `busy_until_s`), and the reply arrives half a round trip
after the compute ends. Opens, closes and probes cost round trips only.

Server push (`Load.push`): a client's `Chain` names each hop's next peer and session; a Forward with
`push` is answered with a copy (`Hidden.pushed`) and its output delivered to the next peer half a
peer-to-peer round trip after the compute ends (`sim.geo` between the two peers), which runs it
as the real handler does (a push at a passed position is dropped unless it says `rewind`, which
rolls the session's layer states back by replaying its recorded rows), answers its own client's
link, and pushes on. A push to a peer that has gone is lost: the client times out or is refused.

Ways to go (`depart`): "leave" (graceful: every in-flight frame is answered SHUTTING_DOWN, later
frames on open links get the same last words, new dials are refused), "reset" (a crash whose
kernel resets the connections: in-flight frames and dials fail at once) and "freeze" (a crash that
answers nothing: in-flight frames, dials and probes wait for the caller's timeout).

This module does not: choose spans, publish records or decide when peers come and go
(`sim.world` does), and it models no network below the round trip.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass

import numpy as np

from sim.compute import run_layers, token_of
from sim.geo import rtt_ms
from swarm.errors import Busy, PeerTimeout, PeerUnreachable, RequestError
from swarm.kv.budget import SpanBudget
from swarm.kv.sessions import SessionTable
from swarm.peer import rules
from swarm.peer.rebalance import Drain
from swarm.route.plan import PeerSpan
from swarm.wire import Chain, Error, ErrorCode, Forward, Frame, Hidden, Open, OpenOk, Token, receipt

IDLE_TIMEOUT_S = 600.0
"""A session unused this long is evicted (as `swarm.peer.handler.PeerStreams.idle_timeout_s`)."""
ALIVE = ("loading", "serving", "moving")
"""States of a peer that answers: loading its first span, serving one, or moving to another."""


@dataclass(frozen=True)
class Profile:
    """What a volunteer brings.

    Attributes:
        budget: what fits its memory (`budget.n_layers` is the model's depth).
        layer_steps_per_s: its speed, decode steps/s × layers (a span of L layers runs at this / L).
        prefill_factor: prefill tokens/s per decode step/s.
        max_sessions: session slots.
        location: unit vector (x, y, z) of its place on the globe.
        access_ms: its last-mile share of every round trip, ms.
    """

    budget: SpanBudget
    layer_steps_per_s: float
    prefill_factor: float
    max_sessions: int
    location: tuple[float, float, float]
    access_ms: float


class SimPeer:
    """One simulated peer (see the module docstring).

    Attributes:
        peer_id, profile: identity and means.
        incarnation: virtual time it joined (announced as `started_at`).
        state: "loading", "serving", "moving" (draining and loading a new span), "left", "reset"
            or "frozen".
        start, end: its span (meaningful while serving).
        table: its session table while serving, else None.
        drain: shared with its rebalancer.
        busy_until_s: when its executor finishes the work queued so far.
        rng: its own random source (load times, rebalancing delays).
        network: every peer by id (where its pushes go); set by the world.
    """

    def __init__(self, peer_id: str, profile: Profile, now_s: float, rng: random.Random):
        self.peer_id, self.profile, self.incarnation, self.rng = peer_id, profile, now_s, rng
        self.state = "loading"
        self.start = self.end = 0
        self.table: SessionTable | None = None
        self.drain = Drain()
        self.busy_until_s = 0.0
        self._cache: dict[bytes, tuple[str, list[int]]] = {}  # session id → (owner, layer states)
        self._inflight: dict[asyncio.Future, None] = {}
        self.network: dict[str, SimPeer] = {}
        self._links: dict[bytes, PeerLink] = {}  # session id → its client's link
        self._chains: dict[bytes, Chain] = {}
        self._rows: dict[bytes, list] = {}  # session id → every row run, in order (for rewind)

    @property
    def alive(self) -> bool:
        """It answers frames, dials and probes."""
        return self.state in ALIVE

    def record(self) -> PeerSpan:
        """Its announcement now (`swarm.peer.rules.span_record`): span, measured speed, free room
        (none while draining)."""
        steps = self.profile.layer_steps_per_s / (self.end - self.start)
        speed = rules.Throughput(steps, steps * self.profile.prefill_factor)
        return rules.span_record(self.peer_id, self.start, self.end, speed, self.table,
                                 draining=bool(self.drain.active), started_at=self.incarnation)

    def load(self, start: int, end: int) -> None:
        """Start serving [start, end) with an empty session table."""
        self.state, self.start, self.end = "serving", start, end
        self.table = SessionTable(self.profile.max_sessions, self.profile.budget.kv_tokens, IDLE_TIMEOUT_S)
        self._cache, self._chains, self._rows = {}, {}, {}

    def unload(self) -> None:
        """Stop serving to load another span (the rebalancer drained it first)."""
        self.state, self.table, self._cache, self._chains, self._rows = "moving", None, {}, {}, {}

    def depart(self, how: str) -> None:
        """Go: "leave", "reset" or "freeze" (see the module docstring)."""
        self.state = {"leave": "left", "reset": "reset", "freeze": "frozen"}[how]
        self.table, self._cache, self._links, self._chains, self._rows = None, {}, {}, {}, {}
        for fut in list(self._inflight):
            if fut.done():
                continue
            if how == "leave":
                fut.set_result(Error(ErrorCode.SHUTTING_DOWN, rules.SHUTTING_DOWN_MESSAGE))
            elif how == "reset":
                fut.set_exception(PeerUnreachable(f"stream to {self.peer_id} was reset"))
        self._inflight.clear()

    def sessions(self) -> int:
        """Sessions open now (0 when not serving)."""
        return len(self.table) if self.table is not None else 0

    # -- frames ------------------------------------------------------------------------------------

    def handle(self, sid: bytes, owner: str, frame: Frame, arrive_s: float) -> tuple[Frame, float]:
        """Answer one frame arriving at `arrive_s`; returns the reply and when its compute ends."""
        if self.state != "serving" or self.table is None:
            return Error(ErrorCode.NOT_FOUND, f"{self.peer_id} serves no span now"), arrive_s
        if isinstance(frame, Open):
            return self._open(sid, owner, frame, arrive_s), arrive_s
        if not isinstance(frame, (Forward, Chain)):
            return Error(ErrorCode.BAD_REQUEST, f"unexpected {type(frame).__name__}"), arrive_s
        table = self.table
        try:
            slot = table.get(sid, owner)
            if isinstance(frame, Chain):
                why = rules.chain_refusal(frame.next_peer, self.end == self.profile.budget.n_layers)
                if why is not None:
                    raise RequestError(why)
                self._chains[sid] = frame
                return OpenOk(slot.reserved_tokens), arrive_s
            why = rules.forward_size_refusal(frame.n_tokens)
            if why is not None:
                raise RequestError(why)
            if rules.rewinds(frame.pos0, frame.rewind, slot.pos):
                self._rewind(sid, slot, frame.pos0)
            table.check_forward(slot, frame.pos0, frame.n_tokens)
        except RequestError as e:
            return Error(ErrorCode.BAD_REQUEST, str(e)), arrive_s
        n, rate = frame.n_tokens, self.profile.layer_steps_per_s / (self.end - self.start)
        # a frame of recorded steps (Forward.steps) costs what each step costs alone
        compute_s = sum(1.0 / rate if k == 1 else k / (rate * self.profile.prefill_factor)
                        for k in frame.steps or (n,))
        done_s = max(arrive_s, self.busy_until_s) + compute_s
        self.busy_until_s = done_s
        out = run_layers(self._cache[sid][1], self.start, frame.hidden)
        self._rows.setdefault(sid, []).append(frame.hidden)
        table.advance(slot, n, done_s)
        got = receipt(frame.hidden, frame.token_ids)
        if self.end < self.profile.budget.n_layers:
            return Hidden(frame.step, out, compute_s * 1000.0, receipt=got), done_s
        token = Token(frame.step, token_of(out), 0.0, (), compute_s * 1000.0, receipt=got)
        return token, done_s

    def _open(self, sid: bytes, owner: str, frame: Open, now_s: float) -> Frame:
        # the real peer's refusals, in its order; a simulated peer leaving answers before (`handle`)
        refusal = rules.open_refusal(frame, owner, shutting_down=False, draining=self.drain.active,
                                     model_id=None, start=self.start, end=self.end)
        if refusal is not None:
            return Error(*refusal)
        try:
            admission = self.table.admit(sid, owner, frame.max_tokens, now_s)
        except Busy as e:
            return Error(ErrorCode.BUSY, str(e))
        if admission.evicted_seq_ids:  # idle sessions the table dropped: drop their caches too
            self._cache = {k: v for k, v in self._cache.items() if self._holds(k, owner_of=v[0])}
        self._cache[sid] = (owner, [0] * (self.end - self.start))
        return OpenOk(frame.max_tokens)

    def _rewind(self, sid: bytes, slot, pos: int) -> None:
        """Roll the session back to `pos`: its layer states from its recorded rows before `pos`."""
        rows = np.concatenate(self._rows.get(sid, [])) if self._rows.get(sid) else np.zeros((0, 2))
        states = [0] * (self.end - self.start)
        if pos:
            run_layers(states, self.start, rows[:pos])
        self._cache[sid] = (self._cache[sid][0], states)
        self._rows[sid] = [rows[:pos]] if pos else []
        self.table.truncate(slot, pos)

    def next_hop(self, sid: bytes) -> tuple[PeerLink, float] | None:
        """Where the session's pushes go: the next peer's client link and the one-way trip, s."""
        chain = self._chains.get(sid)
        nxt = self.network.get(chain.next_peer) if chain is not None and chain.next_peer else None
        link = nxt._links.get(chain.next_session) if nxt is not None else None
        if link is None:
            return None
        p, q = self.profile, nxt.profile
        return link, rtt_ms(p.location, q.location, p.access_ms, q.access_ms) / 2000.0

    def accepts_push(self, sid: bytes, owner: str, frame: Forward, from_peer: str) -> bool:
        """Whether a pushed frame from `from_peer` runs here (see the module docstring)."""
        chain = self._chains.get(sid)
        if self.state != "serving" or self.table is None or chain is None or chain.prev_peer != from_peer:
            return False
        try:
            pos = self.table.get(sid, owner).pos
        except RequestError:
            return False
        return rules.accepts_pushed(frame.pos0, frame.rewind, pos)

    def _holds(self, sid: bytes, owner_of: str) -> bool:
        try:
            self.table.get(sid, owner_of)
        except RequestError:
            return False
        return True

    def close_session(self, sid: bytes) -> None:
        """The client closed the session: free it (and wake a drain waiting for the last one)."""
        self._links.pop(sid, None)
        self._chains.pop(sid, None)
        self._rows.pop(sid, None)
        if self.table is not None and self._cache.pop(sid, None) is not None:
            self.table.release(sid)
            self.drain.session_ended(len(self.table))

    def track(self, fut: asyncio.Future) -> None:
        """Remember an in-flight reply, so that departing settles it."""
        self._inflight[fut] = None
        fut.add_done_callback(lambda f: self._inflight.pop(f, None))


class PeerLink:
    """`swarm.client.link.HopLink` from one client to one `SimPeer`, with their round trip.

    Args:
        peer: the peer.
        owner: the client's id (owner of the session).
        rtt_s: round trip between them, seconds.
        key: a number unique among the client's links, its hash: the route session keeps its links
            in a set, and closing them in an order that depends on memory addresses would make
            runs differ.
    """

    transport = "sim"
    direct_error = ""

    def __init__(self, peer: SimPeer, owner: str, rtt_s: float, key: int):
        self.peer_id, self._peer, self._owner, self._rtt_s = peer.peer_id, peer, owner, rtt_s
        self._key = key
        self._sid = b""
        self.closed = False
        self._inbox: deque[Frame] = deque()  # answers that reached the client, not read yet
        self._waiter: asyncio.Future | None = None

    def __hash__(self) -> int:
        return self._key

    async def send(self, frame: Frame, timeout_s: float) -> int:
        """Send one frame (see `swarm.client.link.HopLink.send`): the peer runs it
        half a round trip from now, and its answer (and its pushes) are scheduled."""
        peer = self._peer
        if self.closed or peer.state == "reset":
            raise PeerUnreachable(f"stream to {self.peer_id} was reset")
        if peer.state in ("left", "frozen"):
            return 100  # `recv` reports it
        if isinstance(frame, Open):
            self._sid = frame.session_id
            peer._links[self._sid] = self
        self._run(frame, asyncio.get_running_loop().time() + self._rtt_s / 2)
        return 100

    async def recv(self, timeout_s: float) -> tuple[Frame, int]:
        """The next answer that reached the client (see `swarm.client.link.HopLink.recv`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._inbox:
            peer = self._peer
            if self.closed or peer.state == "reset":
                raise PeerUnreachable(f"stream to {self.peer_id} was reset")
            if peer.state == "left":
                return Error(ErrorCode.SHUTTING_DOWN, rules.SHUTTING_DOWN_MESSAGE), 100
            fut = self._waiter = loop.create_future()
            peer.track(fut)  # a departure settles it: SHUTTING_DOWN, or reset
            try:
                said = await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise PeerTimeout(f"no frame from {self.peer_id} within {timeout_s:.1f} s") from None
            finally:
                self._waiter = None
            if isinstance(said, Error):
                return said, 100
        return self._inbox.popleft(), 100

    def pushed(self, frame: Forward, arrive_s: float, from_peer: str) -> None:
        """A frame the previous hop's peer pushed into this link's session, arriving at `arrive_s`;
        lost when the peer has gone or does not take it."""
        if not self.closed and self._peer.accepts_push(self._sid, self._owner, frame, from_peer):
            self._run(frame, arrive_s)

    def _run(self, frame: Frame, arrive_s: float) -> None:
        peer = self._peer
        reply, done_s = peer.handle(self._sid, self._owner, frame, arrive_s)
        if isinstance(frame, Forward) and frame.push and isinstance(reply, Hidden):
            nxt = peer.next_hop(self._sid)
            if nxt is not None:
                link, one_way_s = nxt
                link.pushed(Forward(step=frame.step, pos0=frame.pos0, hidden=reply.hidden, push=True,
                                    rewind=frame.rewind, steps=frame.steps), done_s + one_way_s, peer.peer_id)
                reply = Hidden(reply.step, reply.hidden, reply.compute_ms, pushed=True, receipt=reply.receipt)
        asyncio.get_running_loop().call_at(done_s + self._rtt_s / 2, self._arrive, reply)

    def _arrive(self, reply: Frame) -> None:
        """An answer reaches the client, unless the peer went meanwhile: frozen, it never comes;
        reset or left, `recv` reports that instead (as in-flight frames on a real stream)."""
        if self.closed or not self._peer.alive:
            return
        self._inbox.append(reply)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def close(self) -> None:
        """Close the session on the peer (at once: the Close is not waited for); never raises."""
        if not self.closed and self._sid and self._peer.alive:
            self._peer.close_session(self._sid)
        self.closed = True
