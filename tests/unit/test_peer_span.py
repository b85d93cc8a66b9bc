"""swarm.peer.span.Span: each operation keeps the session table and the executor's KV cache in step
(a fake executor records its calls; no llama.cpp)."""

import asyncio

import numpy as np
import pytest

from swarm.errors import ExecutorError, RequestError, SwarmError
from swarm.kv.sessions import SessionTable
from swarm.peer import span as span_module
from swarm.peer.rules import Throughput
from swarm.peer.exact_rows import ExactRows
from swarm.peer.span import Span


class FakeExecutor:
    n_batch, n_embd, n_threads, n_seq_max, is_last, needs_token_ids = 64, 4, 1, 4, False, False
    can_truncate, truncate_depth = True, None

    def __init__(self, name="a", fail_truncate=False):
        self.name, self.fail_truncate, self.calls, self.closed = name, fail_truncate, [], False

    def clear(self, seq_id):
        self.calls.append(("clear", seq_id))

    def truncate(self, seq_id, pos):
        self.calls.append(("truncate", seq_id, pos))
        if self.fail_truncate:
            raise ExecutorError("cannot roll back")

    def forward(self, seq_id, pos0, hidden, *, all_logits=False, token_ids=None):
        self.calls.append(("forward", seq_id, pos0, hidden.shape[0]))
        self.token_ids = None if token_ids is None else token_ids.tolist()
        return hidden + 1.0

    def close(self):
        self.closed = True


def _span(executor=None) -> Span:
    ex = executor or FakeExecutor()
    return Span("ab" * 32, 0, 4, ex, SessionTable(2, 256, idle_timeout_s=600.0), prefixes=None,
                inline_max_ms=0.0, measure=lambda ex: Throughput(1.0, 2.0))


def test_admit_forward_truncate_release_keep_table_and_cache_in_step():
    async def main():
        span = _span()
        ex = span.executor
        slot = await span.admit(b"s" * 16, "client", 32, 0.0)
        assert ex.calls == [("clear", slot.seq_id)]  # a seq id handed out again starts empty
        out = await span.forward(slot, 0, np.zeros((3, 4), np.float32), all_logits=False, steps=(),
                                 finish=lambda r: r.out)
        assert out.shape == (3, 4) and slot.pos == 3
        with pytest.raises(RequestError, match="step starts at position 1"):
            await span.forward(slot, 1, np.zeros((1, 4), np.float32), all_logits=False, steps=(),
                               finish=lambda r: r)
        with pytest.raises(RequestError, match="hidden size 2"):
            await span.forward(slot, 3, np.zeros((1, 2), np.float32), all_logits=False, steps=(),
                               finish=lambda r: r)
        with pytest.raises(RequestError, match="truncate to 4"):
            await span.truncate(slot, 4)
        await span.truncate(slot, 1)
        assert ex.calls[-1] == ("truncate", slot.seq_id, 1) and slot.pos == 1
        span.drain.start("moving")
        await span.release(slot.session_id)
        assert ex.calls[-1] == ("clear", slot.seq_id) and len(span.sessions) == 0
        assert await span.drain.wait_empty(lambda: len(span.sessions), 0.1)

    asyncio.run(main())


def test_a_refused_rollback_leaves_the_table_where_the_cache_is():
    async def main():
        span = _span(FakeExecutor(fail_truncate=True))
        slot = await span.admit(b"s" * 16, "client", 32, 0.0)
        await span.forward(slot, 0, np.zeros((3, 4), np.float32), all_logits=False, steps=(),
                           finish=lambda r: r)
        with pytest.raises(ExecutorError):
            await span.truncate(slot, 1)
        assert slot.pos == 3

    asyncio.run(main())


class HeadOnTruncatingCache(FakeExecutor):
    """A last span with an MTP head on a cache that truncates (deepseek2, glm-dsa): it cuts back as
    far as the head remembers (`SpanExecutor.truncate_depth`), not to any position."""

    can_truncate, truncate_depth = False, 128

    def export_seq(self, seq_id):
        self.calls.append(("export", seq_id))
        return b"state"


def test_a_head_on_a_truncating_cache_rolls_a_verify_pass_back_by_truncation_without_a_checkpoint():
    async def main():
        span = _span(HeadOnTruncatingCache())
        ex = span.executor
        slot = await span.admit(b"s" * 16, "client", 32, 0.0)
        await span.forward(slot, 0, np.zeros((3, 4), np.float32), all_logits=False, steps=(),
                           finish=lambda r: r)
        await span.forward(slot, 3, np.zeros((4, 4), np.float32), all_logits=False, steps=(1, 1, 1, 1),
                           finish=lambda r: r, verify=True)
        await span.truncate(slot, 5)  # two of the pass's rows kept
        assert [c[0] for c in ex.calls] == ["clear", "forward", "forward", "forward", "forward", "forward",
                                            "truncate"]
        assert ex.calls[-1] == ("truncate", slot.seq_id, 5) and slot.pos == 5

    asyncio.run(main())


def test_a_span_that_reads_token_ids_refuses_a_step_without_them_and_passes_them_on():
    async def main():
        ex = FakeExecutor()
        ex.needs_token_ids = True
        span = _span(ex)
        slot = await span.admit(b"s" * 16, "client", 32, 0.0)
        for ids in (None, np.zeros(0, np.int32)):  # absent: None in-process, empty from the wire
            with pytest.raises(RequestError, match=r"layers \[0, 4\) read token ids"):
                await span.forward(slot, 0, np.zeros((2, 4), np.float32), all_logits=False, steps=(),
                                   finish=lambda r: r, token_ids=ids)
        assert slot.pos == 0 and not [c for c in ex.calls if c[0] == "forward"]
        await span.forward(slot, 0, np.zeros((2, 4), np.float32), all_logits=False, steps=(),
                           finish=lambda r: r, token_ids=np.array([7, 9], np.int32))
        assert ex.token_ids == [7, 9] and slot.pos == 2
        # recorded steps (Forward.steps): each step gets its own rows' ids
        await span.forward(slot, 2, np.zeros((3, 4), np.float32), all_logits=False, steps=(1, 2),
                           finish=lambda r: r, token_ids=np.array([1, 2, 3], np.int32))
        assert ex.token_ids == [2, 3] and slot.pos == 5

    asyncio.run(main())


def test_a_span_that_reads_no_token_ids_ignores_an_absent_field():
    async def main():
        span = _span()
        slot = await span.admit(b"s" * 16, "client", 32, 0.0)
        await span.forward(slot, 0, np.zeros((1, 4), np.float32), all_logits=False, steps=(),
                           finish=lambda r: r, token_ids=np.zeros(0, np.int32))
        assert span.executor.token_ids is None and slot.pos == 1

    asyncio.run(main())


def test_restore_preconditions():
    async def main():
        span = _span()
        slot = await span.admit(b"s" * 16, "client", 32, 0.0)
        with pytest.raises(RequestError, match="not restorable"):
            await span.restore(slot, 64, b"h")  # no prefix service: nothing is held
        await span.forward(slot, 0, np.zeros((1, 4), np.float32), all_logits=False, steps=(),
                           finish=lambda r: r)
        with pytest.raises(RequestError, match="first step"):
            await span.restore(slot, 64, b"h")

    asyncio.run(main())


class FakeRestoringExecutor(FakeExecutor):
    """A fake executor that also imports a sequence's KV: the imported cells hold `kv` positions."""

    def __init__(self):
        super().__init__()
        self.held = {}

    def import_seq(self, seq_id, kv):
        self.calls.append(("import", seq_id))
        self.held[seq_id] = kv

    def truncate(self, seq_id, pos):
        super().truncate(seq_id, pos)
        self.held[seq_id] = min(self.held.get(seq_id, 0), pos)

    def clear(self, seq_id):
        super().clear(seq_id)
        self.held[seq_id] = 0

    def pos_max(self, seq_id):
        return self.held.get(seq_id, 0) - 1


class FakePrefixes:
    """A prefix service holding one snapshot of 64 tokens (fake: no store, no network)."""

    def snapshot_kv(self, snapshot_hash):
        return 64 if snapshot_hash == b"h" else None


def test_a_restored_first_step_that_is_refused_leaves_the_session_empty():
    async def main():
        ex = FakeRestoringExecutor()
        span = Span("ab" * 32, 0, 4, ex, SessionTable(2, 256, idle_timeout_s=600.0), prefixes=FakePrefixes(),
                    inline_max_ms=0.0, measure=lambda ex: Throughput(1.0, 2.0))
        slot = await span.admit(b"s" * 16, "client", 128, 0.0)
        # the restore itself works, then the step is refused for its width: nothing of the frame stays
        with pytest.raises(RequestError, match="hidden size 2"):
            await span.forward(slot, 64, np.zeros((1, 2), np.float32), all_logits=False, steps=(),
                               finish=lambda r: r, restore=(64, b"h"))
        assert slot.pos == 0 and ex.pos_max(slot.seq_id) == -1
        # so the client can send the frame again, rightly, and the session restores then
        await span.forward(slot, 64, np.zeros((1, 4), np.float32), all_logits=False, steps=(),
                           finish=lambda r: r, restore=(64, b"h"))
        assert slot.pos == 65 and ex.calls[-1] == ("forward", slot.seq_id, 64, 1)

    asyncio.run(main())


def test_swap_loads_the_old_span_back_when_the_new_one_fails(monkeypatch):
    monkeypatch.setattr(span_module, "exact_rows", lambda ex: ExactRows(batch_cap=3, verify_rows=2))

    async def main():
        span = _span()
        old = span.executor

        async def load_fails(start, end):
            if (start, end) != (0, 4):
                raise SwarmError("no bytes")
            return FakeExecutor("reloaded")

        with pytest.raises(SwarmError):
            await span.swap(4, 8, load_fails)
        assert old.closed and span.executor.name == "reloaded" and (span.start, span.end) == (0, 4)

        async def load(start, end):
            return FakeExecutor("new")

        await span.swap(4, 8, load)
        assert span.executor.name == "new" and (span.start, span.end) == (4, 8)
        assert span.scheduler.max_batch_rows == 3 and span.throughput == Throughput(1.0, 2.0)
        assert span.record("p").start == 4

    asyncio.run(main())


def test_record_announces_the_drain_unless_asked_not_to():
    span = _span()
    span.drain.start("moving")
    assert span.record("p").sessions_free == 0
    assert span.record("p", draining=False).sessions_free == 2


def test_then_gets_the_computed_rows_before_the_reply_is_made_and_the_session_advances():
    """`Span.forward(then=...)` (a push to the next hop) is awaited with the step's output rows as
    soon as they are computed: before `finish` builds the reply, and before the session's position
    moves."""
    async def main():
        span = _span()
        slot = await span.admit(b"s" * 16, "client", 32, 0.0)
        order = []

        async def then(rows):
            order.append(("then", rows.tolist(), slot.pos))

        def finish(r):
            order.append(("finish", slot.pos))
            return r.out

        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        await span.forward(slot, 0, x, all_logits=False, steps=(), finish=finish, then=then)
        assert order == [("then", (x + 1.0).tolist(), 0), ("finish", 0)] and slot.pos == 2

    asyncio.run(main())
