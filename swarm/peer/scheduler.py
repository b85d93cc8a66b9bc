"""A span's step scheduler: batch decode steps of many sessions, interleave long prefills fairly.

Every executor call of a span goes through one `StepScheduler`, which runs one *unit* at a time:

- a **batch**: the one-row (decode) steps of several sessions waiting together, run as one
  `SpanExecutor.forward_batch` (one llama_decode, the weights read once for all of them);
- a **chunk**: the next `chunk_tokens` rows of one multi-row (prefill) step. Chunks start at the
  step's `pos0` and advance by `chunk_tokens`, exactly as the C library split a long step before, so
  prefill ubatches stay on the 64-token prefix-block grid (kv/prefix.py);
- a **call**: anything else (clear, truncate, export, import, throughput probe), alone.

Which unit runs next is planned in swarm/peer/step_plan.py: compute is shared across clients (the
remote peer a step is for), weighted by cost. The client with the least decayed compute goes first,
decode steps of similar clients batch together, and a unit that only serves heavier clients is held
back for a short, measured moment when a lighter client's next decode step is due, so a client that
prefills without pause delays another's token by a few ms instead of a whole chunk. Work of a
lighter client that arrives while such a chunk runs anyway (a newcomer's first message) stops it
(`SpanExecutor.interrupt`), and the chunk runs again after that client's work. A lone session
pays no batching delay.

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
0.23 logits on Qwen2.5 0.5B Q4_K_M). `exact_rows.probe_exact_batch_rows` measures the largest exact batch
of a span, and the peer caps batches there.

This module does not decide admission or positions (kv/sessions.py), nor which unit is next
(step_plan.py), nor read frames (handler.py); `StepScheduler` is the asyncio shell around the plan.
One concern, so it stays one file past the house's ~400 lines: one queue, its runner, and the
executor work it runs.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from statistics import median
from typing import Any, Callable, Sequence

import numpy as np

from swarm.errors import ExecutorError, ExecutorInterrupted
from swarm.ggml_bridge.executor import BatchStep, SpanExecutor
from swarm.peer.step_plan import (
    INLINE_MAX_MS, ClientUsage, CostModel, Due, FairnessMeter, Pending, Unit, hold_ms, plan_next, preempts,
)

GAP_SAMPLES = 5
"""A client's return gap is the median of its last this many gaps."""
MAX_TRACKED_GAPS = 1024
"""Clients (and kinds of answer) whose return gaps are remembered; the least recently measured are
forgotten first."""


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
class _Running:
    """The chunk running now, and who stopped it (None: nobody)."""

    unit: Unit
    job: "_Job"
    ex: SpanExecutor
    t0: float
    expected_ms: float | None
    by: str | None = None


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
    stopped: int = 0  # times its current chunk was stopped for lighter clients (step_plan.preempts)

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
                 chunk_tokens: int, max_batch_rows: int = 1, inline_max_ms: float = INLINE_MAX_MS,
                 preemptible: bool = True):
        self._executor, self._lock, self._pool = executor, lock, pool
        self.chunk_tokens = chunk_tokens
        self.max_batch_rows = max_batch_rows
        self.inline_max_ms = inline_max_ms
        self.cost = CostModel()
        self.units: list[tuple[str, tuple[int, ...], int]] = []
        """(kind, seq ids, rows) of recent units, oldest first (the last 1024), for tests and benchmarks;
        kind "stopped": a chunk stopped for a lighter client (it reruns as a later "chunk")."""
        self.unit_ms: list[float] = []
        """Compute ms of the same units, in the same order."""
        self.fairness = FairnessMeter()
        self.usage = ClientUsage()
        self.holds = 0
        """Units held back for a lighter client's due step (step_plan.hold_ms), since start."""
        self.held_ms = 0.0
        """ms the executor stood idle in those holds, since start."""
        self.preemptible = preemptible
        """Chunks may be stopped for lighter clients (step_plan.preempts), on an executor that is
        `interruptible` (its cache rolls a stopped step back exactly)."""
        self.preemptions = 0
        """Chunks stopped for a lighter client's work, since start."""
        self.preempted_ms = 0.0
        """Compute ms those chunks had spent when stopped (done again when they rerun)."""
        self._running: _Running | None = None
        self._queue: deque[_Job] = deque()
        self._runner: asyncio.Task | None = None
        self._last_was_batch = False
        # client -> (perf_counter s of its last answer, a hold waited for it since, "step" or "call")
        self._answered: dict[str, tuple[float, bool, str]] = {}
        # (client, what was answered: "step" or "call") -> its last return gaps, ms: a client comes
        # back from a decode step's answer in a round trip, from an Open's after more of its own work
        self._gaps: dict[tuple[str, str], deque[float]] = {}
        self._awaited: set[str] = set()
        self._arrived = asyncio.Event()

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
        self._note_arrival(job)
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
        self.fairness.observe(set(), {job.client})
        self.units.append(("batch", (job.seq_id,), 1))
        del self.units[:-1024]
        t0 = time.perf_counter()
        (out,) = self._batch(ex, [job])
        ms = (time.perf_counter() - t0) * 1000.0
        self.cost.observe(key, ms)
        self._charge([job], ms)
        self._answer([job])
        self.unit_ms.append(ms)
        del self.unit_ms[:-1024]
        if isinstance(out, Exception):
            raise out
        return StepOutput(out, ms)

    async def call(self, fn: Callable[..., Any], *args: Any, client: str = "") -> Any:
        """Run `fn(*args)` alone between units (a blocking executor call) in the turn of `client` ("":
        the peer's own work); returns its result."""
        job = _Job(asyncio.get_running_loop().create_future(), fn=fn, args=args, client=client)
        self._note_arrival(job)
        return await self._submit(job)

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
            usage = self.usage.snapshot({j.client for j in jobs} | set(self._answered), time.monotonic())
            unit = plan_next([j.view() for j in jobs], last_was_batch=self._last_was_batch,
                             max_batch_rows=self.max_batch_rows, chunk_tokens=self.chunk_tokens, usage=usage,
                             batch_ms=lambda n: self.cost.expected_ms(CostModel.key("batch", n)))
            if unit is None:
                return
            chosen = [jobs[i] for i in unit.jobs]
            if await self._hold(unit, chosen, usage):
                continue
            for j in chosen:
                self._queue.remove(j)
            self._last_was_batch = unit.kind == "batch"
            self.fairness.observe({j.client for j in jobs}, {j.client for j in chosen})
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

    async def _hold(self, unit: Unit, chosen: list[_Job], usage: dict[str, float]) -> bool:
        """Hold `unit` back while a lighter client's next work is due (step_plan.hold_ms): wait for it
        or the hold's end. Each answer is waited on at most once. Returns whether it waited (the
        caller plans again)."""
        if unit.kind == "call":
            return False
        now = time.perf_counter()
        due = {client: Due(client, median(self._gaps[client, kind]), (now - t) * 1000.0)
               for client, (t, held, kind) in self._answered.items()
               if not held and self._gaps.get((client, kind))}
        cost = self.cost.expected_ms(CostModel.key(unit.kind, unit.rows))
        wait_ms = hold_ms(unit, {j.client for j in chosen}, cost, list(due.values()), usage)
        if wait_ms <= 0.0:
            return False
        for client in due:
            t, _, kind = self._answered[client]
            self._answered[client] = (t, True, kind)
        self._awaited = set(due)
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), wait_ms / 1000.0)
        except asyncio.TimeoutError:
            pass
        self._awaited = set()
        self.holds += 1
        self.held_ms += (time.perf_counter() - now) * 1000.0
        return True

    def _note_arrival(self, job: _Job) -> None:
        """New work arrived: the client's gap since its last answer is measured, and a hold that
        waits for the client ends."""
        answered = self._answered.pop(job.client, None)
        if answered is not None:
            key = (job.client, answered[2])
            gaps = self._gaps.pop(key, None) or deque(maxlen=GAP_SAMPLES)
            gaps.append((time.perf_counter() - answered[0]) * 1000.0)
            self._gaps[key] = gaps
            while len(self._gaps) > MAX_TRACKED_GAPS:
                del self._gaps[next(iter(self._gaps))]
        if job.client in self._awaited:
            self._arrived.set()
        self._maybe_preempt(job.client)

    def _maybe_preempt(self, client: str) -> None:
        """Stop the running chunk for `client`'s work when step_plan.preempts says so; the chunk's
        unit then queues it again (`_run_unit`)."""
        r = self._running
        if r is None or r.by is not None or not (self.preemptible and r.ex.interruptible):
            return
        elapsed = (time.perf_counter() - r.t0) * 1000.0
        left = None if r.expected_ms is None else r.expected_ms - elapsed
        usage = self.usage.snapshot({client, r.job.client}, time.monotonic())
        if preempts(r.unit, {r.job.client}, client, usage, r.job.stopped, left, elapsed):
            r.by = client
            r.ex.interrupt()

    def _charge(self, jobs: list[_Job], ms: float) -> None:
        """Charge a unit's compute to the clients it served (a batch's split over its rows)."""
        now = time.monotonic()
        for j in jobs:
            self.usage.charge(j.client, ms / len(jobs), now, j.seq_id)

    def _answer(self, jobs: list[_Job]) -> None:
        """Note when each client's work was answered: it is due back a measured gap later. The
        peer's own work ("") is never waited for."""
        t = time.perf_counter()
        for j in jobs:
            if j.client:
                self._answered.pop(j.client, None)
                self._answered[j.client] = (t, False, "call" if j.fn is not None else "step")
        while len(self._answered) > MAX_TRACKED_GAPS:
            del self._answered[next(iter(self._answered))]

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
            self._running = _Running(unit, jobs[0], ex, time.perf_counter(), self.cost.expected_ms(key))
        try:
            result, ms, err = await self._execute(ex, key, work)
        finally:
            running, self._running = self._running, None
            if running is not None and running.by is not None:
                ex.interrupt(False)  # before any other unit can start
        self.unit_ms[-1] = ms
        if isinstance(err, ExecutorInterrupted) and running is not None and running.by is not None:
            # Stopped for a lighter client: nothing of the chunk is left in the cache; it runs again
            # first in its client's turn, and the client that stopped it pays for the lost compute.
            jobs[0].stopped += 1
            self.units[-1] = ("stopped", *self.units[-1][1:])
            self.preemptions += 1
            self.preempted_ms += ms
            self.usage.charge(running.by, ms, time.monotonic())
            self._queue.appendleft(jobs[0])
            return
        self._charge(jobs, ms)
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
        self._answer([j for j in jobs if j.fut.done()])  # a chunk is answered with the step's last one

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
        if not isinstance(err, ExecutorInterrupted):  # a stopped unit says nothing of its cost
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
        job.stopped = 0
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
