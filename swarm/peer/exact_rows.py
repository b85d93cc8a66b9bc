"""Exact rows of a span: how many sessions' decode steps it batches, and how many rows of one session's
step it computes, exactly as one-row steps alone.

Batches: a session's outputs in a batch equal its solo outputs only while llama.cpp's kernels do not
depend on the batch's row count; `exact_batch_cap` probes the largest exact batch at load and the
scheduler (swarm/peer/scheduler.py) caps batches there.

Verify groups:
A verify pass of speculative decoding (swarm/spec/verify.py) carries the last token and k drafted
tokens. Computed as one step of k + 1 rows it costs about one decode step on the CPU (the weights
are read once), but llama.cpp's kernels pick their matmul by row count, and some round a step of
many rows differently from one-row steps (Qwen2.5 0.5B Q4_K_M: repacked gemm from 4 rows up). A
pass is exact only in groups of rows that compute bit for bit as one-row steps, so each span
measures that group at load (`probe_exact_step_rows`) and tells clients in `OpenOk.verify_rows`;
a client verifies in groups of the smallest group of its route. Measured (docs/speculative.md):
SmolLM2 8 of 8 probed rows, Qwen2.5 0.5B 3.

Both probes are deterministic functions of the span file, the llama.cpp and ggml libraries, the CPU
(which kernels ggml picks) and the executor's settings, and they cost a peer 1-3 s of CPU at every
start (SmolLM2 and Qwen2.5 0.5B spans on this machine). `exact_rows` keeps their answers beside the
span file, keyed by all of those inputs (`probe_key`), and probes again whenever one changes.

This module does not run batches (swarm/peer/scheduler.py) or read frames.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarm.errors import ExecutorError
from swarm.ggml_bridge import _lib
from swarm.ggml_bridge.executor import BatchStep, SpanExecutor

PROBE_VERSION = 1
"""Version of the probes' inputs and rules: bump it when a probe changes, so that answers cached by
an older one are not used."""

_CACHE_ENTRIES = 16
"""Answers kept per span file (one per executor setting it was opened with)."""

VERIFY_PROBE_ROWS = 8
"""Largest verify group a span probes (and so announces): a pass of more rows goes in several groups."""

_HISTORY_ROWS = 5


def probe_exact_step_rows(ex: SpanExecutor, rows: int = VERIFY_PROBE_ROWS, *, seed: int = 0) -> int:
    """Largest g <= rows such that, for every n <= g, a step of n rows of one sequence gives the
    outputs of n one-row steps bit for bit, measured on random hidden states after a short history.

    Uses sequence 0, which must be empty, and leaves it empty.

    Args:
        ex: a span executor with sequence 0 empty.
        rows: the largest group to probe (capped at the executor's n_batch).
    Returns:
        1..rows.
    Raises:
        ExecutorError: sequence 0 is not empty, or llama.cpp failed.
    """
    rows = max(1, min(rows, ex.n_batch))
    if ex.pos_max(0) != -1:
        raise ExecutorError("the verify probe needs sequence 0 empty")
    rng = np.random.default_rng(seed)
    hist = rng.standard_normal((_HISTORY_ROWS, ex.n_embd)).astype(np.float32)
    xs = rng.standard_normal((rows, ex.n_embd)).astype(np.float32)
    hist_ids = probe_token_ids(ex, rng, _HISTORY_ROWS)
    ids = probe_token_ids(ex, rng, rows)

    def after_history() -> None:
        # clear and recompute rather than truncate: a recurrent state cannot roll back
        ex.clear(0)
        ex.forward(0, 0, hist, token_ids=hist_ids)

    def row_ids(a: int, b: int) -> np.ndarray | None:
        return None if ids is None else ids[a:b]

    try:
        after_history()
        solo = np.concatenate([ex.forward(0, _HISTORY_ROWS + i, xs[i : i + 1], all_logits=True,
                                          token_ids=row_ids(i, i + 1)) for i in range(rows)])
        best = 1
        for n in range(2, rows + 1):
            after_history()
            out = ex.forward(0, _HISTORY_ROWS, xs[:n], all_logits=True, token_ids=row_ids(0, n))
            if not np.array_equal(out, solo[:n]):
                break
            best = n
        return best
    finally:
        ex.clear(0)


def probe_exact_batch_rows(ex: SpanExecutor, rows: int, *, seed: int = 0) -> int:
    """Largest batch (<= rows) whose per-sequence outputs equal solo steps bit for bit, measured.

    Uses sequences 0..rows-1, which must be empty, and leaves them empty. Each gets a short random
    history of its own, then one random row is stepped alone and again in a batch of `rows`; if any
    output differs, a batch of 3 (below ggml-cpu's 4-row gemm switch) is tried, then 1.

    Args:
        ex: a span executor with no sequence in use.
        rows: the batch size wanted, 1..n_seq_max.
    Returns:
        rows, 3 or 1.
    Raises:
        ExecutorError: a sequence is not empty, or llama.cpp failed.
    """
    rows = max(1, min(rows, ex.n_seq_max, ex.n_batch))
    for s in range(rows):
        if ex.pos_max(s) != -1:
            raise ExecutorError(f"probe needs empty sequences, {s} holds tokens")
    rng = np.random.default_rng(seed)
    hist = [rng.standard_normal((3 + s, ex.n_embd)).astype(np.float32) for s in range(rows)]
    hist_ids = [probe_token_ids(ex, rng, 3 + s) for s in range(rows)]

    def replay(n: int) -> None:
        # clear and recompute rather than truncate: a recurrent state cannot roll back
        for s in range(n):
            ex.clear(s)
            ex.forward(s, 0, hist[s], token_ids=hist_ids[s])

    try:
        replay(rows)
        xs = [rng.standard_normal((1, ex.n_embd)).astype(np.float32) for _ in range(rows)]
        ids = [probe_token_ids(ex, rng, 1) for _ in range(rows)]
        solo = [ex.forward(s, len(hist[s]), xs[s], token_ids=ids[s]) for s in range(rows)]
        for n in sorted({rows, min(rows, 3), 1}, reverse=True):
            replay(n)
            outs = ex.forward_batch([BatchStep(s, len(hist[s]), xs[s], token_ids=ids[s]) for s in range(n)])
            if all(np.array_equal(o, r) for o, r in zip(outs, solo)):
                return n
        return 1
    finally:
        for s in range(rows):
            ex.clear(s)


def probe_token_ids(ex: SpanExecutor, rng: np.random.Generator, n: int) -> np.ndarray | None:
    """Random token ids for `n` rows of a probe on `ex`: [n] int32 in [0, n_vocab) when the span
    reads token ids (hash-routed layers route each row by its id), else None."""
    return rng.integers(0, ex.n_vocab, n, dtype=np.int32) if ex.needs_token_ids else None


def exact_batch_cap(ex: SpanExecutor, *, probe_rows: int = 8) -> int:
    """Batch-row cap for a span: n_batch (and n_seq_max) when a probe of `probe_rows` rows, past
    ggml-cpu's 4-row gemm switch, is exact; else what the probe found (3 or 1).

    Uses and empties sequences 0..probe_rows-1 (see `probe_exact_batch_rows`).
    """
    rows = probe_exact_batch_rows(ex, probe_rows)
    if rows >= min(probe_rows, ex.n_seq_max, ex.n_batch) and rows >= 4:
        return min(ex.n_seq_max, ex.n_batch)
    return rows


@dataclass(frozen=True)
class ExactRows:
    """What a span computes exactly: `batch_cap`, sessions' decode steps per batch
    (`exact_batch_cap`); `verify_rows`, rows of one session's step (`probe_exact_step_rows`)."""

    batch_cap: int
    verify_rows: int


def exact_rows(ex: SpanExecutor) -> ExactRows:
    """The span's exact batch cap and verify group: the answer cached beside its span file when the
    probes already ran on the same inputs (`probe_key`), else probed now (sequences 0..7 must be
    empty; they are left empty) and cached. A cache that cannot be read or written is probed around.

    Raises:
        ExecutorError: as the probes.
    """
    key = probe_key(ex)
    path = ex.span_path.with_suffix(".exact.json")
    cached = _read_cache(path)
    hit = cached.get(key)
    if isinstance(hit, dict) and _valid(ex, hit):
        return ExactRows(hit["batch_cap"], hit["verify_rows"])
    found = ExactRows(exact_batch_cap(ex), probe_exact_step_rows(ex))
    cached.pop(key, None)
    cached[key] = dataclasses.asdict(found)
    _write_cache(path, dict(list(cached.items())[-_CACHE_ENTRIES:]))
    return found


def probe_key(ex: SpanExecutor) -> str:
    """sha256 (hex) of everything the probes' answers depend on: PROBE_VERSION, the span file (name,
    size, mtime), every llama.cpp / ggml / libswarm_span library file (name, size, mtime), the CPU
    (model and feature flags: ggml loads the CPU variant they allow) and the executor's settings."""
    st = ex.span_path.stat()
    ident = {
        "version": PROBE_VERSION,
        "span": [ex.span_path.name, st.st_size, st.st_mtime_ns],
        "libraries": _library_files(),
        "cpu": _cpu_identity(),
        "config": dataclasses.asdict(ex.config),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _library_files() -> list[list]:
    """(name, size, mtime) of libswarm_span and of every file in llama_cpp's library directory."""
    files = [_lib.LIB_PATH]
    spec = importlib.util.find_spec("llama_cpp")
    if spec is not None and spec.submodule_search_locations:
        lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
        if lib_dir.is_dir():
            files += sorted(lib_dir.iterdir())
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        out.append([f.name, st.st_size, st.st_mtime_ns])
    return out


def _cpu_identity() -> str:
    """The first processor's model name and feature flags (Linux), else the platform's processor."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    fields = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return f"{fields.get('model name', '')} | {fields.get('flags', fields.get('Features', ''))}"


def _valid(ex: SpanExecutor, hit: dict) -> bool:
    """A cached answer in the range the probes can give for `ex` (a damaged file is probed again)."""
    cap, rows = hit.get("batch_cap"), hit.get("verify_rows")
    return (type(cap) is int and 1 <= cap <= max(ex.n_seq_max, 1)
            and type(rows) is int and 1 <= rows <= VERIFY_PROBE_ROWS)


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, data: dict) -> None:
    """Write by rename (peers starting at once on one machine may race: the last one wins)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
