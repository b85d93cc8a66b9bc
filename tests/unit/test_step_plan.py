"""swarm.peer.step_plan: which unit runs next, whether to hold it back, and the cost model."""

from __future__ import annotations

import pytest

from swarm.peer.step_plan import (
    BUSY_SESSION_S, HEAVY_MARGIN_MS, PREEMPT_MAX, PREEMPT_MIN_LEFT_MS, SESSION_WEIGHT_MAX, ClientUsage,
    CostModel, Due, FairnessMeter, Pending, Unit, heavier, hold_ms, plan_next, preempts,
)


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


def test_a_batch_starts_with_the_least_used_client():
    pending = [step_of("a", 0), step_of("a", 1), step_of("b", 2), step_of("b", 3)]
    unit = plan_next(pending, last_was_batch=False, max_batch_rows=1, chunk_tokens=64,
                     usage={"a": 70.0, "b": 30.0})
    assert unit == Unit("batch", (2,), 1)


def test_chunks_go_to_the_least_used_client_not_to_jobs_in_turn():
    # 4 prefills of a greedy client were queued before one of another client that has used less:
    # the other client's prefill goes next, not after the greedy client's 4.
    pending = [step_of("greedy", s, 300) for s in range(4)] + [step_of("other", 9, 300)]
    unit = plan_next(pending, last_was_batch=True, max_batch_rows=8, chunk_tokens=64,
                     usage={"greedy": 900.0, "other": 200.0})
    assert unit == Unit("chunk", (4,), 64)


def test_within_a_client_jobs_keep_their_queue_order():
    pending = [step_of("a", 1, 300), step_of("a", 2, 300)]
    assert plan(pending, last_was_batch=True) == Unit("chunk", (0,), 64)


def test_a_client_never_served_goes_before_one_served_already():
    pending = [CALL, step_of("new", 3, 100)]
    unit = plan_next(pending, last_was_batch=True, max_batch_rows=8, chunk_tokens=64, usage={"": 1.0})
    assert unit == Unit("chunk", (1,), 64)


def test_a_light_clients_decode_goes_before_a_heavy_clients_chunk_even_right_after_a_batch():
    # Counting turns ran a greedy client's 250 ms chunk after every one of a modest client's steps.
    pending = [step_of("greedy", 0, 256), step_of("modest", 1)]
    unit = plan_next(pending, last_was_batch=True, max_batch_rows=8, chunk_tokens=64,
                     usage={"greedy": 8000.0, "modest": 300.0})
    assert unit == Unit("batch", (1,), 1)


def costly(rows: int) -> float:
    """A one-thread CPU peer: each batch row costs nearly a whole step (ms)."""
    return 14.0 * (1 + 0.6 * (rows - 1))


def test_a_heavy_clients_rows_stay_out_of_a_batch_that_they_would_make_costly():
    pending = [step_of("greedy", s) for s in range(4)] + [step_of("modest", 9)]
    usage = {"greedy": 8000.0, "modest": 300.0}
    unit = plan_next(pending, last_was_batch=False, max_batch_rows=8, chunk_tokens=64, usage=usage,
                     batch_ms=costly)
    assert unit == Unit("batch", (4,), 1)


def test_a_heavy_clients_rows_ride_along_where_they_cost_little_or_are_unmeasured():
    pending = [step_of("greedy", s) for s in range(4)] + [step_of("modest", 9)]
    usage = {"greedy": 8000.0, "modest": 300.0}
    for batch_ms in (lambda rows: 14.0 + 0.1 * rows, lambda rows: None):
        unit = plan_next(pending, last_was_batch=False, max_batch_rows=8, chunk_tokens=64, usage=usage,
                         batch_ms=batch_ms)
        assert unit == Unit("batch", (0, 1, 2, 3, 4), 5)


def test_clients_of_similar_usage_batch_together_whatever_it_costs():
    pending = [step_of("a", 0), step_of("b", 1), step_of("c", 2)]
    unit = plan_next(pending, last_was_batch=False, max_batch_rows=8, chunk_tokens=64,
                     usage={"a": 900.0, "b": 1200.0, "c": 1500.0}, batch_ms=costly)
    assert unit == Unit("batch", (0, 1, 2), 3)


def test_heavier_needs_a_clear_margin():
    assert heavier(8000.0, 300.0) and heavier(HEAVY_MARGIN_MS + 1.0, 0.0)
    assert not heavier(1500.0, 900.0) and not heavier(HEAVY_MARGIN_MS, 0.0)


def test_client_usage_halves_every_half_life_and_forgets_the_least_recently_charged():
    u = ClientUsage(half_life_s=10.0, max_clients=2)
    u.charge("a", 1000.0, now=0.0)
    assert u.value("a", 10.0) == pytest.approx(500.0)
    u.charge("a", 500.0, now=10.0)
    assert u.value("a", 20.0) == pytest.approx(500.0)
    u.charge("b", 1.0, now=20.0)
    u.charge("c", 1.0, now=20.0)
    assert u.value("a", 20.0) == 0.0 and u.snapshot({"b", "c"}, 20.0) == {"b": 1.0, "c": 1.0}


# ---- holding a unit back for a lighter client's due step ----------------------------------------

CHUNK = Unit("chunk", (0,), 64)
GREEDY_BATCH = Unit("batch", (0, 1, 2, 3), 4)
USAGE = {"greedy": 8000.0, "modest": 300.0, "peer": 7000.0}


def test_a_heavy_clients_chunk_waits_for_a_light_clients_due_step():
    # modest answered 1 ms ago and comes back ~3 ms after an answer: hold the 250 ms chunk 5 ms.
    assert hold_ms(CHUNK, {"greedy"}, 250.0, [Due("modest", 3.0, 1.0)], USAGE) == pytest.approx(5.0)


def test_a_heavy_clients_batch_waits_too():
    assert hold_ms(GREEDY_BATCH, {"greedy"}, 40.0, [Due("modest", 3.0, 0.0)], USAGE) == pytest.approx(6.0)


def test_nothing_is_held_for_a_heavier_client_or_for_one_the_unit_serves():
    assert hold_ms(CHUNK, {"modest"}, 250.0, [Due("greedy", 3.0, 0.0)], USAGE) == 0.0
    assert hold_ms(CHUNK, {"greedy"}, 250.0, [Due("greedy", 3.0, 0.0)], USAGE) == 0.0
    assert hold_ms(GREEDY_BATCH, {"greedy", "modest"}, 40.0, [Due("modest", 3.0, 0.0)], USAGE) == 0.0


def test_a_batch_is_held_for_a_slightly_lighter_client_so_the_two_merge():
    # similar usage (7000 vs 8000): two batches in turn would cost each client both
    assert hold_ms(GREEDY_BATCH, {"greedy"}, 40.0, [Due("peer", 3.0, 0.0)], USAGE) == pytest.approx(6.0)


def test_nothing_is_held_when_it_saves_nothing_or_the_step_is_overdue_or_the_cost_unknown():
    assert hold_ms(CHUNK, {"greedy"}, 250.0, [Due("modest", 300.0, 0.0)], USAGE) == 0.0  # gap > unit
    assert hold_ms(CHUNK, {"greedy"}, 250.0, [Due("modest", 3.0, 6.5)], USAGE) == 0.0  # overdue
    assert hold_ms(CHUNK, {"greedy"}, None, [Due("modest", 3.0, 0.0)], USAGE) == 0.0
    assert hold_ms(CHUNK, {"greedy"}, 250.0, [], USAGE) == 0.0


def test_a_unit_that_would_end_before_the_light_client_is_due_runs_but_a_later_one_is_held():
    # gap 30 ms: a 20 ms batch right after the answer ends before the client is back; 20 ms later
    # the next one would not, and waits (at most as long as itself).
    assert hold_ms(GREEDY_BATCH, {"greedy"}, 20.0, [Due("modest", 30.0, 0.0)], USAGE) == 0.0
    assert hold_ms(GREEDY_BATCH, {"greedy"}, 20.0, [Due("modest", 30.0, 20.0)], USAGE) == 20.0
    assert hold_ms(GREEDY_BATCH, {"greedy"}, 20.0, [Due("modest", 30.0, 50.0)], USAGE) == pytest.approx(10.0)


def test_a_hold_never_outlasts_the_unit_it_holds():
    assert hold_ms(CHUNK, {"greedy"}, 7.0, [Due("modest", 5.0, 0.0)], USAGE) == 7.0


def test_fairness_meter_counts_the_longest_run_a_waiting_client_went_unserved():
    m = FairnessMeter()
    m.observe({"a", "b"}, {"a"})
    m.observe({"a", "b"}, {"a"})
    m.observe({"a", "b"}, {"b"})  # b's wait ends at 2
    m.observe({"a"}, {"a"})
    assert m.max_wait_units == 2


def simulate(queue: list[Pending], seconds: float) -> tuple[dict[str, int], dict[str, float]]:
    """The scheduler's loop on the pure planner with charged usage and `costly` batches, 250 ms
    chunks: each job re-queues as the real scheduler does (a chunked step to the back, a decode
    step's next step right after it ran). Returns decode steps and compute ms served per client."""
    usage, now, last_was_batch = ClientUsage(), 0.0, False
    steps: dict[str, int] = {}
    served: dict[str, float] = {}
    clients = {p.client for p in queue}
    while now < seconds:
        unit = plan_next(queue, last_was_batch=last_was_batch, max_batch_rows=4, chunk_tokens=64,
                         usage=usage.snapshot(clients, now), batch_ms=costly)
        chosen = [queue[i] for i in unit.jobs]
        ms = costly(unit.rows) if unit.kind == "batch" else 250.0
        now += ms / 1000.0
        for p in chosen:
            usage.charge(p.client, ms / len(chosen), now, p.seq_id)
            served[p.client] = served.get(p.client, 0.0) + ms / len(chosen)
            steps[p.client] = steps.get(p.client, 0) + (unit.kind == "batch")
        last_was_batch = unit.kind == "batch"
        queue = [p for i, p in enumerate(queue) if i not in unit.jobs]
        for p in chosen:
            left = p.rows_left - (unit.rows if unit.kind == "chunk" else 1)
            queue.append(p if p.is_decode else Pending("step", p.seq_id, left, True, p.client) if left
                         else Pending("step", p.seq_id, 1, False, p.client))
    return steps, served


def test_a_client_with_many_sessions_does_not_starve_one_with_a_single_session():
    # A greedy client with 12 prefills and 12 decoding sessions, a modest one with one prefill then
    # decode steps, all backlogged for a simulated minute. Counting turns (one step of the modest
    # client per 250 ms chunk of the greedy one) gave the modest client 1/20 of its solo decode rate.
    greedy = [step_of("greedy", s, 640) for s in range(12)] + [step_of("greedy", 100 + s) for s in range(12)]
    modest = [step_of("modest", 50, 640)]
    solo, _ = simulate(list(modest), 60.0)
    shared, served = simulate(greedy + modest, 60.0)
    assert shared["modest"] > solo["modest"] / 3, (shared, solo)
    # Ranked behind (its sessions multiply its usage, at most SESSION_WEIGHT_MAX), the greedy
    # client still gets a fifth of the peer: work-conserving, never starved.
    assert served["greedy"] > (served["greedy"] + served["modest"]) / 6, served


def test_a_newcomer_next_to_a_client_keeping_4_sessions_busy_gets_most_of_the_peer():
    # Issue 24: as equals in usage, the newcomer's steps rode in 4-row batches costing 2.8 of its
    # solo steps; ranked by usage times busy sessions it decodes at about 4/5 of its solo rate.
    greedy = [step_of("greedy", s) for s in range(4)]
    modest = [step_of("modest", 50)]
    solo, _ = simulate(list(modest), 30.0)
    shared, served = simulate(greedy + modest, 30.0)
    assert shared["modest"] > 0.6 * solo["modest"], (shared, solo)
    assert served["greedy"] > 0.1 * (served["greedy"] + served["modest"]), served


def test_a_client_ranks_by_its_usage_times_its_busy_sessions():
    u = ClientUsage(half_life_s=1e9)
    for seq in range(6):
        u.charge("greedy", 100.0, now=0.0, seq_id=seq)
    u.charge("modest", 1000.0, now=0.0, seq_id=0)
    u.charge("modest", 1000.0, now=0.5, seq_id=0)
    assert u.busy_sessions("greedy", 1.0) == 6 and u.busy_sessions("modest", 1.0) == 1
    assert u.snapshot({"greedy", "modest"}, 1.0) == {"greedy": pytest.approx(600.0 * SESSION_WEIGHT_MAX),
                                                      "modest": pytest.approx(2000.0)}
    # Sessions not charged for BUSY_SESSION_S no longer count; calls (seq -1) never do.
    u.charge("greedy", 0.0, now=BUSY_SESSION_S + 0.1, seq_id=-1)
    assert u.busy_sessions("greedy", BUSY_SESSION_S + 0.1) == 0
    assert u.priority("greedy", BUSY_SESSION_S + 0.1) == pytest.approx(600.0)


CHUNK = Unit("chunk", (0,), 64)
HOG = {"greedy": 5000.0, "modest": 300.0}


def stops(unit, unit_clients, client, usage, stopped=0, left_ms=300.0, elapsed_ms=10.0) -> bool:
    return preempts(unit, unit_clients, client, usage, stopped, left_ms, elapsed_ms)


def test_a_light_clients_work_stops_a_heavy_clients_chunk():
    assert stops(CHUNK, {"greedy"}, "modest", HOG)
    assert stops(CHUNK, {"greedy"}, "newcomer", HOG, stopped=0, left_ms=None)  # cost not measured yet


def test_only_a_chunk_of_clearly_heavier_clients_is_stopped():
    assert not stops(Unit("batch", (0, 1), 2), {"greedy"}, "modest", HOG)
    assert not stops(Unit("call", (0,), 0), {"greedy"}, "modest", HOG)
    assert not stops(CHUNK, {"greedy"}, "greedy", HOG)  # its own next step
    assert not stops(CHUNK, {"greedy"}, "", HOG)  # the peer's own work
    # Two clients sharing the peer evenly, or one just ahead of the other, never stop each other.
    even = {"a": 1000.0, "b": 1010.0 * 1.5 + HEAVY_MARGIN_MS}
    assert not stops(CHUNK, {"b"}, "a", even)
    assert stops(CHUNK, {"b"}, "a", {**even, "b": even["b"] + 1.0})


def test_a_chunk_is_not_stopped_when_the_charge_for_it_would_rank_the_stopper_behind_it():
    """The stopper is charged the chunk's elapsed compute: a late stop that would leave it heavier
    than the chunk's client would make the chunk rerun whole first, so it is not made."""
    usage = {"greedy": 520.0, "newcomer": 0.0}
    assert stops(CHUNK, {"greedy"}, "newcomer", usage, stopped=0, left_ms=None)
    assert not stops(CHUNK, {"greedy"}, "newcomer", usage, stopped=0, left_ms=None, elapsed_ms=600.0)
    hog = {"greedy": 20_000.0, "newcomer": 0.0}
    assert stops(CHUNK, {"greedy"}, "newcomer", hog, stopped=0, left_ms=200.0, elapsed_ms=600.0)


def test_a_chunk_is_stopped_at_most_preempt_max_times_and_never_just_before_it_ends():
    assert stops(CHUNK, {"greedy"}, "modest", HOG, stopped=PREEMPT_MAX - 1, left_ms=300.0)
    assert not stops(CHUNK, {"greedy"}, "modest", HOG, stopped=PREEMPT_MAX, left_ms=300.0)
    assert not stops(CHUNK, {"greedy"}, "modest", HOG, stopped=0, left_ms=PREEMPT_MIN_LEFT_MS - 1.0)
    assert not stops(CHUNK, {"greedy"}, "modest", HOG, stopped=0, left_ms=-50.0)  # overran its estimate
