"""swarm.peer.scheduler's pure parts: which unit runs next, and the cost model."""

from __future__ import annotations

from swarm.peer.scheduler import CostModel, FairnessMeter, Pending, Turns, Unit, plan_next


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


# ---- fairness across clients --------------------------------------------------------------------


def step_of(client: str, seq: int, rows: int = 1) -> Pending:
    return Pending("step", seq, rows, False, client)


def test_a_full_batch_takes_one_step_per_client_before_a_second_of_any():
    # 32 sessions of a greedy client queued first, then one of another: FIFO would fill the batch
    # with the greedy client's steps and leave the other's out.
    pending = [step_of("greedy", s) for s in range(32)] + [step_of("other", 99)]
    unit = plan(pending, cap=4)
    assert unit.kind == "batch" and 32 in unit.jobs and len(unit.jobs) == 4


def test_a_batch_starts_with_the_client_served_least_recently():
    pending = [step_of("a", 0), step_of("a", 1), step_of("b", 2), step_of("b", 3)]
    unit = plan_next(pending, last_was_batch=False, max_batch_rows=1, chunk_tokens=64,
                     turns=Turns(batch={"a": 7, "b": 3}))
    assert unit == Unit("batch", (2,), 1)


def test_chunks_go_to_clients_in_turn_not_to_jobs_in_turn():
    # 4 prefills of a greedy client were queued before one of another client; the greedy client was
    # served last: the other client's prefill goes next, not after the greedy client's 4.
    pending = [step_of("greedy", s, 300) for s in range(4)] + [step_of("other", 9, 300)]
    unit = plan_next(pending, last_was_batch=True, max_batch_rows=8, chunk_tokens=64,
                     turns=Turns(other={"greedy": 5, "other": 2}))
    assert unit == Unit("chunk", (4,), 64)


def test_within_a_client_jobs_keep_their_queue_order():
    pending = [step_of("a", 1, 300), step_of("a", 2, 300)]
    assert plan(pending, last_was_batch=True) == Unit("chunk", (0,), 64)


def test_a_client_never_served_goes_before_one_served_already():
    pending = [CALL, step_of("new", 3, 100)]
    unit = plan_next(pending, last_was_batch=True, max_batch_rows=8, chunk_tokens=64, turns=Turns(other={"": 1}))
    assert unit == Unit("chunk", (1,), 64)


def test_fairness_meter_counts_the_longest_run_a_waiting_client_went_unserved():
    m = FairnessMeter()
    m.observe({"a", "b"}, {"a"})
    m.observe({"a", "b"}, {"a"})
    m.observe({"a", "b"}, {"b"})  # b's wait ends at 2
    m.observe({"a"}, {"a"})
    assert m.max_wait_units == 2


def test_round_robin_keeps_every_clients_wait_bounded_however_many_jobs_one_queues():
    # Simulate the scheduler's loop on the pure planner: a greedy client with 12 prefills and 12
    # decoding sessions, a modest one with one prefill then decode steps; each job re-queues as the
    # real scheduler does (a chunked step to the back, a decode step's next step after it ran).
    queue = ([step_of("greedy", s, 640) for s in range(12)] + [step_of("greedy", 100 + s) for s in range(12)]
             + [step_of("modest", 50, 640)])
    last_batch: dict[str, int] = {}
    last_other: dict[str, int] = {}
    meter, last_was_batch = FairnessMeter(), False
    modest_units = 0
    for n in range(1, 400):
        unit = plan_next(queue, last_was_batch=last_was_batch, max_batch_rows=4, chunk_tokens=64,
                         turns=Turns(last_batch, last_other))
        chosen = [queue[i] for i in unit.jobs]
        queued = {p.client for p in queue}
        served = {p.client for p in chosen}
        meter.observe(queued, served)
        for c in served:
            (last_batch if unit.kind == "batch" else last_other)[c] = n
        modest_units += "modest" in served
        last_was_batch = unit.kind == "batch"
        queue = [p for i, p in enumerate(queue) if i not in unit.jobs]
        for p in chosen:  # decode steps come back; a prefill chunk's rest goes to the back
            left = p.rows_left - (unit.rows if unit.kind == "chunk" else 1)
            queue.append(p if p.is_decode else Pending("step", p.seq_id, left, True, p.client) if left
                         else Pending("step", p.seq_id, 1, False, p.client))
    assert meter.max_wait_units <= 2 * 2 - 1
    assert modest_units >= 399 // 2  # in every batch, and every other chunk
