"""A span's step scheduler: batch decode steps of many sessions, interleave long prefills fairly.

Every executor call of a span goes through one `StepScheduler`, which runs one *unit* at a time:

- a **batch**: the one-row (decode) steps of several sessions waiting together, run as one
  `SpanExecutor.forward_batch` (one llama_decode, the weights read once for all of them);
- a **chunk**: the next `chunk_tokens` rows of one multi-row (prefill) step. Chunks start at the
  step's `pos0` and advance by `chunk_tokens`, exactly as the C library split a long step before, so
  prefill ubatches stay on the 64-token prefix-block grid (kv/prefix.py);
- a **call**: anything else (clear, truncate, export, import, throughput probe), alone.

No unit is held back waiting for others: whatever is queued when the previous unit finishes forms
the next one, so a lone session pays no batching delay. When decode steps and other work both wait,
units alternate between a batch and one other unit, so a client's prefill delays another client's
decode step by at most about one chunk's compute, and steady decoding cannot starve a prefill.
Units are shared fairly across clients (the remote peer a step is for), not jobs: a batch takes
decode steps round-robin by client, and other units go to clients in turn (`plan_next`), so a client
holding many sessions gets no more turns than one holding a single session (`FairnessMeter` measures
it).

Where a unit runs follows its measured cost (`CostModel`): on the event loop thread when it is
expected to take under `inline_max_ms` and the executor is single-threaded, else on the span's one
executor thread, so a large span never blocks pings or other streams for longer than that. The
hand-off to the thread and back costs ~0.4 ms per hop on the project's machine kind (two thread
wake-ups; SmolLM2 in 3 spans of ~6 ms each: 1.48 -> 1.11 ms overhead per hop when run inline,
docs/benchmarks.md), a tax of 4% or more on any step under 10 ms. Unmeasured work runs on the
executor thread.

Exactness: a session's outputs in a batch equal its solo outputs only while llama.cpp's kernels do
not depend on the batch's row count. ggml-cpu's repacked quantized matmuls (Q4_K on x86, for one)
switch from a per-row gemv to a 4-row gemm at 4 rows, which rounds differently (measured: up to
0.23 logits on Qwen2.5 0.5B Q4_K_M). `probe_exact_batch_rows` measures the largest exact batch of a
span, and the peer caps batches there.

This module does not decide admission or positions (kv/sessions.py) nor read frames (handler.py).
`plan_next`, `FairnessMeter` and `CostModel` are pure; `StepScheduler` is the asyncio shell around them. One concern,
so it stays one file past the house's ~400 lines: units, their costs and the exact-batch probe are
the scheduler's own vocabulary and nothing else uses them.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from swarm.errors import ExecutorError
from swarm.ggml_bridge.executor import BatchStep, SpanExecutor

INLINE_MAX_MS = 10.0
"""Units expected to compute in less than this many ms run on the event loop thread: the longest a
ping or another stream's frame waits for one unit."""
MAX_TRACKED_CLIENTS = 1024
"""Clients whose last turn the scheduler remembers; a forgotten one goes first, as a new one does."""
EWMA_WEIGHT = 0.2
"""Weight of the newest measurement in a unit kind's moving average of compute time."""


@dataclass(frozen=True)
class Pending:
    """What the planner sees of one queued job.

    Attributes:
        kind: "step" (a Forward's rows) or "call" (any other executor work).
        seq_id: the step's sequence; -1 for a call.
        rows_left: rows of the step not computed yet; 0 for a call.
        started: some chunk of the step has run already.
        client: the remote client the work is for (its peer id); "" for the peer's own work.
    """

    kind: Literal["step", "call"]
    seq_id: int = -1
    rows_left: int = 0
    started: bool = False
    client: str = ""

    @property
    def is_decode(self) -> bool:
        """A one-row step that has not started: it may join a batch."""
        return self.kind == "step" and self.rows_left == 1 and not self.started


@dataclass(frozen=True)
class Unit:
    """The next piece of work: `kind` "batch" (jobs' one-row steps together), "chunk" (`rows` rows
    of the step `jobs[0]`) or "call" (`jobs[0]`); `jobs` index the pending queue."""

    kind: Literal["batch", "chunk", "call"]
    jobs: tuple[int, ...]
    rows: int


@dataclass(frozen=True)
class Turns:
    """When each client was last served, by unit number (a client never served is not listed and
    goes first): `batch` for decode rows, `other` for chunks and calls."""

    batch: Mapping[str, int] = field(default_factory=dict)
    other: Mapping[str, int] = field(default_factory=dict)


def _by_turn(indices: Sequence[int], pending: Sequence[Pending], last: Mapping[str, int]) -> list[list[int]]:
    """`indices` grouped by client, each group in queue order, the groups least recently served first
    (ties: the client whose first job is oldest)."""
    groups: dict[str, list[int]] = {}
    for i in indices:
        groups.setdefault(pending[i].client, []).append(i)
    return sorted(groups.values(), key=lambda g: (last.get(pending[g[0]].client, -1), g[0]))


def plan_next(pending: Sequence[Pending], *, last_was_batch: bool, max_batch_rows: int,
              chunk_tokens: int, turns: Turns = Turns()) -> Unit | None:
    """Choose the next unit from the queue, fairly across clients.

    A batch takes decode steps round-robin over clients (one per client, least recently served
    client first, then a second per client, ...), so a client with many sessions cannot crowd
    another's step out of a full batch. Any other unit goes to the least recently served client's
    oldest job, so a client with many prefills gets one chunk in turn with each other client, not
    one per job. Within a client, jobs keep their queue order.

    Args:
        pending: queued jobs in arrival order (a job cut into chunks goes back to the end).
        last_was_batch: the previous unit was a batch; when other work also waits, it goes next.
        max_batch_rows: most rows in one batch (>= 1).
        chunk_tokens: most rows of a multi-row step per chunk (>= 1).
        turns: when each client was last served.
    Returns:
        The unit, or None when nothing waits.
    """
    candidates = [i for i, p in enumerate(pending) if p.is_decode]
    groups = _by_turn(candidates, pending, turns.batch)
    decodes: list[int] = []
    seen: set[int] = set()
    for rank in range(max((len(g) for g in groups), default=0)):
        for g in groups:
            # One step per sequence per batch: a sequence's second step needs its first one's position.
            if rank < len(g) and pending[g[rank]].seq_id not in seen and len(decodes) < max_batch_rows:
                decodes.append(g[rank])
                seen.add(pending[g[rank]].seq_id)
    decodes.sort()
    others = [i for i, p in enumerate(pending) if not p.is_decode]
    if decodes and (not others or not last_was_batch):
        return Unit("batch", tuple(decodes), len(decodes))
    if not others:
        return None
    i = _by_turn(others, pending, turns.other)[0][0]
    if pending[i].kind == "call":
        return Unit("call", (i,), 0)
    return Unit("chunk", (i,), min(chunk_tokens, pending[i].rows_left))


class FairnessMeter:
    """How long clients wait while others are served: after each unit, every client with work queued
    that the unit did not serve has waited one more unit; `max_wait_units` is the longest such run
    since start. Round-robin over k clients with work keeps it at most 2k - 1 (the other clients'
    units, each after a batch), however many jobs each client queues."""

    def __init__(self) -> None:
        self.max_wait_units = 0
        self._waiting: dict[str, int] = {}

    def observe(self, queued: set[str], served: set[str]) -> None:
        """One unit ran: `queued` are the clients with a job in the queue as it was planned, `served`
        those it served."""
        self._waiting = {c: self._waiting.get(c, 0) + 1 for c in queued - served}
        if self._waiting:
            self.max_wait_units = max(self.max_wait_units, max(self._waiting.values()))


class CostModel:
    """Moving average of compute ms per kind of unit, to decide where the next one runs.

    Keys are (kind, row bucket): a batch of 8 rows costs less than 8 single rows, so each power-of-two
    row count is its own kind.
    """

    def __init__(self, weight: float = EWMA_WEIGHT):
        self._weight = weight
        self._ms: dict[tuple[str, int], float] = {}

    @staticmethod
    def key(kind: str, rows: int) -> tuple[str, int]:
        """The key of a unit of `kind` over `rows` rows."""
        return kind, int(rows).bit_length()

    def expected_ms(self, key: tuple[str, int]) -> float | None:
        """Average ms of units of this key, or None when none was measured."""
        return self._ms.get(key)

    def observe(self, key: tuple[str, int], ms: float) -> None:
        """Fold one measured compute time (ms) into the key's average."""
        old = self._ms.get(key)
        self._ms[key] = ms if old is None else old + self._weight * (ms - old)


@dataclass(frozen=True)
class StepOutput:
    """A step's output and the compute time spent on it.

    Attributes:
        out: as `SpanExecutor.forward` returns it for the whole step.
        compute_ms: ms of executor compute of the units that carried this step (a batch's time is
            shared by its steps; a chunked step sums its chunks).
    """

    out: np.ndarray
    compute_ms: float


@dataclass
class _Job:
    fut: asyncio.Future
    seq_id: int = -1
    pos0: int = 0
    hidden: np.ndarray | None = None
    all_logits: bool = False
    token_ids: np.ndarray | None = None
    fn: Callable[..., Any] | None = None
    args: tuple = ()
    done_rows: int = 0
    outs: list[np.ndarray] = field(default_factory=list)
    compute_ms: float = 0.0
    client: str = ""

    def view(self) -> Pending:
        if self.fn is not None:
            return Pending("call", client=self.client)
        return Pending("step", self.seq_id, self.hidden.shape[0] - self.done_rows, self.done_rows > 0,
                       self.client)


class StepScheduler:
    """Runs a span's executor work one unit at a time (see the module docstring).

    Collaborators are passed in: `executor` returns the span's current executor (a peer that moves
    swaps it), `lock` is held around every unit (the mover holds it while swapping), `pool` is the
    span's one executor thread.
    """

    def __init__(self, executor: Callable[[], SpanExecutor], lock: asyncio.Lock, pool: ThreadPoolExecutor, *,
                 chunk_tokens: int, max_batch_rows: int = 1, inline_max_ms: float = INLINE_MAX_MS):
        self._executor, self._lock, self._pool = executor, lock, pool
        self.chunk_tokens = chunk_tokens
        self.max_batch_rows = max_batch_rows
        self.inline_max_ms = inline_max_ms
        self.cost = CostModel()
        self.units: list[tuple[str, tuple[int, ...], int]] = []
        """(kind, seq ids, rows) of recent units, oldest first (the last 1024), for tests and benchmarks."""
        self.unit_ms: list[float] = []
        """Compute ms of the same units, in the same order."""
        self.fairness = FairnessMeter()
        self._queue: deque[_Job] = deque()
        self._runner: asyncio.Task | None = None
        self._last_was_batch = False
        self._last_batch: dict[str, int] = {}
        self._last_other: dict[str, int] = {}
        self._unit_no = 0

    async def step(self, seq_id: int, pos0: int, hidden: np.ndarray, *, all_logits: bool = False,
                   steps: Sequence[int] = (), client: str = "",
                   token_ids: np.ndarray | None = None) -> StepOutput:
        """Run the span on `hidden` rows of sequence `seq_id` from `pos0`; batched or chunked.

        Args:
            seq_id, pos0, hidden, all_logits, token_ids: as `SpanExecutor.forward`; hidden [n, n_embd]
                float32, token_ids [n] or None (each chunk, batch row and step gets its rows' ids).
            steps: () for one step, or the row counts (summing to n) of several steps run one after
                the other, each exactly as if it came alone (wire.Forward.steps).
            client: the remote client the step is for; units are shared fairly among clients.
        Returns:
            StepOutput with the output of the whole step (of all its steps).
        Raises:
            ExecutorError: as `SpanExecutor.forward`; the sequence is as before the step.
        """
        if len(steps) > 1:
            return await self._steps(seq_id, pos0, hidden, all_logits, steps, client, token_ids)
        job = _Job(asyncio.get_running_loop().create_future(), seq_id, pos0, hidden, all_logits, token_ids,
                   client=client)
        now = self._run_now(job)
        if now is not None:
            return now
        return await self._submit(job)

    async def _steps(self, seq_id: int, pos0: int, hidden: np.ndarray, all_logits: bool,
                     steps: Sequence[int], client: str, token_ids: np.ndarray | None) -> StepOutput:
        """Several steps of one sequence in order; atomic like one step: a failure or cancellation
        rolls the sequence back to `pos0`."""
        outs: list[np.ndarray] = []
        ms, a = 0.0, 0
        try:
            for n in steps:
                r = await self.step(seq_id, pos0 + a, hidden[a : a + n], all_logits=all_logits, client=client,
                                    token_ids=None if token_ids is None else token_ids[a : a + n])
                outs.append(r.out)
                ms, a = ms + r.compute_ms, a + n
                # a step run inline returns without yielding: let pings and other sessions in
                await asyncio.sleep(0)
        except BaseException:
            # also when nothing finished: a cancelled first step may still complete on the executor
            self._queue_rollback(seq_id, pos0, client)
            raise
        last_only = self._executor().is_last and not all_logits
        return StepOutput(outs[-1] if last_only else np.concatenate(outs), ms)

    def _queue_rollback(self, seq_id: int, pos: int, client: str) -> None:
        """Queue a truncate of `seq_id` to `pos` at the front of the queue, without waiting (the
        caller may be cancelled). It runs before any later step of the sequence: a session sends its
        next step only after this one's answer, and a decode batch planned ahead of it can hold only
        steps queued before; it is its client's oldest job, and a client's jobs run in queue order."""
        ex = self._executor()

        def rollback() -> None:
            try:
                ex.truncate(seq_id, pos)
            except ExecutorError:
                pass  # the executor is closed or the sequence is gone: nothing left to undo

        self._queue.appendleft(_Job(asyncio.get_running_loop().create_future(), fn=rollback, client=client))
        self._ensure_runner()

    def _run_now(self, job: _Job) -> StepOutput | None:
        """Fast path for a lone decode step: when nothing is queued or running and the step is
        measured to be cheap enough to run inline, run it here and now. It is synchronous, so nothing
        can interleave with it; it saves the runner task's loop turns (~0.2 ms per hop, measured).
        Returns None when the step must go through the queue."""
        ex = self._executor()
        if self._queue or (self._runner is not None and not self._runner.done()) or self._lock.locked():
            return None
        key = CostModel.key("batch", 1)
        expected = self.cost.expected_ms(key)
        if not (job.view().is_decode and ex.n_threads == 1 and expected is not None
                and expected < self.inline_max_ms):
            return None
        self._last_was_batch = True
        self._record("batch", [job], set())
        self.units.append(("batch", (job.seq_id,), 1))
        del self.units[:-1024]
        t0 = time.perf_counter()
        (out,) = self._batch(ex, [job])
        ms = (time.perf_counter() - t0) * 1000.0
        self.cost.observe(key, ms)
        self.unit_ms.append(ms)
        del self.unit_ms[:-1024]
        if isinstance(out, Exception):
            raise out
        return StepOutput(out, ms)

    async def call(self, fn: Callable[..., Any], *args: Any, client: str = "") -> Any:
        """Run `fn(*args)` alone between units (a blocking executor call) in the turn of `client` ("":
        the peer's own work); returns its result."""
        return await self._submit(_Job(asyncio.get_running_loop().create_future(), fn=fn, args=args,
                                       client=client))

    async def _submit(self, job: _Job) -> Any:
        self._queue.append(job)
        self._ensure_runner()
        return await job.fut

    def _ensure_runner(self) -> None:
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self._drain_queue()
        except BaseException as e:
            # A bug here must not leave callers waiting forever: fail whatever is still queued.
            for job in self._queue:
                _settle(job, None, e if isinstance(e, Exception) else ExecutorError("scheduler stopped"))
            self._queue.clear()
            raise

    async def _drain_queue(self) -> None:
        while True:
            self._drop_cancelled()
            jobs = list(self._queue)
            unit = plan_next([j.view() for j in jobs], last_was_batch=self._last_was_batch,
                             max_batch_rows=self.max_batch_rows, chunk_tokens=self.chunk_tokens,
                             turns=Turns(self._last_batch, self._last_other))
            if unit is None:
                return
            chosen = [jobs[i] for i in unit.jobs]
            for j in chosen:
                self._queue.remove(j)
            self._last_was_batch = unit.kind == "batch"
            self._record(unit.kind, chosen, {j.client for j in jobs})
            self.units.append((unit.kind, tuple(j.seq_id for j in chosen), unit.rows))
            del self.units[:-1024]
            self.unit_ms.append(float("nan"))
            del self.unit_ms[:-1024]
            async with self._lock:
                await self._run_unit(unit, chosen)
            # Let callers whose steps just finished queue their next ones before the next unit is
            # planned: sessions that would otherwise alternate in two half-size batches merge into
            # one, and a unit run inline gives pings and other streams a turn.
            await asyncio.sleep(0)

    def _record(self, kind: str, chosen: list[_Job], queued: set[str]) -> None:
        """Note which clients the unit serves: their turn, and the others' wait."""
        self._unit_no += 1
        served = {j.client for j in chosen}
        last = self._last_batch if kind == "batch" else self._last_other
        for c in served:
            last.pop(c, None)
            last[c] = self._unit_no
        while len(last) > MAX_TRACKED_CLIENTS:
            del last[next(iter(last))]  # least recently served: dicts keep insertion order
        self.fairness.observe(queued, served)

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._queue if j.fut.done()]:
            self._queue.remove(job)
            if job.done_rows > 0:  # a cancelled half-done prefill: keep the step atomic
                self._queue_rollback(job.seq_id, job.pos0, job.client)

    async def _run_unit(self, unit: Unit, jobs: list[_Job]) -> None:
        ex = self._executor()
        if unit.kind == "call":
            fn = jobs[0].fn
            work = partial(fn, *jobs[0].args)
            key = CostModel.key(f"call:{getattr(fn, '__qualname__', '?')}", 0)
        elif unit.kind == "batch":
            work = partial(self._batch, ex, jobs)
            key = CostModel.key("batch", unit.rows)
        else:
            work = partial(self._chunk, ex, jobs[0], unit.rows)
            key = CostModel.key("chunk", unit.rows)
        result, ms, err = await self._execute(ex, key, work)
        self.unit_ms[-1] = ms
        if unit.kind == "call":
            _settle(jobs[0], result, err)
        elif unit.kind == "batch" and err is not None:
            for job in jobs:
                _settle(job, None, err)
        elif unit.kind == "batch":
            for job, r in zip(jobs, result):
                _settle(job, None if isinstance(r, Exception) else StepOutput(r, ms),
                        r if isinstance(r, Exception) else None)
        else:
            self._after_chunk(ex, jobs[0], unit.rows, result, ms, err)

    async def _execute(self, ex: SpanExecutor, key, work) -> tuple[Any, float, BaseException | None]:
        """Run `work` inline or on the executor thread; returns (result, compute ms, error). The ms
        exclude the thread hand-off, so a client's per-hop overhead figures still show it."""
        expected = self.cost.expected_ms(key)
        inline = ex.n_threads == 1 and expected is not None and expected < self.inline_max_ms

        def timed():
            t0 = time.perf_counter()
            try:
                return work(), None, (time.perf_counter() - t0) * 1000.0
            except Exception as e:  # noqa: BLE001 - handed to the waiting caller
                return None, e, (time.perf_counter() - t0) * 1000.0

        if inline:
            result, err, ms = timed()
        else:
            result, err, ms = await asyncio.get_running_loop().run_in_executor(self._pool, timed)
        self.cost.observe(key, ms)
        return result, ms, err

    @staticmethod
    def _batch(ex: SpanExecutor, jobs: list[_Job]) -> list[np.ndarray | Exception]:
        if len(jobs) == 1:
            j = jobs[0]
            try:
                return [ex.forward(j.seq_id, j.pos0, j.hidden, all_logits=j.all_logits,
                                   token_ids=j.token_ids)]
            except ExecutorError as e:
                return [e]
        try:
            return ex.forward_batch([BatchStep(j.seq_id, j.pos0, j.hidden, j.all_logits, j.token_ids)
                                     for j in jobs])
        except ExecutorError:
            # The batch left every sequence as it was; run the steps alone so only a bad one fails.
            return [StepScheduler._batch(ex, [j])[0] for j in jobs]

    @staticmethod
    def _chunk(ex: SpanExecutor, job: _Job, rows: int) -> np.ndarray:
        a = job.done_rows
        ids = None if job.token_ids is None else job.token_ids[a : a + rows]
        return ex.forward(job.seq_id, job.pos0 + a, job.hidden[a : a + rows], all_logits=job.all_logits,
                          token_ids=ids)

    def _after_chunk(self, ex: SpanExecutor, job: _Job, rows: int, out, ms: float, err) -> None:
        if err is not None:
            if job.done_rows > 0:
                # Earlier chunks are in the cache: roll the whole step back now (a cheap cache edit,
                # under the lock), before the session's next step can be planned.
                try:
                    ex.truncate(job.seq_id, job.pos0)
                except ExecutorError:
                    pass  # the executor is closed or the sequence is gone: nothing left to undo
            _settle(job, None, err)
            return
        job.outs.append(out)
        job.done_rows += rows
        job.compute_ms += ms
        if job.done_rows < job.hidden.shape[0]:
            self._queue.append(job)  # to the back: waiting decode steps and other prefills go first
            return
        full = job.outs[-1] if (ex.is_last and not job.all_logits) else np.concatenate(job.outs)
        _settle(job, StepOutput(full, job.compute_ms), None)


def _settle(job: _Job, result: Any, err: BaseException | None) -> None:
    if job.fut.done():
        return
    if err is not None:
        job.fut.set_exception(err)
    else:
        job.fut.set_result(result)


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
