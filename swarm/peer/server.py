"""`swarm serve`: the composition root of a peer.

Builds the parts in order and wires them together; the parts receive their collaborators:
model file → manifest → DHT node → span choice → executor → throughput probe → session table →
stream handler → announcer → rebalancer. On SIGINT/SIGTERM it withdraws the announcement, tells
every open session's client, and stops.

A peer started without `--layers` chooses its span with `swarm.route.placement.choose_span`, sized
by the memory it gives, and re-evaluates it every `rebalance_period_s` (`swarm.peer.rebalance`);
a peer given `--layers` keeps them, and warns at start when they cannot chain with the swarm's.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from swarm.artifacts.distribute import acquire, find_manifest, publish, span_ranges
from swarm.arch import arch_row, servable_row
from swarm.artifacts.session import ArtifactSession, SessionConfig
from swarm.dht.identity import resolve_data_dir
from swarm.dht.node import SwarmDHT
from swarm.dht.records import MAX_PUBLIC_NAME_CHARS
from swarm import eventloop
from swarm.errors import AddressError, SwarmError
from swarm.ggml_bridge.executor import SpanExecutor
from swarm.kv.prefix import PREFIX_BLOCK_TOKENS
from swarm.kv.sessions import SessionTable
from swarm.kv.snapshot import local_format
from swarm.kv.snapshot_store import SnapshotStore
from swarm.limits import MAX_CONTEXT_TOKENS, PUSH_PROTOCOL, SNAPSHOT_PROTOCOL, SPAN_PROTOCOL
from swarm.proctree import descendants
from swarm.manifest import Manifest, build_manifest
from swarm.models import is_model_id, resolve_model
from swarm.direct import DirectServer, direct_maddrs, open_stream
from swarm.netaddr import NetConfig, bt_hosts, check_net_config
from swarm.peer.announce import Announcer, Throughput
from swarm.kv.budget import SpanBudget, span_budget
from swarm.peer.handler import SpanRuntime, handle_push, handle_stream
from swarm.peer.metrics import PeerMetrics
from swarm.peer.scheduler import INLINE_MAX_MS, CostModel, exact_batch_cap
from swarm.peer.rebalance import Rebalancer
from swarm.peer.snapshots import PrefixService
from swarm.route.placement import choose_span
from swarm.span_rules import has_split_rules, span_refusal
from swarm.route.plan import PeerSpan
from swarm.route.snapshot import peer_spans
from swarm.wire import MAX_LAYERS, Error, ErrorCode, encode_frame

logger = logging.getLogger(__name__)

PUSH_DIAL_TIMEOUT_S = 10.0
"""Opening a push stream to the next hop gives up after this long (its pushes then go by the client)."""
SHUTDOWN_STEP_S = 10.0
"""Each shutdown step (withdraw, DHT stop) gives up after this long, so a peer always exits."""


@dataclass(frozen=True)
class ServeConfig:
    """Options of `swarm serve`.

    Attributes:
        model: known model name, `.gguf` path (seeded whole), or a model_id (only the span's
            tensors are fetched from the swarm).
        layers: (start, end) global half-open span, or None to pick the least-covered span.
        initial_peers: multiaddrs to join through; empty with new_swarm starts a swarm.
        host, port: listen address (IPv4 or IPv6 literal; a wildcard listens on every interface and
            advertises each interface address) and libp2p port (0: any free port).
        bt_port: BitTorrent port on the same host (0: any free port, the same on every interface).
        public_address: the only address advertised (libp2p and BitTorrent), e.g. a NAT's public
            IP that forwards `port` and `bt_port` here; needs a fixed `port`.
        data_dir: peer identity directory (None: $SWARM_HOME or the XDG data dir).
        max_sessions: concurrent sessions (llama.cpp sequences).
        cache_tokens: KV-cache tokens in all; each session's own KV stream holds cache_tokens /
            max_sessions of them (llama.cpp rounds up to a multiple of 256), its longest length.
        n_threads: llama.cpp compute threads.
        memory_bytes: bytes for the span's weights and KV cache, which size the span when `layers`
            is None (`swarm.kv.budget.SpanBudget`).
        max_layers: an extra cap on the span's length when `layers` is None (None: memory decides).
        announce_period_s: seconds between announcement refreshes; records expire after 2.5 periods.
        public_name: optional display name in the announcement.
        rebalance_period_s: seconds between re-evaluations of a chosen span (0: never move).
        prefix_cache_bytes: memory budget for prefix KV snapshots (0: keep none, restore none).
        prefix_disk_bytes: disk budget for snapshots evicted from memory (0: no disk tier); files
            live in <data dir>/snapshots/.
        debug_tamper_snapshots: test hook: damage served snapshots this way (swarm.peer.snapshots.TAMPERS).
        debug_die_after_pushes: test hook: after this many pushes (0: never) the whole peer dies at
            once, as under kill -9, between pushing a step and answering its client.
        metrics_port: serve Prometheus metrics on host:metrics_port (`swarm.peer.metrics`); None: don't.
        direct_port: TCP port on `host` for direct span streams from clients (`swarm.direct`; 0: any
            free port); None: offer none (clients then use libp2p streams).
        inline_max_ms: units of executor work measured under this many ms run on the event loop
            thread (`swarm.peer.scheduler.INLINE_MAX_MS`); benchmarks vary it.
    """

    model: str
    layers: tuple[int, int] | None = None
    initial_peers: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 0
    data_dir: str | None = None
    max_sessions: int = 8
    cache_tokens: int = 16384
    n_threads: int = 1
    memory_bytes: int = 4 << 30
    max_layers: int | None = None
    announce_period_s: float = 30.0
    public_name: str | None = None
    rebalance_period_s: float = 600.0
    prefix_cache_bytes: int = 256 << 20
    prefix_disk_bytes: int = 0
    debug_tamper_snapshots: str | None = None
    debug_die_after_pushes: int = 0
    bt_port: int = 0
    public_address: str | None = None
    metrics_port: int | None = None
    direct_port: int | None = 0
    inline_max_ms: float = INLINE_MAX_MS


def check_config(cfg: ServeConfig) -> NetConfig:
    """Refuse a config that cannot serve, before anything starts; return its checked addresses.

    Raises:
        AddressError: host, ports or public address unusable (`swarm.netaddr.check_net_config`).
        SwarmError: a count or period out of range, or a public name that is empty, too long, not
            printable or not UTF-8.
    """
    net = check_net_config(NetConfig(cfg.host, cfg.port, cfg.bt_port, cfg.public_address))
    for name, value, lo, hi in (
        ("max_sessions", cfg.max_sessions, 1, 256),
        ("cache_tokens", cfg.cache_tokens, 1, MAX_CONTEXT_TOKENS),
        ("threads", cfg.n_threads, 1, 1024),
        ("memory_bytes", cfg.memory_bytes, 0, 1 << 60),
        ("max_layers", 1 if cfg.max_layers is None else cfg.max_layers, 1, MAX_LAYERS),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise SwarmError(f"{name} must be an integer in [{lo}, {hi}], got {value!r:.40}")
    port = cfg.direct_port
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535):
        raise AddressError(f"--direct-port must be an integer in 0..65535, got {port!r:.40}")
    port = cfg.metrics_port
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port <= 65535):
        raise AddressError(f"--metrics-port must be in 1..65535, got {port!r:.40}")
    for name, value, zero_ok in (
        ("announce_period_s", cfg.announce_period_s, False),
        ("rebalance_period_s", cfg.rebalance_period_s, True),
    ):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not 0 <= value < math.inf or (value == 0 and not zero_ok):
            bound = ">= 0" if zero_ok else "> 0"
            raise SwarmError(f"{name} must be a finite number of seconds {bound}, got {value!r:.40}")
    if cfg.public_name is not None and not _printable_utf8(cfg.public_name, MAX_PUBLIC_NAME_CHARS):
        raise SwarmError(
            f"public name must be printable UTF-8 text of 1..{MAX_PUBLIC_NAME_CHARS} characters, "
            f"got {cfg.public_name!r:.80}"
        )
    return net


def _printable_utf8(text: object, max_chars: int) -> bool:
    if not isinstance(text, str) or not 1 <= len(text) <= max_chars or not text.isprintable():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def serve(
    cfg: ServeConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run a peer until `stop` is set (or SIGINT/SIGTERM when `stop` is None).

    Raises:
        AddressError: host, ports or public address unusable (before anything starts).
        SwarmError: the config, model, span, BitTorrent port or DHT could not be set up (before
            serving starts; whatever started is stopped again).
    """
    net = check_config(cfg)
    local_path = None if is_model_id(cfg.model) else resolve_model(cfg.model, progress=True)
    if local_path is not None:
        manifest = build_manifest(local_path)  # before anything is announced or printed
        servable_row(manifest.arch)  # refuses architectures that cannot be served, with the reason
        if cfg.layers is not None:
            _check_span(manifest, *cfg.layers)
    # BitTorrent and the direct-stream port first: a port in use fails before the DHT node (its own
    # process) starts.
    artifacts = ArtifactSession(SessionConfig(listen_host=net.host, listen_port=net.bt_port))
    direct = None if cfg.direct_port is None else DirectServer()
    try:
        direct_port = None if direct is None else await direct.listen(net.host, cfg.direct_port)
        dht = await SwarmDHT.start(
            cfg.initial_peers,
            host=net.host,
            port=net.port,
            data_dir=cfg.data_dir,
            public_address=net.public_address,
        )
    except BaseException:
        if direct is not None:
            await direct.close()
        artifacts.close()
        raise
    try:
        artifacts.advertise(bt_hosts(net, dht.visible_maddrs()))
        for maddr in dht.visible_maddrs():
            print(maddr, flush=True)
        path, manifest, (start, end), publication = await _obtain_model(cfg, dht, artifacts, local_path)
        executor = await _load(cfg, path, manifest, start, end)
        rt = SpanRuntime(
            model_id=manifest.model_id,
            start=start,
            end=end,
            executor=executor,
            sessions=SessionTable(cfg.max_sessions, executor.n_ctx_tokens, idle_timeout_s=600.0,
                                  session_cap_tokens=executor.n_ctx_seq_tokens),
        )
        if cfg.prefix_cache_bytes > 0:
            rt.prefixes = _prefix_service(cfg, dht, manifest, start, end)
        rt.scheduler.inline_max_ms = cfg.inline_max_ms
        rt.scheduler.max_batch_rows = await rt.run(exact_batch_cap, executor)
        throughput = await rt.run(measure_throughput, executor, n_tokens=64)
        logger.info(
            "span [%d, %d): %.1f decode steps/s, %.0f prefill tokens/s",
            start,
            end,
            throughput.decode_steps_per_s,
            throughput.prefill_tokens_per_s,
        )
        span_handler = partial(handle_stream, rt)
        metrics = None if cfg.metrics_port is None else PeerMetrics(rt)
        push_handler = partial(handle_push, rt)
        if metrics is not None:
            metrics.serve(net.host, cfg.metrics_port)
            span_handler = metrics.wrap(span_handler)
            push_handler = metrics.wrap_push(push_handler)
        rt.dial = partial(_dial_push, dht.transport)
        if cfg.debug_die_after_pushes:
            rt.after_push = partial(_die_after, [cfg.debug_die_after_pushes])
        await dht.transport.serve(SPAN_PROTOCOL, span_handler)
        await dht.transport.serve(PUSH_PROTOCOL, push_handler)
        direct_addrs: tuple[str, ...] = ()
        if direct is not None:
            await direct.open(dht.transport, {SPAN_PROTOCOL: span_handler, PUSH_PROTOCOL: push_handler})
            direct_addrs = direct_maddrs(bt_hosts(net, dht.visible_maddrs()), direct_port)
        if rt.prefixes is not None:
            await dht.transport.serve(
                SNAPSHOT_PROTOCOL, partial(_serve_snapshot, rt, cfg.debug_tamper_snapshots)
            )
        announcer = Announcer(dht, rt, throughput, cfg.announce_period_s, cfg.public_name, direct_addrs)
        if metrics is not None:
            metrics.announcer = announcer
        await announcer.announce_once()
        print(
            f"serving layers {start}:{end} of {manifest.model_id} as {dht.peer_id}"
            + (f", direct streams on port {direct_port}" if direct is not None else ""),
            file=sys.stderr,
            flush=True,
        )
        if ready is not None:
            ready.set()
        tasks = [asyncio.create_task(publication.refresh_forever(dht))]
        if rt.prefixes is not None:
            tasks.append(asyncio.create_task(rt.prefixes.publish_forever(cfg.announce_period_s)))
        if cfg.layers is None and cfg.rebalance_period_s > 0:
            mover = _Mover(cfg, dht, artifacts, path, manifest, rt, announcer)
            tasks.append(asyncio.create_task(mover.rebalancer().run()))
        try:
            await _run_until_stopped(announcer, stop)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await _shutdown(rt, announcer)
    finally:
        if direct is not None:
            await direct.close()
        await asyncio.to_thread(artifacts.close)
        try:
            await asyncio.wait_for(dht.shutdown(), SHUTDOWN_STEP_S)
        except asyncio.TimeoutError:
            logger.warning("the DHT node did not stop within %.0f s", SHUTDOWN_STEP_S)


async def _obtain_model(cfg: ServeConfig, dht: SwarmDHT, artifacts: ArtifactSession, local_path: Path | None):
    """The span's model file, its manifest, the span, and this peer's seeder publication.

    A local file is seeded whole; a model_id is fetched from the swarm, only the span's bytes.
    """
    if local_path is not None:
        manifest = build_manifest(local_path)
        span = await _choose_layers(cfg, dht, manifest)
        return local_path, manifest, span, await publish(dht, artifacts, local_path, manifest)
    manifest = await find_manifest(dht, cfg.model)
    span = await _choose_layers(cfg, dht, manifest)
    path, publication = await _fetch_span(cfg, dht, artifacts, *span)
    return path, manifest, span, publication


async def _fetch_span(cfg: ServeConfig, dht: SwarmDHT, artifacts: ArtifactSession, start: int, end: int):
    """Fetch (or complete) the sparse file of a model_id with the bytes of [start, end); seed them."""
    dest = resolve_data_dir(cfg.data_dir) / "artifacts" / f"{cfg.model}.gguf"
    path, _, publication = await acquire(
        dht, artifacts, cfg.model, dest, lambda m: span_ranges(m, start, end)
    )
    await publication.store(dht)
    return path, publication


def _die_after(left: list[int]) -> None:
    """Test hook: count a push down; at zero kill this peer's whole process tree (its DHT process
    and p2pd daemons too), as a machine that dies does."""
    left[0] -= 1
    if left[0] == 0:
        for pid in [*descendants(os.getpid()), os.getpid()]:
            os.kill(pid, signal.SIGKILL)


async def _dial_push(transport, peer_id: str, addrs: tuple[str, ...], endpoints: tuple[str, ...]):
    """A push stream to the next hop (swarm.peer.handler.Chain): direct when it can, else libp2p."""
    opened = await open_stream(transport, peer_id, addrs, endpoints, PUSH_PROTOCOL, PUSH_DIAL_TIMEOUT_S)
    return opened.stream


def _prefix_service(
    cfg: ServeConfig, dht: SwarmDHT, manifest: Manifest, start: int, end: int
) -> PrefixService:
    disk_dir = resolve_data_dir(cfg.data_dir) / "snapshots" if cfg.prefix_disk_bytes > 0 else None
    if disk_dir is not None:
        for stale in disk_dir.glob("*.kv"):  # the disk tier is a cache of one run
            stale.unlink(missing_ok=True)
    store = SnapshotStore(cfg.prefix_cache_bytes, disk_dir, cfg.prefix_disk_bytes)
    fmt = local_format(flash_attn=True, ubatch_tokens=PREFIX_BLOCK_TOKENS, kv_streams=cfg.max_sessions)
    return PrefixService(
        store,
        fmt,
        manifest.model_id,
        start,
        end,
        dht.identity.private_key,
        dht,
        max_kv_bytes=max(cfg.prefix_cache_bytes, cfg.prefix_disk_bytes),
    )


async def _serve_snapshot(rt: SpanRuntime, tamper: str | None, stream) -> None:
    if rt.prefixes is None:
        await stream.close()
        return
    await rt.prefixes.serve_fetch(stream, tamper)


def _budget(cfg: ServeConfig, manifest: Manifest) -> SpanBudget:
    return span_budget(manifest, cfg.memory_bytes, cfg.cache_tokens, cfg.max_layers)


async def _choose_layers(cfg: ServeConfig, dht: SwarmDHT, manifest: Manifest) -> tuple[int, int]:
    """`cfg.layers` (with a warning when they cannot chain), or the placement's choice."""
    announced = peer_spans(await dht.get_announcements(manifest.model_id))
    if cfg.layers is not None:
        start, end = cfg.layers
        _check_span(manifest, start, end)
        for line in chain_warnings(announced, manifest.n_layers, start, end):
            print(f"swarm: warning: {line}", file=sys.stderr, flush=True)  # once: the log is stderr too
        return start, end
    placement = choose_span(announced, _budget(cfg, manifest), allowed=_allowed(manifest))
    logger.info(
        "placement: layers %d:%d (%s; routable %.1f -> %.1f tokens/s)",
        placement.start,
        placement.end,
        placement.reason,
        placement.routable_before,
        placement.routable_after,
    )
    return placement.start, placement.end


def chain_warnings(announced: list[PeerSpan], n_layers: int, start: int, end: int) -> list[str]:
    """Why [start, end) cannot chain with the announced spans: boundaries they cross but never meet.

    A boundary is a problem when an announced span crosses it (serves the layers on both sides) and
    no announced span ends there (for `start`) or starts there (for `end`): the layers around it are
    served, but never as a chain through this span. A boundary nobody serves around yet (a swarm
    being built span by span) is not warned about; `swarm status` shows the whole picture.
    """
    lines = []
    for b, meets, side in (
        (start, {p.end for p in announced}, "ends"),
        (end, {p.start for p in announced}, "starts"),
    ):
        if not 0 < b < n_layers or b in meets:
            continue
        crossing = sorted(f"{p.start}:{p.end}" for p in announced if p.start < b < p.end)
        if crossing:
            lines.append(
                f"layers {start}:{end} cannot chain: {', '.join(crossing[:3])} "
                f"{'crosses' if len(crossing) == 1 else 'cross'} layer {b} and no "
                f"announced span {side} there"
            )
    if lines:
        lines.append("clients cannot route through this peer until a span fills the gap (see `swarm status`)")
    return lines


def _check_span(manifest: Manifest, start: int, end: int) -> None:
    if not 0 <= start < end <= manifest.n_layers:
        raise SwarmError(f"layers {start}:{end} are outside the model's 0:{manifest.n_layers}")
    why = span_refusal(arch_row(manifest.arch), manifest.hparams, start, end, manifest.n_layers)
    if why is not None:
        raise SwarmError(f"layers {start}:{end}: {why}")


def _allowed(manifest: Manifest):
    """(start, end) -> whether llama.cpp can run that span of the model (`swarm.span_rules`)."""
    row = arch_row(manifest.arch)
    if not has_split_rules(row):
        return None
    return lambda s, e: span_refusal(row, manifest.hparams, s, e, manifest.n_layers) is None


async def _load(cfg: ServeConfig, path: Path, manifest: Manifest, start: int, end: int) -> SpanExecutor:
    logger.info("loading layers [%d, %d) of %s", start, end, manifest.model_id[:16])
    return await asyncio.to_thread(
        SpanExecutor.for_span,
        path,
        start,
        end,
        n_ctx_tokens=cfg.cache_tokens,
        n_seq_max=cfg.max_sessions,
        n_threads=cfg.n_threads,
        model_id=manifest.model_id,
        n_batch=PREFIX_BLOCK_TOKENS,  # prefill ubatches on the block grid: restores are exact (kv/prefix.py)
    )


@dataclass
class _Mover:
    """Moves a drained peer to a new span: fetch its bytes, swap the executor, re-measure, announce."""

    cfg: ServeConfig
    dht: SwarmDHT
    artifacts: ArtifactSession
    path: Path
    manifest: Manifest
    rt: SpanRuntime
    announcer: Announcer

    def rebalancer(self) -> Rebalancer:
        async def announcements() -> list[PeerSpan]:
            return peer_spans(await self.dht.get_announcements(self.manifest.model_id))

        def me() -> PeerSpan:
            tp = self.announcer.throughput
            s = self.rt.sessions
            return PeerSpan(
                self.dht.peer_id,
                self.rt.start,
                self.rt.end,
                tp.decode_steps_per_s,
                tp.prefill_tokens_per_s,
                s.free_cache_tokens,
                s.sessions_free,
            )

        return Rebalancer(
            peer_id=self.dht.peer_id,
            budget=_budget(self.cfg, self.manifest),
            allowed=_allowed(self.manifest),
            period_s=self.cfg.rebalance_period_s,
            announcements=announcements,
            me=me,
            sessions=lambda: len(self.rt.sessions),
            move=self.move,
            drain=self.rt.drain,
        )

    async def move(self, start: int, end: int) -> None:
        """Serve [start, end) instead of the current span (the caller drained every session).

        The old executor is closed first, so that the peer never holds two spans beyond its memory
        budget; if the new span cannot be loaded, the old one is loaded back.

        Raises:
            SwarmError: the new span's bytes could not be fetched or loaded (the old span serves on).
        """
        old = (self.rt.start, self.rt.end)
        path = self.path
        if is_model_id(self.cfg.model):
            path, _ = await _fetch_span(self.cfg, self.dht, self.artifacts, start, end)
        async with self.rt.lock:
            self.rt.executor.close()
            try:
                executor = await _load(self.cfg, path, self.manifest, start, end)
            except SwarmError:
                self.rt.executor = await _load(self.cfg, path, self.manifest, *old)
                raise
            self.rt.executor, self.rt.start, self.rt.end = executor, start, end
            self.rt.scheduler.cost = CostModel()  # the old span's unit costs say nothing of the new one
            if self.rt.prefixes is not None:
                self.rt.prefixes.move(start, end)
        self.rt.scheduler.max_batch_rows = await self.rt.run(exact_batch_cap, executor)
        self.announcer.throughput = await self.rt.run(measure_throughput, executor, n_tokens=64)
        await self.announcer.announce_once()
        print(f"moved from layers {old[0]}:{old[1]} to {start}:{end}", file=sys.stderr, flush=True)


def measure_throughput(executor: SpanExecutor, prefill_tokens: int = 64, decode_steps: int = 8) -> Throughput:
    """Time a prefill and a few decode steps on sequence 0 with random hidden states, then clear it.

    Returns:
        Throughput: decode steps/s and prefill tokens/s through the whole span.
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((prefill_tokens, executor.n_embd), dtype=np.float32)
    t0 = time.perf_counter()
    executor.forward(0, 0, x)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(decode_steps):
        executor.forward(0, prefill_tokens + i, x[i : i + 1])
    decode_s = time.perf_counter() - t0
    executor.clear(0)
    return Throughput(
        decode_steps_per_s=decode_steps / decode_s, prefill_tokens_per_s=prefill_tokens / prefill_s
    )


async def _run_until_stopped(announcer: Announcer, stop: asyncio.Event | None) -> None:
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    refresher = asyncio.create_task(announcer.run())
    try:
        await stop.wait()
    finally:
        refresher.cancel()
        await asyncio.gather(refresher, return_exceptions=True)


async def _shutdown(rt: SpanRuntime, announcer: Announcer) -> None:
    rt.shutting_down = True
    try:
        await asyncio.wait_for(announcer.withdraw(), SHUTDOWN_STEP_S)
    except (SwarmError, asyncio.TimeoutError) as e:
        why = str(e) or f"no answer within {SHUTDOWN_STEP_S:.0f} s"
        logger.warning("could not withdraw the announcement (it expires by itself): %s", why)
    goodbye = encode_frame(Error(ErrorCode.SHUTTING_DOWN, "peer is shutting down"))
    for stream in list(rt.streams):
        try:
            await stream.send(goodbye)
        except SwarmError:
            pass
        await stream.close()
    rt.pool.shutdown(wait=True)
    rt.executor.close()


def serve_forever(cfg: ServeConfig) -> None:
    """Blocking entry point for the CLI."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    eventloop.run(serve(cfg))
