"""Opening a peer's span: the model file, the span's layers, its executor and prefix service, the
measured `Span` the server serves; and moving that span later (`Mover`).

The order: a local model file (seeded whole) or a model_id (only the span's bytes fetched from the
swarm) → manifest → the layers (`--layers`, checked and warned about when they cannot chain, or
`swarm.route.placement.choose_span` sized by the peer's memory) → executor → `Span.open`, which
finds the batch cap and measures the span's throughput.

This module does not: serve streams or publish the announcement (swarm/peer/server.py wires those;
`Mover` only asks the announcer it is given to announce a moved span at once).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarm.arch import arch_row
from swarm.artifacts.distribute import acquire, find_manifest, publish, span_ranges
from swarm.artifacts.session import ArtifactSession
from swarm.dht.identity import resolve_data_dir
from swarm.dht.node import SwarmDHT
from swarm.errors import SwarmError
from swarm.ggml_bridge.executor import SpanExecutor
from swarm.kv.budget import SpanBudget, span_budget
from swarm.kv.sessions import SessionTable
from swarm.kv.snapshot import local_format
from swarm.kv.snapshot_store import SnapshotStore
from swarm.manifest import Manifest, build_manifest
from swarm.models import is_model_id
from swarm.numeric import UBATCH_TOKENS
from swarm.peer.announce import Announcer
from swarm.peer.config import ServeConfig
from swarm.peer.exact_rows import probe_token_ids
from swarm.peer.rebalance import Rebalancer
from swarm.peer.rules import Throughput
from swarm.peer.snapshots import PrefixService
from swarm.peer.testlie import requantize
from swarm.peer.span import Span
from swarm.route.placement import choose_span
from swarm.route.plan import PeerSpan
from swarm.route.snapshot import peer_spans
from swarm.span_rules import has_split_rules, span_refusal

logger = logging.getLogger(__name__)


async def open_span(cfg: ServeConfig, dht: SwarmDHT, artifacts: ArtifactSession, local_path: Path | None,
                    lazy: str = ""):
    """The span this peer serves, ready: its model file, manifest and seeder publication too.

    `lazy`: TEST ONLY (`SWARM_TEST_LIE=lazy:TYPE`, swarm/peer/testlie.py): run the span from the
    weights requantized to this llama.cpp type while announcing the model as it is.

    Returns:
        (span, path, manifest, publication): the measured `Span`, the model file it was loaded
        from, the model's manifest, and this peer's seeder publication of the file.
    Raises:
        SwarmError: the model, the span or the executor could not be had.
    """
    path, manifest, (start, end), publication = await _obtain_model(cfg, dht, artifacts, local_path)
    executor = await load(cfg, path, manifest, start, end, lazy)
    limits = cfg.limits.resolved(cfg.max_sessions, executor.n_ctx_tokens)
    sessions = SessionTable(cfg.max_sessions, executor.n_ctx_tokens, idle_timeout_s=600.0,
                            session_cap_tokens=executor.n_ctx_seq_tokens, owner_sessions=limits.sessions,
                            owner_tokens=limits.kv_tokens)
    prefixes = _prefix_service(cfg, dht, manifest, start, end) if cfg.prefix_cache_bytes > 0 else None
    span = await Span.open(manifest.model_id, start, end, executor, sessions, prefixes=prefixes,
                            inline_max_ms=cfg.inline_max_ms, measure=measure_throughput)
    logger.info(
        "span [%d, %d): %.1f decode steps/s, %.0f prefill tokens/s",
        start,
        end,
        span.throughput.decode_steps_per_s,
        span.throughput.prefill_tokens_per_s,
    )
    return span, path, manifest, publication


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


def _prefix_service(
    cfg: ServeConfig, dht: SwarmDHT, manifest: Manifest, start: int, end: int
) -> PrefixService:
    disk_dir = resolve_data_dir(cfg.data_dir) / "snapshots" if cfg.prefix_disk_bytes > 0 else None
    if disk_dir is not None:
        for stale in disk_dir.glob("*.kv"):  # the disk tier is a cache of one run
            stale.unlink(missing_ok=True)
    store = SnapshotStore(cfg.prefix_cache_bytes, disk_dir, cfg.prefix_disk_bytes)
    fmt = local_format(flash_attn=True, ubatch_tokens=UBATCH_TOKENS, kv_streams=cfg.max_sessions)
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


def _budget(cfg: ServeConfig, manifest: Manifest) -> SpanBudget:
    return span_budget(manifest, cfg.memory_bytes, cfg.cache_tokens, cfg.max_layers)


async def _choose_layers(cfg: ServeConfig, dht: SwarmDHT, manifest: Manifest) -> tuple[int, int]:
    """`cfg.layers` (with a warning when they cannot chain), or the placement's choice."""
    announced = peer_spans(await dht.get_announcements(manifest.model_id, manifest.n_layers))
    if cfg.layers is not None:
        start, end = cfg.layers
        check_span(manifest, start, end)
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


def check_span(manifest: Manifest, start: int, end: int) -> None:
    """Refuse layers [start, end) outside the model or that llama.cpp cannot split there (SwarmError)."""
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


async def load(cfg: ServeConfig, path: Path, manifest: Manifest, start: int, end: int,
               lazy: str = "") -> SpanExecutor:
    """The executor of layers [start, end) of the model file at `path` (loaded on a worker thread);
    `lazy` (test only): of that file requantized to this type instead."""
    logger.info("loading layers [%d, %d) of %s", start, end, manifest.model_id[:16])
    model_id = manifest.model_id
    if lazy:
        path = await asyncio.to_thread(requantize, path, lazy, resolve_data_dir(cfg.data_dir) / "lazy")
        model_id = None  # span files cached under the requantized file's own identity
    return await asyncio.to_thread(
        SpanExecutor.for_span,
        path,
        start,
        end,
        n_ctx_tokens=cfg.cache_tokens,
        n_seq_max=cfg.max_sessions,
        n_threads=cfg.n_threads,
        model_id=model_id,
        n_batch=UBATCH_TOKENS,  # prefill ubatches on the grid of the numeric contract (swarm/numeric.py)
    )


@dataclass
class Mover:
    """Moves a drained peer to a new span: fetch its bytes, swap the executor, re-measure, announce."""

    cfg: ServeConfig
    dht: SwarmDHT
    artifacts: ArtifactSession
    path: Path
    manifest: Manifest
    span: Span
    announcer: Announcer

    def rebalancer(self) -> Rebalancer:
        """The rebalancer of this peer's span, moving it with `move`."""

        async def announcements() -> list[PeerSpan]:
            m = self.manifest
            return peer_spans(await self.dht.get_announcements(m.model_id, m.n_layers))

        def me() -> PeerSpan:
            # its own drain does not count against staying: the room it has when it serves on
            return self.span.record(self.dht.peer_id, draining=False)

        return Rebalancer(
            peer_id=self.dht.peer_id,
            budget=_budget(self.cfg, self.manifest),
            allowed=_allowed(self.manifest),
            period_s=self.cfg.rebalance_period_s,
            announcements=announcements,
            me=me,
            sessions=lambda: len(self.span.sessions),
            move=self.move,
            drain=self.span.drain,
        )

    async def move(self, start: int, end: int) -> None:
        """Serve [start, end) instead of the current span (the caller drained every session).

        Raises:
            SwarmError: the new span's bytes could not be fetched or loaded (the old span serves on).
        """
        old = (self.span.start, self.span.end)
        path = self.path
        if is_model_id(self.cfg.model):
            path, _ = await _fetch_span(self.cfg, self.dht, self.artifacts, start, end)
        await self.span.swap(start, end, lambda s, e: load(self.cfg, path, self.manifest, s, e))
        await self.announcer.announce_once()
        print(f"moved from layers {old[0]}:{old[1]} to {start}:{end}", file=sys.stderr, flush=True)


def measure_throughput(executor: SpanExecutor, prefill_tokens: int = 64, decode_steps: int = 8) -> Throughput:
    """Time a prefill and a few decode steps on sequence 0 with random hidden states, then clear it.

    Returns:
        Throughput: decode steps/s and prefill tokens/s through the whole span.
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((prefill_tokens, executor.n_embd), dtype=np.float32)
    ids = probe_token_ids(executor, rng, prefill_tokens)
    t0 = time.perf_counter()
    executor.forward(0, 0, x, token_ids=ids)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(decode_steps):
        executor.forward(0, prefill_tokens + i, x[i : i + 1],
                         token_ids=None if ids is None else ids[i : i + 1])
    decode_s = time.perf_counter() - t0
    executor.clear(0)
    return Throughput(
        decode_steps_per_s=decode_steps / decode_s, prefill_tokens_per_s=prefill_tokens / prefill_s
    )


