"""The span a peer serves: its executor, session table, step scheduler, drain state and prefix
service, and every operation that must keep the table and the executor's KV cache in step.

Each operation asks the table (or a pure rule of swarm/peer/rules.py) and applies to the executor
in one place: admit (clears the sequence ids it hands out), forward (checks, computes, advances),
truncate (the cache first, then the table; on a span whose cache cannot truncate, from the
checkpoint taken before a verify pass: swarm/peer/checkpoints.py), restore (imports a prefix
snapshot), release (clears the sequence, wakes a drain), swap (the executor of another span when
the peer moves) and the record it announces. The table is touched only from the event loop; the
executor only through the scheduler, under `lock`.

This module does not: read frames (swarm/peer/handler.py), sample, or choose or load spans
(swarm/peer/build.py loads the executor it is given).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from swarm.errors import ExecutorError, RequestError, SwarmError
from swarm.ggml_bridge.executor import SpanExecutor
from swarm.kv.sessions import SessionSlot, SessionTable
from swarm.limits import MTP_MAX_DRAFTS
from swarm.peer.checkpoints import Checkpoints, replay
from swarm.peer.exact_rows import exact_rows
from swarm.peer.rebalance import Drain
from swarm.peer.rules import (
    Throughput,
    not_restorable,
    restore_refusal,
    span_record,
    token_ids_refusal,
    truncate_refusal,
    width_refusal,
)
from swarm.peer.scheduler import StepOutput, StepScheduler
from swarm.peer.snapshots import PrefixService
from swarm.peer.step_plan import CostModel
from swarm.route.plan import PeerSpan

MeasureFn = Callable[[SpanExecutor], Throughput]
"""Times a span's executor (blocking; run on the executor thread): `swarm.peer.build.measure_throughput`."""


class Span:
    """One served span of one model (see the module docstring). Build it with `Span.open`.

    Attributes:
        model_id: the model served.
        start, end: global half-open layers served (change only in `swap`).
        executor: the span's llama.cpp executor; touched only through `scheduler`, under `lock`.
        sessions: the span's session table.
        scheduler: runs every unit of executor work.
        drain: set while the peer drains to move its span; new sessions are refused with BUSY.
        prefixes: prefix snapshots of this span, or None when the peer keeps none.
        throughput: the span's measured speed (re-measured after each swap).
        verify_rows: rows of one session's step it computes exactly as one-row steps (probed at load
            and after each swap; `OpenOk.verify_rows`).
        shutting_down: set on SIGTERM; new sessions are refused with SHUTTING_DOWN.
        lock: held around every unit of executor work, and while the executor is swapped.
        pool: the executor thread for long calls.
        checkpoints: the sessions' states before their verify passes, on a span whose cache cannot
            truncate (`SpanExecutor.truncate_depth` 0); unused on others.
    """

    def __init__(self, model_id: str, start: int, end: int, executor: SpanExecutor, sessions: SessionTable, *,
                 prefixes: PrefixService | None, inline_max_ms: float, measure: MeasureFn):
        self.model_id, self.start, self.end = model_id, start, end
        self.executor = executor
        self.sessions = sessions
        self.prefixes = prefixes
        self.drain = Drain()
        self.shutting_down = False
        self.lock = asyncio.Lock()
        self.pool = ThreadPoolExecutor(1, "span-executor")
        # Chunks of the executor's n_batch rows: the same ubatches as one long forward() call.
        self.scheduler = StepScheduler(lambda: self.executor, self.lock, self.pool,
                                       chunk_tokens=executor.n_batch, inline_max_ms=inline_max_ms)
        self.throughput = Throughput(0.0, 0.0)
        self.verify_rows = 1
        self.checkpoints = Checkpoints()
        self._measure = measure

    @classmethod
    async def open(cls, model_id: str, start: int, end: int, executor: SpanExecutor, sessions: SessionTable,
                    *, prefixes: PrefixService | None, inline_max_ms: float, measure: MeasureFn) -> Span:
        """A span ready to serve: its batch cap found and its throughput measured on `executor`."""
        span = cls(model_id, start, end, executor, sessions, prefixes=prefixes, inline_max_ms=inline_max_ms,
                   measure=measure)
        await span._tune()
        return span

    async def _tune(self) -> None:
        exact = await self.run(exact_rows, self.executor)
        self.scheduler.max_batch_rows, self.verify_rows = exact.batch_cap, exact.verify_rows
        self.throughput = await self.run(self._measure, self.executor)

    @property
    def is_last(self) -> bool:
        """The span ends the model: it samples, and pushes to no next hop."""
        return self.executor.is_last

    async def run(self, fn: Callable, *args, client: str = ""):
        """Run a blocking executor call alone, between the scheduler's units, in the turn of `client`
        (the session's owner; "": the peer's own work); returns its result."""
        return await self.scheduler.call(fn, *args, client=client)

    @property
    def has_mtp(self) -> bool:
        """The span runs the model's multi-token-prediction head (a last span whose file keeps it)."""
        return self.executor.has_mtp

    async def mtp_draft(self, slot: SessionSlot, token: int, n: int,
                        pos: int | None = None) -> tuple[int, ...]:
        """The MTP head's greedy drafts of the tokens after `token`, the token the session's next step
        feeds at `pos` (default `slot.pos`; an earlier one drafts as if the session ended before it),
        chained (`SpanExecutor.mtp_drafts`); the head's state holds the session's positions as before.

        Args:
            n: drafts asked for; at most MTP_MAX_DRAFTS are made.
        Returns:
            1..min(n, MTP_MAX_DRAFTS) draft token ids, in position order.
        Raises:
            ExecutorError: no head, an empty sequence, a token out of range, a position the head does
                not remember, llama.cpp failed.
        """
        logits = await self.run(self.executor.mtp_drafts, slot.seq_id, token, min(n, MTP_MAX_DRAFTS), pos,
                                client=slot.owner)
        return tuple(int(t) for t in np.argmax(logits, axis=1))

    async def admit(self, session_id: bytes, owner: str, max_tokens: int, now_s: float) -> SessionSlot:
        """Open a session of `owner` reserving `max_tokens`, with an empty sequence.

        Raises:
            Busy: no slot or KV room (`SessionTable.admit`).
            RequestError: a bad or duplicate request.
        """
        admission = self.sessions.admit(session_id, owner, max_tokens, now_s)
        for seq_id in admission.evicted_seq_ids:
            self.checkpoints.forget(seq_id)
            await self.run(self.executor.clear, seq_id)
        # A seq id can come back from a session that ended abnormally; start from an empty cache.
        # In the owner's turn: its Open is its own work, and its first step is due right after.
        self.checkpoints.forget(admission.slot.seq_id)
        await self.run(self.executor.clear, admission.slot.seq_id, client=owner)
        return admission.slot

    async def forward(self, slot: SessionSlot, pos0: int, hidden: np.ndarray, *, all_logits: bool,
                      steps: Sequence[int], finish: Callable[[StepOutput], object],
                      then: Callable[[np.ndarray], Awaitable[None]] | None = None,
                      restore: tuple[int, bytes | None] | None = None, token_ids: np.ndarray | None = None,
                      verify: bool = False):
        """Run `hidden` [n_tokens, n_embd] at `pos0` on the session, then advance it.

        `token_ids` ([n_tokens] int32, or None / empty: none sent) go to the executor with the rows;
        a span whose layers read them refuses a step without them (`rules.token_ids_refusal`).

        `finish` turns the step's output into the reply (the last span samples there) before the
        session advances: a reply that cannot be made leaves the session where it was. `then`, when
        given, is awaited with the output rows first, as soon as they are computed (a push to the
        next hop: it goes out before any of this peer's own work on the answer).
        `restore` (prefix length, snapshot hash; `Forward.restore`) first loads that prefix into the
        session's empty sequence; when the step then fails, the session is emptied again, so a
        refused first step leaves it as it was before the frame, not holding the prefix.
        `verify` (a verify pass, `Forward.verify`): on a span whose cache cannot truncate, the
        session's state is exported first, so that its rejected rows can be rolled back (`truncate`).

        Returns:
            what `finish` returns.
        Raises:
            RequestError: the prefix cannot be restored (see `restore`); the step does not continue
                the session, passes its reservation, has the wrong width or lacks the token ids the
                span reads; `finish` refused the output.
            ExecutorError: the executor failed.
        """
        ids = None if token_ids is None or not token_ids.shape[0] else token_ids
        why = token_ids_refusal(0 if ids is None else ids.shape[0], self.executor.needs_token_ids,
                                self.start, self.end)
        if why is not None:
            raise RequestError(why)
        if restore is None:
            return await self._step(slot, pos0, hidden, ids, all_logits=all_logits, steps=steps,
                                    finish=finish, then=then, verify=verify)
        await self.restore(slot, *restore)
        try:
            return await self._step(slot, pos0, hidden, ids, all_logits=all_logits, steps=steps,
                                    finish=finish, then=then, verify=verify)
        except SwarmError:
            await self.run(self.executor.clear, slot.seq_id)
            self.sessions.truncate(slot, 0)
            raise

    async def _step(self, slot: SessionSlot, pos0: int, hidden: np.ndarray, token_ids: np.ndarray | None, *,
                    all_logits: bool, steps: Sequence[int], finish: Callable[[StepOutput], object],
                    then: Callable[[np.ndarray], Awaitable[None]] | None, verify: bool):
        self.sessions.check_forward(slot, pos0, hidden.shape[0])
        why = width_refusal(hidden.shape[1], self.executor.n_embd)
        if why is not None:
            raise RequestError(why)
        rows = np.ascontiguousarray(hidden, dtype=np.float32)
        # a span that truncates (any depth, or an MTP head's two verify passes) needs no checkpoint
        checkpoints = self.executor.truncate_depth == 0
        # only groups proved exact recompute as they were computed (a larger group: no rollback)
        exact_verify = checkpoints and verify and max(steps or (rows.shape[0],)) <= self.verify_rows
        if exact_verify:
            self.checkpoints.add(slot.seq_id, pos0,
                                 await self.run(self.executor.export_seq, slot.seq_id, client=slot.owner))
        try:
            out = await self.scheduler.step(slot.seq_id, pos0, rows, all_logits=all_logits, steps=steps,
                                            client=slot.owner, token_ids=token_ids)
        except SwarmError:
            # the scheduler's undo of a step's finished sub-steps truncates, which a cache without
            # any-depth truncation may refuse: bring the cache back to where the table says
            if self.executor.truncate_depth is not None:
                await self._back_to(slot, pos0)
            raise
        if checkpoints:
            self.checkpoints.record(slot.seq_id, pos0, rows, token_ids, steps, verify=exact_verify)
        if then is not None:
            await then(out.out)
        reply = finish(out)
        self.sessions.advance(slot, hidden.shape[0], time.monotonic())
        return reply

    async def _back_to(self, slot: SessionSlot, pos0: int) -> None:
        """After a failed step on a span whose cache does not truncate to any depth: bring the
        sequence back to `pos0`, where the table says it ends (a step of several sub-steps may have
        computed some), by truncation as far back as the span's `truncate_depth` allows, else from a
        checkpoint at or before `pos0`; failing both, empty the session."""
        rollback = self.checkpoints.plan(slot.seq_id, pos0)
        ex = self.executor

        def back() -> bool:
            if ex.pos_max(slot.seq_id) == pos0 - 1:
                return True
            if ex.truncate_depth:
                try:
                    ex.truncate(slot.seq_id, pos0)
                    return True
                except ExecutorError:
                    pass  # deeper than the head remembers
            if rollback is not None:
                try:
                    replay(ex, slot.seq_id, rollback)
                    return True
                except ExecutorError:
                    pass  # replay left the sequence empty
            ex.clear(slot.seq_id)
            return False

        if await self.run(back, client=slot.owner):
            self.checkpoints.rolled_back(slot.seq_id, pos0)
        else:
            self.checkpoints.forget(slot.seq_id)
            self.sessions.truncate(slot, 0)

    async def truncate(self, slot: SessionSlot, pos: int) -> None:
        """Drop the session's positions >= `pos`.

        A span whose cache cannot truncate (a recurrent or compressed state) rolls back from a
        checkpoint taken before a verify pass (swarm/peer/checkpoints.py), to 0 by clearing, and
        refuses any other position; a span with an MTP head on a cache that truncates cuts back as
        far as the head remembers (`SpanExecutor.truncate_depth`: two verify passes) and refuses
        deeper.

        Raises:
            RequestError: `pos` is past the session's position or negative.
            ExecutorError: the cache cannot roll back to `pos` (the table still says where the cache
                is), or a rollback from a checkpoint failed (the session is then emptied).
        """
        why = truncate_refusal(pos, slot.pos)
        if why is not None:
            raise RequestError(why)
        rollback = None if self.executor.truncate_depth != 0 or pos in (0, slot.pos) else \
            self.checkpoints.plan(slot.seq_id, pos)
        if rollback is None:
            # the cache first: a recurrent state cannot roll back into a sequence (ArchRow.rollback_exact),
            # and when the executor refuses, the table must still say where the cache is
            await self.run(self.executor.truncate, slot.seq_id, pos, client=slot.owner)
        else:
            try:
                await self.run(replay, self.executor, slot.seq_id, rollback, client=slot.owner)
            except ExecutorError:
                self.checkpoints.forget(slot.seq_id)
                self.sessions.truncate(slot, 0)
                raise
        self.checkpoints.rolled_back(slot.seq_id, pos)
        self.sessions.truncate(slot, pos)

    async def restore(self, slot: SessionSlot, n: int, snapshot_hash: bytes | None) -> None:
        """Load the snapshot `snapshot_hash` of a prefix of `n` tokens into the session's empty sequence.

        Raises:
            RequestError: not the session's first step, no such snapshot held (evicted since Open,
                or never offered), or it could not be imported (the sequence stays empty).
        """
        why = restore_refusal(slot.pos)
        if why is not None:
            raise RequestError(why)
        kv = self.prefixes.snapshot_kv(snapshot_hash) if self.prefixes is not None and snapshot_hash else None
        if kv is None:
            raise RequestError(not_restorable(n))

        self.checkpoints.forget(slot.seq_id)

        def load() -> None:
            executor = self.executor
            try:
                executor.import_seq(slot.seq_id, kv)
                executor.truncate(slot.seq_id, n)
                if executor.pos_max(slot.seq_id) != n - 1:
                    raise ExecutorError(f"snapshot holds {executor.pos_max(slot.seq_id) + 1} tokens, not {n}")
            except ExecutorError:
                executor.clear(slot.seq_id)
                raise

        await self.run(load, client=slot.owner)
        self.sessions.advance(slot, n, time.monotonic())

    async def keep_prefix(self, slot: SessionSlot, offers: Sequence[tuple[int, bytes]]) -> None:
        """Keep the session's cache, which holds the whole offered prompt (`rules.keeps_prefix`),
        as a prefix snapshot, if the prefix service wants it.

        Raises:
            ExecutorError: the cache could not be exported.
        """
        if self.prefixes is not None and self.prefixes.wants(offers):
            kv = await self.run(self.executor.export_seq, slot.seq_id, client=slot.owner)
            self.prefixes.keep(offers, kv)

    async def release(self, session_id: bytes, owner: str = "") -> None:
        """Free the session's slot and clear its sequence, in the turn of `owner` (the session's
        client: its next session usually follows); wakes a drain when none is left."""
        seq_id = self.sessions.release(session_id)
        self.checkpoints.forget(seq_id)
        await self.run(self.executor.clear, seq_id, client=owner)
        self.drain.session_ended(len(self.sessions))

    async def swap(self, start: int, end: int, load: Callable[[int, int], Awaitable[SpanExecutor]]) -> None:
        """Serve [start, end) instead (the caller drained every session), then re-measure.

        The old executor is closed first, so that the peer never holds two spans beyond its memory
        budget; if the new span cannot be loaded, the old one is loaded back.

        Raises:
            SwarmError: `load` failed for the new span (the old span serves on).
        """
        old = (self.start, self.end)
        async with self.lock:
            self.executor.close()
            try:
                executor = await load(start, end)
            except SwarmError:
                self.executor = await load(*old)
                raise
            self.executor, self.start, self.end = executor, start, end
            self.checkpoints.clear()
            self.scheduler.cost = CostModel()  # the old span's unit costs say nothing of the new one
            if self.prefixes is not None:
                self.prefixes.move(start, end)
        await self._tune()

    def record(self, peer_id: str, *, draining: bool = True, started_at: float = 0.0) -> PeerSpan:
        """The span as announced now (`swarm.peer.rules.span_record`); `draining=False` gives the
        free room as if it did not drain (how the rebalancer weighs staying)."""
        return span_record(peer_id, self.start, self.end, self.throughput, self.sessions,
                           draining=draining and bool(self.drain.active), started_at=started_at)

    def close(self) -> None:
        """Wait for the executor thread, then free the executor."""
        self.pool.shutdown(wait=True)
        self.executor.close()
