"""sim/failover.py: one client's route session through peers with scripted faults, on a virtual clock."""

from sim import failover


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
