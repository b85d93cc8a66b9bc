"""sim/: properties of routing under churn and saturation, using the real planners and session tables."""

import dataclasses
import random
import time

from sim import failover
from sim.scenarios import SCENARIOS, big_snapshot
from sim.swarm_sim import Scenario, run
from swarm.errors import NoRoute
from swarm.route.plan import plan_route


def test_no_faults_every_request_routes_first_try():
    rep = run(
        Scenario(
            name="calm",
            n_peers=90,
            steps=5,
            requests_per_step=20,
            sessions_per_peer=64,
            session_tokens=512,
            seed=5,
        )
    )
    assert rep.requests == 100 and rep.routed == 100
    assert set(rep.attempts) == {1}
    assert set(rep.hops) == {3}
    assert rep.dead_hop_retries == rep.busy_retries == 0


def test_churn_1000_peers_30_percent_killed():
    sc = SCENARIOS["churn_1000"]
    rep = run(sc)
    s = rep.summary()
    print("\nchurn_1000", s)
    assert rep.routes_through_dead_peers == 0
    assert rep.feasible > 0.8 * rep.requests
    assert s["feasible_routed_rate"] >= 0.99
    # clients met dead peers only while their records had not expired
    assert rep.dead_hop_steps and min(rep.dead_hop_steps) >= sc.kill_step
    assert max(rep.dead_hop_steps) < sc.kill_step + sc.record_ttl_steps


def test_records_that_expire_at_once_mean_no_dead_hops():
    sc = dataclasses.replace(SCENARIOS["churn_1000"], record_ttl_steps=0)
    rep = run(sc)
    assert rep.dead_hop_retries == 0 and rep.routes_through_dead_peers == 0
    assert rep.feasible_routed == rep.feasible


def test_saturation_fails_cleanly_and_never_over_admits():
    sc = SCENARIOS["saturation_90"]
    rep = run(sc)
    print("\nsaturation_90", rep.summary())
    assert rep.busy_retries > 0 and rep.no_route > 0  # load exceeded capacity
    assert 0 < rep.routed < rep.requests
    # 30 peers per span x 2 slots, sessions last 6 steps: at most 60 sessions open per 6 steps
    assert rep.routed <= 60 * -(-sc.steps // sc.session_steps)
    assert rep.feasible_routed == rep.feasible


def test_runs_are_deterministic_per_seed():
    sc = dataclasses.replace(SCENARIOS["churn_1000"], steps=8)
    a, b = run(sc), run(sc)
    assert a.total_ms == b.total_ms and a.attempts == b.attempts
    c = run(dataclasses.replace(sc, seed=sc.seed + 1))
    assert c.total_ms != a.total_ms


def test_plan_time_for_10000_peers_is_printed():
    rng = random.Random(0)
    snap = big_snapshot(10_000, 80, rng)
    t0 = time.perf_counter()
    n = 0
    for need in (512, 4096, 16384, 65536):
        try:
            plan = plan_route(snap, 80, need)
            assert plan.hops[0].start == 0 and plan.hops[-1].end == 80
            n += 1
        except NoRoute:
            pass
    ms = (time.perf_counter() - t0) / 4 * 1000
    print(f"\nplan_route over 10,000 spans, 80 layers: {ms:.1f} ms per plan ({n}/4 routed)")
    assert n >= 1


def test_failover_by_replay_keeps_every_generation_exact_and_leaks_nothing():
    rep = failover.run(failover.FailoverScenario(name="faults", generations=30, fault_rate=0.9, seed=4))
    s = rep.summary()
    assert rep.generations == 30 and rep.faults >= 20
    assert rep.failed == 0 and rep.exact == 30  # every one equals its fault-free run
    assert rep.failovers >= 10 and set(s["reasons"]) == {
        "malformed",
        "shutting_down",
        "timeout",
        "unreachable",
    }
    assert rep.leaked_sessions == 0
