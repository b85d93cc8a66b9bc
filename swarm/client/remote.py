"""The swarm backend of `Client`: route sessions over libp2p streams, found through the DHT.

Each generation gets its own `RouteSession` (swarm/client/session.py), which plans a route, keeps
one sticky stream per hop, and fails over by replay; this module gives it its real parts: the
`DHTDirectory` (announcements from the DHT, RTTs measured by ping), the `P2PTransport` (framed
libp2p streams, frames encoded with swarm.wire), the monotonic clock and asyncio's sleep. The
client embeds tokens itself, so only `[n, hidden]` hidden states cross the network.

The DHT node and every stream live on one asyncio loop in a background thread; the public engine
methods are synchronous, as the generation loop expects, and several sessions of one engine may run
at once (threads or interleaved iterators): each has its own hops; the peers' RTTs and the failed
peers to avoid are shared.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import random
import tempfile
import threading
import time
from collections.abc import Collection
from pathlib import Path

from swarm import eventloop
from swarm.artifacts.distribute import acquire, client_ranges
from swarm.artifacts.session import ArtifactSession, SessionConfig
from swarm.client.generate import StepResult
from swarm.client.session import RouteSession, SessionSpec
from swarm.client.telemetry import GenerationTelemetry
from swarm.client.tokenizer import Tokenizer
from swarm.dht.node import SwarmDHT, get_dht_time
from swarm.dht.records import Announcement
from swarm.direct import open_stream
from swarm.errors import PeerTimeout, PeerUnreachable, SwarmError
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.kv.prefix import PREFIX_BLOCK_TOKENS, prefix_offers
from swarm.limits import MAX_CONTEXT_TOKENS
from swarm.manifest import Manifest, build_manifest
from swarm.models import cache_dir, is_model_id, resolve_model
from swarm.p2p import StreamSession
from swarm.limits import SPAN_PROTOCOL
from swarm.route.failover import Exclusions, FailoverPolicy
from swarm.route.plan import PeerSpan
from swarm.route.snapshot import peer_spans
from swarm.sampling import SamplingParams
from swarm.wire import Close, Error, Frame, decode_frame, encode_frame

DHT_READ_TIMEOUT_S = 30.0
"""Reading the model's announcements from the DHT gives up after this long."""
CLOSE_TIMEOUT_S = 2.0
"""Saying Close to a peer gives up after this long (a frozen peer frees its cache by itself)."""
SNAPSHOT_MAX_AGE_S = 60.0
"""A failover may re-plan from a DHT read up to this old before reading anew."""
DIRECT_RETRY_S = 60.0
"""After a peer's direct endpoints failed, its streams go through libp2p this long before direct is
tried again (sooner when it announces other endpoints)."""
CALL_TIMEOUT_S = 900.0
"""Outer bound on one synchronous call into the loop; every await inside has its own, shorter one."""


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` executes a coroutine there and waits."""

    def __init__(self):
        self.loop = eventloop.new_event_loop()
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
        """Stop the loop and join the thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


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


class DHTDirectory:
    """`PeerDirectory` over the DHT: the model's announcements, with RTTs measured by ping.

    Successful RTTs are kept for the engine's life (a peer's RTT changes little); a failed probe is
    not kept, so the session excludes the peer for a while and it is probed again afterwards.

    Attributes:
        rtt_ms: peer id -> measured round trip, ms.
    """

    def __init__(self, dht: SwarmDHT, model_id: str, probe_timeout_s: float):
        self._dht, self._model_id, self._probe_timeout_s = dht, model_id, probe_timeout_s
        self.rtt_ms: dict[str, float] = {}
        self._addrs: dict[str, tuple[str, ...]] = {}
        self._direct: dict[str, tuple[str, ...]] = {}
        self._announced: list[Announcement] = []
        self._read_at = -math.inf

    def addrs(self, peer_id: str) -> tuple[str, ...]:
        """The multiaddrs `peer_id` announced last (empty if never seen)."""
        return self._addrs.get(peer_id, ())

    def direct_addrs(self, peer_id: str) -> tuple[str, ...]:
        """The direct-stream endpoints `peer_id` announced last (empty: none, or never seen)."""
        return self._direct.get(peer_id, ())

    async def peers(self, skip_probe: frozenset[str], fresh: bool) -> list[PeerSpan]:
        """Announced spans of the model; unmeasured peers outside `skip_probe` are pinged first.

        Args:
            skip_probe: peers not to ping now (excluded ones).
            fresh: read the DHT now; else reuse the last read if it is under SNAPSHOT_MAX_AGE_S old
                (a failover re-plan: a DHT read can wait seconds on a frozen DHT node).
        Raises:
            SwarmError: the DHT did not answer within DHT_READ_TIMEOUT_S.
        """
        if fresh or time.monotonic() - self._read_at > SNAPSHOT_MAX_AGE_S:
            try:
                async with asyncio.timeout(DHT_READ_TIMEOUT_S):
                    read = await self._dht.get_announcements(self._model_id)
            except TimeoutError:
                raise SwarmError(f"the DHT did not answer within {DHT_READ_TIMEOUT_S:.0f} s") from None
            # A read can miss live records (a frozen DHT node delays stores and answers): a record
            # seen before stays until its own expiry; a dead peer in it fails to dial and is excluded.
            now, ids = get_dht_time(), {a.peer_id for a in read}
            self._announced = read + [
                a for a in self._announced if a.peer_id not in ids and a.expires_at > now
            ]
            self._read_at = time.monotonic()
        announced = self._announced
        self._addrs.update((a.peer_id, a.addrs) for a in announced)
        self._direct.update((a.peer_id, a.direct_addrs) for a in announced)
        unmeasured = [
            a.peer_id for a in announced if a.peer_id not in self.rtt_ms and a.peer_id not in skip_probe
        ]
        answered = await self.probe(unmeasured)
        failed = {p: math.inf for p in unmeasured if p not in answered}
        return peer_spans(announced, {**self.rtt_ms, **failed})

    async def probe(self, peer_ids: Collection[str]) -> set[str]:
        """Ping these peers in parallel; keep the RTTs of the ones that answered and return them."""

        async def ping(peer_id: str) -> str | None:
            try:
                self.rtt_ms[peer_id] = await self._dht.transport.ping(
                    peer_id, self.addrs(peer_id), timeout_s=self._probe_timeout_s
                )
                return peer_id
            except SwarmError:
                self.rtt_ms.pop(peer_id, None)
                return None

        for peer_id in peer_ids:  # an RTT counts only if measured by this probe
            self.rtt_ms.pop(peer_id, None)
        try:
            async with asyncio.timeout(self._probe_timeout_s * 3):  # dialling has no timeout of its own
                return {p for p in await asyncio.gather(*(ping(p) for p in peer_ids)) if p}
        except TimeoutError:
            return {p for p in peer_ids if p in self.rtt_ms}


class P2PLink:
    """`PushLink` over one framed stream (libp2p, or direct TCP: swarm.direct), frames encoded with
    swarm.wire and length-prefixed by swarm.p2p."""

    def __init__(self, peer_id: str, stream: StreamSession, transport: str = "libp2p",
                 direct_error: str = ""):
        self.peer_id, self._stream, self.transport = peer_id, stream, transport
        self.direct_error = direct_error
        self._said: bytes | None = None  # a peer's last words, read after a failed send

    async def exchange(self, frame: Frame, timeout_s: float) -> tuple[Frame, int, int]:
        """Send one frame, read one reply (see `HopLink.exchange`)."""
        sent = await self.send(frame, timeout_s)
        reply, received = await self.recv(timeout_s)
        return reply, sent, received

    async def send(self, frame: Frame, timeout_s: float) -> int:
        """Send one frame; its bytes on the wire (see `PushLink.send`). A peer that hung up after
        saying why (an Error, e.g. SHUTTING_DOWN) is read by the next `recv`."""
        data = encode_frame(frame)
        try:
            async with asyncio.timeout(timeout_s):
                await self._stream.send(data)
        except TimeoutError:
            await self._stream.close()
            raise PeerTimeout(
                f"peer {self.peer_id[:12]}… took over {timeout_s:.1f} s to accept a frame"
            ) from None
        except PeerUnreachable:
            # A peer that leaves says why (SHUTTING_DOWN) before hanging up: report that, not "broken".
            said = await self._stream.last_words()
            if said is not None and isinstance(decode_frame(said), Error):
                self._said = said
                return len(data) + 4
            raise
        return len(data) + 4

    async def recv(self, timeout_s: float) -> tuple[Frame, int]:
        """The next frame from the peer and its bytes (see `PushLink.recv`)."""
        if self._said is not None:
            said, self._said = self._said, None
            return decode_frame(said), len(said) + 4
        data = await self._stream.recv(timeout_s)
        return decode_frame(data), len(data) + 4

    async def close(self) -> None:
        """Send Close (bounded by CLOSE_TIMEOUT_S) and close the stream; never raises."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._stream.send(encode_frame(Close()))
        except (SwarmError, TimeoutError):
            pass
        await self._stream.close()


class P2PTransport:
    """`HopTransport`: a direct TCP stream where the peer offers one (swarm.direct), else a stream
    through the client's libp2p daemon, dialling the addresses the directory saw.

    Attributes:
        direct: try direct streams at all (False: libp2p only, e.g. to compare the two).
    """

    def __init__(self, dht: SwarmDHT, directory: DHTDirectory, direct: bool = True):
        self._dht, self._directory, self.direct = dht, directory, direct
        # peer id -> (direct endpoints that did not answer, monotonic time, why): libp2p to that peer
        # for DIRECT_RETRY_S, or until it announces other endpoints
        self._direct_failed: dict[str, tuple[tuple[str, ...], float, str]] = {}

    async def connect(self, peer_id: str, timeout_s: float) -> P2PLink:
        """Open a span stream to `peer_id`, direct when it can. Raises PeerUnreachable, or PeerTimeout
        past timeout_s."""
        endpoints = self._directory.direct_addrs(peer_id)
        failed = self._direct_failed.get(peer_id)
        recent = (failed is not None and failed[0] == endpoints
                  and time.monotonic() - failed[1] < DIRECT_RETRY_S)
        try_direct = self.direct and bool(endpoints) and not recent
        opened = await open_stream(self._dht.transport, peer_id, self._directory.addrs(peer_id),
                                   endpoints if try_direct else (), SPAN_PROTOCOL, timeout_s)
        if try_direct and opened.kind == "libp2p":
            self._direct_failed[peer_id] = (endpoints, time.monotonic(), opened.direct_error)
        why = opened.direct_error or (failed[2] if recent and self.direct else "")
        return P2PLink(peer_id, opened.stream, opened.kind, why)


class RemoteEngine:
    """`swarm.client.generate.Engine` over the swarm: one `RouteSession` per generation.

    Args:
        conn: the client's swarm connection.
        manifest: the model's manifest (model_id, layer count, context length).
        embedder: token ids → `[n, hidden]` float32, exact.
        prefill_chunk_tokens: prompt tokens per Forward frame (and per replayed frame).
        policy: failover limits and timeouts.
        reuse_prefixes: offer the prompt's prefix hashes to every hop so that peers holding a
            snapshot of a shared prefix restore it instead of computing it (swarm/kv/prefix.py);
            only when prefill_chunk_tokens is a multiple of PREFIX_BLOCK_TOKENS (exactness).
    Attributes:
        directory: the peers' announcements and measured RTTs.
        transport: opens the hops' streams; `transport.direct = False` keeps them on libp2p.
        push: chain each route for server push (swarm/client/session.py); False: relay every step.
    """

    def __init__(
        self,
        conn: SwarmConnection,
        manifest: Manifest,
        embedder: TokenEmbedder,
        prefill_chunk_tokens: int = 256,
        policy: FailoverPolicy | None = None,
        reuse_prefixes: bool = True,
    ):
        if prefill_chunk_tokens < 1:
            raise SwarmError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        self._conn = conn
        self._manifest = manifest
        self._embedder = embedder
        self._chunk = prefill_chunk_tokens
        self.reuse_prefixes = reuse_prefixes and prefill_chunk_tokens % PREFIX_BLOCK_TOKENS == 0
        self.policy = policy or FailoverPolicy(replay_chunk_tokens=prefill_chunk_tokens)
        ctx = int(manifest.hparams.get(f"{manifest.arch}.context_length", MAX_CONTEXT_TOKENS))
        self.context_limit = min(ctx, MAX_CONTEXT_TOKENS)
        self.directory = DHTDirectory(conn.dht, manifest.model_id, self.policy.probe_timeout_s)
        self.exclusions = Exclusions(self.policy.exclusion_s)
        self.transport = P2PTransport(conn.dht, self.directory)
        self.push = True
        self._rng = random.SystemRandom()
        self._sessions: set[RemoteSession] = set()

    def open_session(
        self, n_tokens: int, sampling: SamplingParams, telemetry: GenerationTelemetry
    ) -> "RemoteSession":
        """A session reserving `n_tokens` of KV cache on each hop. Its route is planned and opened
        by the first `prefill`, which knows the prompt's prefix hashes to offer the hops.
        """
        spec = SessionSpec(
            self._manifest.model_id, self._conn.dht.peer_id, self._manifest.n_layers, n_tokens, sampling
        )
        route = RouteSession(
            spec,
            self.directory,
            self.transport,
            self.exclusions,
            telemetry,
            self.policy,
            now=time.monotonic,
            sleep=asyncio.sleep,
            rng=self._rng,
            push_addrs=self._push_addrs if self.push else None,
        )
        session = RemoteSession(self._conn.loop, route, self._embedder, self._chunk, self.reuse_prefixes)
        self._sessions.add(session)
        session.on_close = self._sessions.discard
        return session

    def _push_addrs(self, peer_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Where a hop's peer can reach `peer_id`: its announced multiaddrs and direct endpoints."""
        return self.directory.addrs(peer_id), self.directory.direct_addrs(peer_id)

    def close(self) -> None:
        """Close every open session and leave the swarm."""
        for session in list(self._sessions):
            session.close()
        self._conn.close()


class RemoteSession:
    """`EngineSession` over a `RouteSession`: embeds tokens, chunks the prompt, waits on the loop."""

    def __init__(self, loop: LoopThread, route: RouteSession, embedder: TokenEmbedder, chunk_tokens: int,
                 reuse_prefixes: bool = False):
        self._loop, self.route, self._embedder, self._chunk = loop, route, embedder, chunk_tokens
        self._reuse = reuse_prefixes
        self._closed = False
        self.on_close = None

    def prefill(self, tokens) -> StepResult:
        """Open the route (offering the prompt's prefixes), then send the prompt from the restored
        length on, in chunks starting at multiples of the chunk size; return the token sampled after it.

        Raises:
            NoRoute: no chain of live peers with room for the session.
        """
        tokens = list(tokens)
        x = self._embedder.embed(tokens)
        offers = prefix_offers(tokens) if self._reuse else ()
        self._loop.run(self.route.open(offers, lambda n: x[:n]), CALL_TIMEOUT_S)
        token = None
        for i in range(self.route.pos, len(tokens), self._chunk):
            token = self._loop.run(self.route.step(x[i : i + self._chunk]), CALL_TIMEOUT_S)
        assert token is not None
        return StepResult(token=token.token, logprob=token.logprob, top=token.top)

    def decode(self, token: int) -> StepResult:
        """Send one token's hidden state through the route; return the next sampled token."""
        t = self._loop.run(self.route.step(self._embedder.embed([token])), CALL_TIMEOUT_S)
        return StepResult(token=t.token, logprob=t.logprob, top=t.top)

    def close(self) -> None:
        """Close the route's sessions on every peer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.on_close is not None:
            self.on_close(self)
        if self._loop.on_loop_thread:  # garbage-collected on the loop thread: cannot wait there
            self._loop.submit(self.route.close())
        else:
            self._loop.run(self.route.close(), CALL_TIMEOUT_S)


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
