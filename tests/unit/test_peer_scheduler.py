"""swarm.peer.scheduler's pure parts: which unit runs next, and the cost model."""

from __future__ import annotations

from swarm.peer.scheduler import CostModel, Pending, Unit, plan_next


def decode(seq: int) -> Pending:
    return Pending("step", seq, 1)


def prefill(seq: int, rows: int, started: bool = False) -> Pending:
    return Pending("step", seq, rows, started)


CALL = Pending("call")


def plan(pending, last_was_batch=False, cap=8, chunk=64):
    return plan_next(pending, last_was_batch=last_was_batch, max_batch_rows=cap, chunk_tokens=chunk)


def test_nothing_waiting_is_no_unit():
    assert plan([]) is None


def test_a_lone_decode_step_runs_at_once_as_a_batch_of_one():
    assert plan([decode(3)]) == Unit("batch", (0,), 1)


def test_waiting_decode_steps_of_all_sessions_form_one_batch_in_arrival_order():
    assert plan([decode(5), decode(1), decode(7)]) == Unit("batch", (0, 1, 2), 3)


def test_a_batch_stops_at_the_row_cap():
    assert plan([decode(s) for s in range(6)], cap=3) == Unit("batch", (0, 1, 2), 3)


def test_a_sequence_appears_once_per_batch():
    assert plan([decode(2), decode(2), decode(4)]) == Unit("batch", (0, 2), 2)


def test_decode_steps_go_before_a_prefill_queued_ahead_of_them():
    assert plan([prefill(0, 300), decode(1), decode(2)]) == Unit("batch", (1, 2), 2)


def test_after_a_batch_the_waiting_prefill_gets_one_chunk():
    pending = [prefill(0, 300), decode(1)]
    assert plan(pending, last_was_batch=True) == Unit("chunk", (0,), 64)


def test_the_last_chunk_takes_only_the_rows_left():
    assert plan([prefill(0, 20, started=True)], last_was_batch=True) == Unit("chunk", (0,), 20)


def test_a_multi_row_step_is_never_batched():
    # Two rows of one sequence would change the rows' ubatch grouping: they run as a chunk.
    assert plan([prefill(0, 2)]) == Unit("chunk", (0,), 2)


def test_the_rest_of_a_started_prefill_is_not_a_decode_step():
    assert plan([prefill(0, 1, started=True), decode(1)], last_was_batch=True) == Unit("chunk", (0,), 1)


def test_calls_run_alone_in_arrival_order_among_other_work():
    assert plan([CALL, prefill(0, 100)], last_was_batch=True) == Unit("call", (0,), 0)
    assert plan([prefill(0, 100), CALL], last_was_batch=True) == Unit("chunk", (0,), 64)


def test_decodes_and_prefill_chunks_alternate():
    # A decoder that always has a step waiting neither starves the prefill nor waits behind all of it.
    kinds, last = [], False
    for _ in range(6):
        unit = plan([prefill(0, 640), decode(1)], last_was_batch=last)
        kinds.append(unit.kind)
        last = unit.kind == "batch"
    assert kinds == ["batch", "chunk", "batch", "chunk", "batch", "chunk"]


def test_cost_model_keeps_a_moving_average_per_kind_and_row_bucket():
    cm = CostModel(weight=0.5)
    key1, key8 = CostModel.key("batch", 1), CostModel.key("batch", 8)
    assert key1 != key8 and CostModel.key("batch", 12) == key8
    assert cm.expected_ms(key1) is None
    cm.observe(key1, 4.0)
    assert cm.expected_ms(key1) == 4.0
    cm.observe(key1, 2.0)
    assert cm.expected_ms(key1) == 3.0
    assert cm.expected_ms(key8) is None
