"""The swarm backend of `Client`: a route of peers and one sticky stream per hop for a session.

For each generation the engine reads the model's announcements from the DHT, measures RTTs,
asks the pure planner (`swarm.route.plan`) for the cheapest chain of spans, opens one stream per
hop and keeps it for the whole session. The client embeds tokens itself; a prefill chunk or a
decode step then goes hop by hop through the client (only `[n, hidden]` hidden states cross the
network), and the last hop answers with a sampled token. Each hop's inputs are kept, so a hop can
be replaced mid-generation by replaying them on a new peer.

The DHT node and the streams live on one asyncio loop in a background thread; the public engine
methods are synchronous, as the generation loop expects.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from swarm.artifacts.distribute import acquire, client_ranges
from swarm.artifacts.session import ArtifactSession, SessionConfig
from swarm.client.generate import StepResult
from swarm.client.telemetry import GenerationTelemetry, HopTelemetry
from swarm.client.tokenizer import Tokenizer
from swarm.dht.node import SwarmDHT
from swarm.dht.records import Announcement
from swarm.errors import Busy, NoRoute, ProtocolError, SwarmError
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.limits import MAX_CONTEXT_TOKENS
from swarm.manifest import Manifest, build_manifest
from swarm.models import cache_dir, is_model_id, resolve_model
from swarm.p2p import PeerUnreachable, StreamSession
from swarm.peer.handler import SPAN_PROTOCOL
from swarm.route.plan import RoutePlan, plan_route
from swarm.route.snapshot import peer_spans
from swarm.sampling import SamplingParams
from swarm.wire import (
    Close,
    Error,
    ErrorCode,
    Forward,
    Hidden,
    Open,
    OpenOk,
    Token,
    decode_frame,
    encode_frame,
)

STEP_TIMEOUT_S = 120.0
"""A hop that answers no frame within this time is treated as dead."""
OPEN_ATTEMPTS = 4
"""Routes tried before giving up when peers refuse a session (BUSY, gone)."""


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` executes a coroutine there and waits."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="swarm-client-loop", daemon=True)
        self._thread.start()

    def run(self, coro, timeout_s: float | None = None):
        """Run `coro` on the loop thread and return its result (or raise its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        """Stop the loop and join the thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


@dataclass
class _Hop:
    peer_id: str
    start: int
    end: int
    stream: StreamSession
    telemetry: HopTelemetry
    inputs: list[tuple[int, np.ndarray]] = field(default_factory=list)
    """(pos0, hidden) of every Forward sent: replayed on a replacement peer after a failure."""


class SwarmConnection:
    """A client's DHT node (client mode, throwaway identity) on its own loop thread.

    Args:
        initial_peers: multiaddrs to join through (at least one).
    Raises:
        SwarmError: no initial peers, or the DHT node could not start.
    """

    def __init__(self, initial_peers: list[str]):
        if not initial_peers:
            raise SwarmError(
                "no initial peers: pass --initial-peers MADDR (printed by `swarm dht` or "
                "`swarm serve --new-swarm`)"
            )
        self._tmp = tempfile.TemporaryDirectory(prefix="swarm-client-")
        self.loop = LoopThread()
        try:
            self.dht: SwarmDHT = self.loop.run(
                SwarmDHT.start(initial_peers, client_mode=True, data_dir=self._tmp.name), timeout_s=60
            )
        except BaseException:
            self.loop.stop()
            self._tmp.cleanup()
            raise

    def announcements(self, model_id: str) -> list[Announcement]:
        """Live announcements for the model, as the DHT has them now."""
        return self.loop.run(self.dht.get_announcements(model_id), timeout_s=30)

    def close(self) -> None:
        """Leave the DHT and stop the loop thread (idempotent)."""
        if self._tmp is None:
            return
        try:
            self.loop.run(self.dht.shutdown(), timeout_s=30)
        finally:
            self.loop.stop()
            self._tmp.cleanup()
            self._tmp = None


class RemoteEngine:
    """`swarm.client.generate.Engine` over a route of peers.

    Args:
        conn: the client's swarm connection.
        manifest: the model's manifest (model_id, layer count, context length).
        embedder: token ids → `[n, hidden]` float32, exact.
        prefill_chunk_tokens: prompt tokens per Forward frame.
    """

    def __init__(
        self,
        conn: SwarmConnection,
        manifest: Manifest,
        embedder: TokenEmbedder,
        prefill_chunk_tokens: int = 256,
    ):
        if prefill_chunk_tokens < 1:
            raise SwarmError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        self._conn = conn
        self._manifest = manifest
        self._embedder = embedder
        self._chunk = prefill_chunk_tokens
        ctx = int(manifest.hparams.get(f"{manifest.arch}.context_length", MAX_CONTEXT_TOKENS))
        self.context_limit = min(ctx, MAX_CONTEXT_TOKENS)
        self._rtt_ms: dict[str, float] = {}
        self._hops: list[_Hop] = []
        self._pos = 0
        self._step = 0
        self._telemetry: GenerationTelemetry | None = None
        self.last_plan: RoutePlan | None = None

    # -- Engine protocol -------------------------------------------------------------------------

    def begin(self, n_tokens: int, sampling: SamplingParams, telemetry: GenerationTelemetry) -> None:
        """Plan a route and open one session per hop, reserving `n_tokens` of KV cache on each.

        Raises:
            NoRoute: no chain of live peers with room for the session.
        """
        self._telemetry = telemetry
        self._pos = 0
        self._step = 0
        self._hops = self._conn.loop.run(self._open_route(n_tokens, sampling), timeout_s=STEP_TIMEOUT_S)
        telemetry.route = [h.telemetry for h in self._hops]

    def prefill(self, tokens) -> StepResult:
        """Send the prompt in chunks through every hop; return the token sampled after it."""
        x = self._embedder.embed(list(tokens))
        result = None
        for i in range(0, len(tokens), self._chunk):
            result = self._step_all(x[i : i + self._chunk])
        assert result is not None
        return result

    def decode(self, token: int) -> StepResult:
        """Send one token's hidden state through every hop; return the next sampled token."""
        return self._step_all(self._embedder.embed([token]))

    def end(self) -> None:
        """Close every hop's session (best effort: a dead peer frees its cache by itself)."""
        hops, self._hops = self._hops, []
        if hops:
            self._conn.loop.run(_close_all(hops), timeout_s=30)

    def close(self) -> None:
        """End any session and leave the swarm."""
        self.end()
        self._conn.close()

    # -- internals ---------------------------------------------------------------------------------

    def _step_all(self, x: np.ndarray) -> StepResult:
        pos0 = self._pos
        token = self._conn.loop.run(self._forward_route(pos0, x), timeout_s=STEP_TIMEOUT_S * len(self._hops))
        self._pos += x.shape[0]
        return StepResult(token=token.token, logprob=token.logprob, top=token.top)

    async def _forward_route(self, pos0: int, x: np.ndarray) -> Token:
        for i, hop in enumerate(self._hops):
            last = i == len(self._hops) - 1
            hop.inputs.append((pos0, x))
            reply = await self._exchange(hop, Forward(step=self._step, pos0=pos0, hidden=x, sample=last))
            self._step += 1
            if last:
                if not isinstance(reply, Token):
                    raise ProtocolError(f"last hop {hop.peer_id} answered {type(reply).__name__}, not token")
                return reply
            if not isinstance(reply, Hidden) or reply.hidden.shape != x.shape:
                raise ProtocolError(f"hop {hop.peer_id} answered {type(reply).__name__} of the wrong shape")
            x = np.asarray(reply.hidden, dtype=np.float32)
        raise NoRoute("empty route")

    async def _exchange(self, hop: _Hop, frame) -> object:
        data = encode_frame(frame)
        t0 = time.perf_counter()
        try:
            await hop.stream.send(data)
        except PeerUnreachable:
            said = await hop.stream.last_words()
            if said is not None and isinstance(reply := decode_frame(said), Error):
                raise _error_of(hop.peer_id, reply) from None
            raise
        reply_bytes = await hop.stream.recv(STEP_TIMEOUT_S)
        rtt_ms = (time.perf_counter() - t0) * 1000.0
        reply = decode_frame(reply_bytes)
        t = hop.telemetry
        t.steps += 1
        t.bytes_sent += len(data) + 4
        t.bytes_received += len(reply_bytes) + 4
        if isinstance(reply, Error):
            raise _error_of(hop.peer_id, reply)
        compute_ms = getattr(reply, "compute_ms", 0.0)
        t.compute_ms += compute_ms
        t.network_ms += max(0.0, rtt_ms - compute_ms)
        return reply

    async def _open_route(self, n_tokens: int, sampling: SamplingParams) -> list[_Hop]:
        exclude: set[str] = set()
        last_error: SwarmError | None = None
        for _ in range(OPEN_ATTEMPTS):
            announced = await self._conn.dht.get_announcements(self._manifest.model_id)
            if not announced:
                raise NoRoute(
                    f"no peer announces model {self._manifest.model_id[:16]}…",
                    missing=tuple(range(self._manifest.n_layers)),
                )
            await self._measure_rtts(announced)
            plan = plan_route(
                peer_spans(announced, self._rtt_ms),
                self._manifest.n_layers,
                n_tokens,
                exclude=frozenset(exclude | self._unreachable(announced)),
            )
            self.last_plan = plan
            addrs = {a.peer_id: a.addrs for a in announced}
            hops: list[_Hop] = []
            try:
                for h in plan.hops:
                    hops.append(
                        await self._open_hop(h.peer_id, addrs[h.peer_id], h.start, h.end, n_tokens, sampling)
                    )
                return hops
            except (Busy, PeerUnreachable, ProtocolError) as e:
                last_error = e
                exclude.add(getattr(e, "peer_id", None) or (plan.hops[len(hops)].peer_id))
                await _close_all(hops)
        raise NoRoute(f"could not open a route after {OPEN_ATTEMPTS} attempts: {last_error}")

    async def _open_hop(
        self, peer_id: str, addrs, start: int, end: int, n_tokens: int, sampling: SamplingParams
    ) -> _Hop:
        stream = await self._conn.dht.transport.open_stream(peer_id, addrs, SPAN_PROTOCOL)
        hop = _Hop(peer_id, start, end, stream, HopTelemetry(peer_id=peer_id, start=start, end=end))
        try:
            reply = await self._exchange(
                hop,
                Open(
                    session_id=os.urandom(16),
                    client_id=self._conn.dht.peer_id,
                    model_id=self._manifest.model_id,
                    start=start,
                    end=end,
                    max_tokens=n_tokens,
                    sampling=sampling,
                ),
            )
            if not isinstance(reply, OpenOk):
                raise ProtocolError(f"{peer_id} answered open with {type(reply).__name__}")
        except BaseException:
            await stream.close()
            raise
        return hop

    async def _measure_rtts(self, announced: list[Announcement]) -> None:
        async def probe(a: Announcement) -> None:
            try:
                self._rtt_ms[a.peer_id] = await self._conn.dht.transport.ping(
                    a.peer_id, a.addrs, timeout_s=5.0
                )
            except SwarmError:
                self._rtt_ms[a.peer_id] = float("inf")

        await asyncio.gather(*(probe(a) for a in announced if a.peer_id not in self._rtt_ms))

    def _unreachable(self, announced: list[Announcement]) -> set[str]:
        return {a.peer_id for a in announced if self._rtt_ms.get(a.peer_id) == float("inf")}


def _error_of(peer_id: str, err: Error) -> SwarmError:
    message = f"peer {peer_id[:12]}…: {err.message}"
    if err.code in (ErrorCode.BUSY, ErrorCode.SHUTTING_DOWN):
        e: SwarmError = Busy(message)
    elif err.code == ErrorCode.NOT_FOUND:
        e = PeerUnreachable(message)
    elif err.code == ErrorCode.PROTOCOL:
        e = ProtocolError(message)
    else:
        e = SwarmError(message)
    e.peer_id = peer_id  # type: ignore[attr-defined]
    return e


async def _close_all(hops: list[_Hop]) -> None:
    async def close(h: _Hop) -> None:
        try:
            await h.stream.send(encode_frame(Close()))
        except SwarmError:
            pass
        await h.stream.close()

    await asyncio.gather(*(close(h) for h in hops), return_exceptions=True)


def connect_swarm(
    model: str, initial_peers: list[str], prefill_chunk_tokens: int = 256
) -> tuple[Tokenizer, RemoteEngine]:
    """Join the swarm for `model`: tokenizer and engine.

    Args:
        model: a known name or local `.gguf` path, or a model_id: then the manifest comes from the
            DHT and only the header (tokenizer) and `token_embd` are fetched from seeders, verified.
    Raises:
        ModelError: the model file cannot be found or read.
        ArtifactError: (model_id) unknown model, no seeders, or bad bytes.
        SwarmError: the DHT could not be joined.
    """
    conn = SwarmConnection(initial_peers)
    try:
        if is_model_id(model):
            path, manifest = conn.loop.run(_fetch_client_artifacts(conn.dht, model))
        else:
            path = resolve_model(model, progress=True)
            manifest = build_manifest(path)
        tokenizer = Tokenizer.from_gguf(path)
        embedder = TokenEmbedder(path)
    except BaseException:
        conn.close()
        raise
    return tokenizer, RemoteEngine(conn, manifest, embedder, prefill_chunk_tokens)


async def _fetch_client_artifacts(dht: SwarmDHT, model_id: str) -> tuple[Path, Manifest]:
    artifacts = ArtifactSession(SessionConfig())
    try:
        dest = cache_dir().parent / "artifacts" / f"{model_id}.client.gguf"
        path, manifest, _ = await acquire(dht, artifacts, model_id, dest, client_ranges)
    finally:
        await asyncio.to_thread(artifacts.close)
    return path, manifest
