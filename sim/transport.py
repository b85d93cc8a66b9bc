"""Simulated span peers behind the route session's injected transport, on a virtual clock.

A `SpanPeer` computes the stand-in span of `sim.compute`, whose every output depends on every earlier
row of the session, in order, as attention does: a replay that skipped, repeated or reordered a row
would change every later output and the last span's sampled token with it, so a failover is correct
only if the tokens equal a fault-free run. Like llama.cpp's CPU kernels, which round a step of many
rows differently from steps of few, a `SpanPeer` also folds each step's row count into its layer
states: a replay that regrouped recorded steps (`Forward.steps`) gives other tokens as well. A verify pass
(`Forward.verify`) is answered with the token after every row, and `Forward.rewind` rolls a session
back to the state it had at that position. Global layers [0, `id_layers`) also read each row's token
id (`Forward.token_ids`), as deepseek4's hash-routed layers do: a peer holding one refuses a Forward
without them (`swarm.peer.rules.token_ids_refusal`) and folds each id into those layers' states.

Faults are scripted per peer: after a given number of Forward frames the peer dies (links reset,
dials refused), freezes (nothing answers; the caller's timeout passes on the virtual clock), starts
leaving (SHUTTING_DOWN), answers malformed frames, or lies (wrong hidden states, for spot checks).
`VirtualClock.sleep` advances time without waiting, so failover backoff costs nothing to simulate.
One client at a time: for many concurrent clients, run on `sim.vloop` instead (as `sim.run` does).

This module does not: use sockets, threads, hivemind or llama.cpp. The route session it serves is
the client's own (swarm/client/session.py), over the client's link protocol (swarm/client/link.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from sim.compute import embed, run_layers, token_of
from swarm.route.replay import split_steps
from swarm.errors import PeerTimeout, PeerUnreachable
from swarm.peer import rules
from swarm.route.plan import PeerSpan
from swarm.wire import Close, Error, ErrorCode, Forward, Frame, Hidden, Open, OpenOk, Token

__all__ = ["SimLink", "SimSwarm", "SpanPeer", "VirtualClock", "embed"]


class VirtualClock:
    """Time that passes only when told: `now()` in seconds, `sleep(s)` advances it at once."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def now(self) -> float:
        """Seconds since the simulation began."""
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        """Advance the clock by `seconds` without waiting."""
        self.now_s += max(0.0, seconds)


@dataclass
class SpanPeer:
    """A simulated peer serving global layers [start, end) of an `n_layers`-layer model.

    Attributes:
        fault: what happens after `fault_after` Forward frames: "die", "freeze", "leave",
            "malformed", "hung" (blocks until the caller cancels), "lie" (hidden states answered
            with their low half shifted: a peer computing wrong), or "" (never).
        state: "up", "dead", "frozen", "leaving", "malformed", "hung" or "lie" now.
        sessions: session id -> [next position, per-layer state of `sim.compute.run_layers`, that
            state after each position so far (a `Forward.rewind` goes back to it)].
        forwards: Forward frames handled so far.
        incarnation: the `started_at` it announces; `restart` changes it.
        announced_sessions_free: a stale figure to announce instead of the true one (None: true).
        id_layers: global layers [0, id_layers) read token ids (module docstring); 0: none do.
    """

    peer_id: str
    start: int
    end: int
    n_layers: int
    decode_steps_per_s: float = 200.0
    prefill_tokens_per_s: float = 2000.0
    rtt_ms: float = 1.0
    max_sessions: int = 8
    free_cache_tokens: int = 1 << 20
    announced_sessions_free: int | None = None
    fault: str = ""
    fault_after: int = 0
    state: str = "up"
    incarnation: float = 1.0
    sessions: dict[bytes, list] = field(default_factory=dict)
    forwards: int = 0
    closed_while_frozen: set[bytes] = field(default_factory=set)
    id_layers: int = 0

    def span(self) -> PeerSpan:
        """The announcement a client sees (a dead peer's record lingers until it expires)."""
        return PeerSpan(
            self.peer_id,
            self.start,
            self.end,
            self.decode_steps_per_s,
            self.prefill_tokens_per_s,
            free_cache_tokens=self.free_cache_tokens,
            sessions_free=(
                max(0, self.max_sessions - len(self.sessions))
                if self.announced_sessions_free is None
                else self.announced_sessions_free
            ),
            incarnation=self.incarnation,
        )

    def thaw(self) -> None:
        """A frozen peer runs again with no fault pending; it reads the Close (or the reset) of
        every stream its clients gave up on meanwhile and frees those sessions."""
        self.state, self.fault = "up", ""
        for sid in self.closed_while_frozen:
            self.sessions.pop(sid, None)
        self.closed_while_frozen.clear()

    def restart(self) -> None:
        """Come back up with an empty cache, as a new incarnation."""
        self.state, self.sessions, self.fault = "up", {}, ""
        self.closed_while_frozen.clear()
        self.incarnation += 1.0

    def handle(self, session_id: bytes, frame: Frame) -> Frame:
        """Answer one frame of one session (the peer is up or leaving)."""
        if self.state == "leaving":
            return Error(ErrorCode.SHUTTING_DOWN, rules.SHUTTING_DOWN_MESSAGE)
        if isinstance(frame, Open):
            # the real peer's refusals, in its order: no drain here, leaving is answered above, and
            # a simulated link carries no peer id to check the client id against
            refusal = rules.open_refusal(frame, frame.client_id, shutting_down=False, draining=None,
                                         model_id=None, start=self.start, end=self.end)
            if refusal is not None:
                return Error(*refusal)
            if len(self.sessions) >= self.max_sessions:
                return Error(ErrorCode.BUSY, f"all {self.max_sessions} session slots are in use")
            n = self.end - self.start
            self.sessions[session_id] = [0, [0] * n, {0: [0] * n}]
            return OpenOk(frame.max_tokens)
        if isinstance(frame, Close):
            self.sessions.pop(session_id, None)
            return OpenOk(1)
        assert isinstance(frame, Forward)
        session = self.sessions[session_id]
        pos, state, history = session
        if rules.rewinds(frame.pos0, frame.rewind, pos):
            session[0] = pos = frame.pos0
            state[:] = history[pos]
        if frame.pos0 != pos:
            return Error(ErrorCode.BAD_REQUEST, f"step starts at position {frame.pos0}, session is at {pos}")
        n_ids, reads = frame.token_ids.shape[0], self.start < self.id_layers
        why = rules.token_ids_refusal(n_ids, reads, self.start, self.end)
        if why is not None:
            return Error(ErrorCode.BAD_REQUEST, why)
        self.forwards += 1
        outs, at = [], pos
        for rows in split_steps(frame.hidden, frame.steps):
            ids = frame.token_ids[at - pos : at - pos + rows.shape[0]]
            outs.append(self._step(state, rows, history, at, ids))
            at += rows.shape[0]
        out = np.concatenate(outs)
        session[0] = pos + frame.n_tokens
        if self.state == "malformed":
            return Hidden(frame.step, np.zeros((1, 1), np.float32), 0.1)
        if self.state == "lie":
            out = out.copy()
            out[:, 1] = (out[:, 1] + 2**23) % 2**24
        if self.end < self.n_layers:
            return Hidden(frame.step, out, 1.0)
        tokens = tuple(token_of(out[i : i + 1]) for i in range(frame.n_tokens)) if frame.verify else ()
        return Token(frame.step, token_of(out), 0.0, (), 1.0, tokens=tokens)

    def _step(self, state: list[int], rows: np.ndarray, history: dict, pos0: int,
              ids: np.ndarray) -> np.ndarray:
        """Run one step's rows, keeping the state after each row (`history[position after it]`),
        where a rewind finds it: a rewind into a step keeps that step's rows as computed in it."""
        out = []
        reading = range(min(len(state), max(0, self.id_layers - self.start)))
        for j in range(rows.shape[0]):
            for i in reading:  # the row's token id enters the layers that read it
                state[i] ^= (int(ids[j]) + 1) << 20
            out.append(run_layers(state, self.start, rows[j : j + 1]))
            history[pos0 + j + 1] = list(state)
        for i in range(len(state)):  # the step's row count shapes what comes after (module docstring)
            state[i] ^= rows.shape[0] << 1
        history[pos0 + rows.shape[0]] = list(state)
        return np.concatenate(out)

    def after_forward(self) -> None:
        """Apply the scripted fault once `fault_after` Forward frames were handled."""
        if self.fault and self.state == "up" and self.forwards >= self.fault_after:
            self.state = {"die": "dead", "freeze": "frozen", "leave": "leaving"}.get(self.fault, self.fault)
            if self.state == "dead":
                self.sessions.clear()


class SimLink:
    """`HopLink` to a `SpanPeer`: frames are handed over as objects; faults surface as errors.

    `send` delivers the frame after the peer's round trip and keeps the answer for `recv`; a frozen
    peer takes the frame and never answers (`recv` waits out its timeout on the virtual clock).
    """

    transport = "sim"
    direct_error = ""

    def __init__(self, peer: SpanPeer, clock: VirtualClock, session_id: bytes):
        self.peer_id, self._peer, self._clock, self._sid = peer.peer_id, peer, clock, session_id
        self.closed = False
        self._answers: list[Frame] = []  # answers not read yet, oldest first

    async def send(self, frame: Frame, timeout_s: float) -> int:
        """Deliver one frame; see `swarm.client.link.HopLink.send`."""
        peer = self._peer
        if self.closed or peer.state == "dead":
            raise PeerUnreachable(f"stream to {peer.peer_id} was reset")
        if peer.state == "frozen":
            return 100  # `recv` times out
        if peer.state == "hung":  # for callers that cancel a step themselves (Ctrl-C)
            await asyncio.Event().wait()
        await self._clock.sleep(peer.rtt_ms / 1000.0)
        if isinstance(frame, Open):
            self._sid = frame.session_id
        self._answers.append(peer.handle(self._sid, frame))
        if isinstance(frame, Forward):
            peer.after_forward()
        return 100

    async def recv(self, timeout_s: float) -> tuple[Frame, int]:
        """The peer's next answer; see `swarm.client.link.HopLink.recv`."""
        if self._answers:
            return self._answers.pop(0), 100
        if self.closed or self._peer.state == "dead":
            raise PeerUnreachable(f"stream to {self.peer_id} was reset")
        await self._clock.sleep(timeout_s)
        raise PeerTimeout(f"no frame from {self.peer_id} within {timeout_s:.1f} s")

    async def close(self) -> None:
        """Close the session on the peer; a frozen one reads the Close when it thaws."""
        if not self.closed and self._peer.state in ("up", "malformed", "leaving"):
            self._peer.sessions.pop(self._sid, None)
        elif not self.closed and self._peer.state in ("frozen", "hung"):
            self._peer.closed_while_frozen.add(self._sid)
        self.closed = True


class SimSwarm:
    """`HopTransport` and `PeerDirectory` over a set of `SpanPeer`s on one virtual clock."""

    def __init__(self, peers: list[SpanPeer], clock: VirtualClock, probe_timeout_s: float = 2.0):
        self.by_id = {p.peer_id: p for p in peers}
        self.clock = clock
        self._probe_timeout_s = probe_timeout_s
        self.withdrawn: set[str] = set()
        self.measured: set[str] = set()

    async def connect(self, peer_id: str, timeout_s: float) -> SimLink:
        """Dial a peer: refused when dead, timed out when frozen."""
        peer = self.by_id[peer_id]
        if peer.state == "dead":
            raise PeerUnreachable(f"cannot dial {peer_id}: connection refused")
        if peer.state == "frozen":
            await self.clock.sleep(timeout_s)
            raise PeerTimeout(f"{peer_id} did not accept a stream within {timeout_s:.1f} s")
        return SimLink(peer, self.clock, b"")

    async def peers(self, skip_probe: frozenset[str], fresh: bool) -> list[PeerSpan]:
        """Every record not withdrawn (always current: `fresh` changes nothing); unmeasured peers
        are probed (a dead or frozen one: inf)."""
        out = []
        for p in self.by_id.values():
            if p.peer_id in self.withdrawn:
                continue
            span = p.span()
            if p.peer_id not in self.measured and p.peer_id not in skip_probe:
                answered = await self.probe([p.peer_id])
                rtt = p.rtt_ms if answered else float("inf")
                span = PeerSpan(**{**span.__dict__, "rtt_ms": rtt})
            elif p.peer_id in self.measured:
                span = PeerSpan(**{**span.__dict__, "rtt_ms": p.rtt_ms})
            out.append(span)
        return out

    async def probe(self, peer_ids: Collection[str]) -> set[str]:
        """Ping: peers that are up or leaving answer; a frozen one costs the probe timeout."""
        answered = set()
        for peer_id in peer_ids:
            peer = self.by_id[peer_id]
            if peer.state in ("dead", "frozen"):
                self.measured.discard(peer_id)
                if peer.state == "frozen":
                    await self.clock.sleep(self._probe_timeout_s)
            else:
                answered.add(peer_id)
                self.measured.add(peer_id)
        return answered

    def open_sessions(self) -> int:
        """Sessions held by peers that can hear a Close: a leak if non-zero after every generation.

        A frozen peer keeps its sessions until its own idle timeout frees them, as a real one does.
        """
        return sum(len(p.sessions) for p in self.by_id.values() if p.state not in ("dead", "frozen", "hung"))
