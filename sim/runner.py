"""Composition root of a swarm simulation: one world, its client sites, one clock, one report.

`SwarmSim` wires the parts on the running virtual-time loop (`sim.vloop`): the `World` of peers,
the `ClientSite`s, one `random.Random` seeded by the scenario, and the `Metrics`. `run(scenario)`
plays the scenario's timeline (see `sim.scenarios`) and returns the report; tests drive a
`SwarmSim` step by step instead (grow, then script faults around one generation).

Wall time of the real planners is measured while a run is in progress: `plan_route` as the route
session calls it and `rebalance` as the rebalancer calls it (wrapped with a stopwatch for the
duration of `run` and restored after), `choose_span` where the world calls it; and at the end,
`plan_route` alone over the final announcements (`time_planner`).

This module does not: define behaviour; every rule lives in the modules it wires.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Callable
from dataclasses import replace

import swarm.client.session
import swarm.peer.rebalance
from sim import vloop
from sim.clients import arrivals, generate, make_sites
from sim.compute import VOCAB
from sim.metrics import GenerationRecord, Metrics, SwarmReport
from sim.scenarios import Scenario
from sim.world import World
from swarm.errors import NoRoute
from swarm.route.plan import plan_route

PLANNER_SAMPLES = 50
"""plan_route calls timed over the final announcements at the end of a run."""


class SwarmSim:
    """One scenario's world, clients and metrics; construct inside the virtual-time loop.

    Attributes:
        scenario, rng, metrics, world, sites: the parts.
    """

    def __init__(self, scenario: Scenario):
        self.scenario = sc = scenario
        self.rng = random.Random(sc.seed)
        self.metrics = Metrics(sc.model.n_layers)
        t0 = sc.grow_s + sc.settle_s
        self.metrics.window(t0, t0 + sc.churn_s)
        self.world = World(sc.model, sc.mix, sc.members, self.rng, self.metrics)
        self.sites = make_sites(
            sc.load.sites,
            self.rng,
            self.world.board,
            self.world.peers,
            sc.members.dht_read_s,
            sc.load.policy,
        )

    async def grow(self) -> None:
        """The scenario's joins into an empty swarm, then its quiet settling time."""
        sc = self.scenario
        await self.world.grow(sc.members.n_peers, sc.grow_s)
        await asyncio.sleep(sc.grow_s + sc.settle_s - asyncio.get_running_loop().time())

    async def churn(self) -> None:
        """The measured window: churn and client arrivals together, until both are done."""
        sc, now = self.scenario, asyncio.get_running_loop().time()
        end = now + sc.churn_s
        await asyncio.gather(
            self.world.churn(end),
            arrivals(self.sites, sc.load, sc.model.n_layers, end - sc.tail_s, self.rng, self.metrics),
        )

    async def generate(self, site: int = 0, on_token=None) -> GenerationRecord:
        """One generation from site `site` with a random prompt (see `sim.clients.generate`)."""
        sc = self.scenario
        prompt = [self.rng.randrange(VOCAB) for _ in range(sc.load.prompt_tokens)]
        return await generate(
            self.sites[site],
            prompt,
            sc.load.new_tokens,
            sc.model.n_layers,
            sc.load.policy,
            random.Random(self.rng.getrandbits(64)),
            on_token,
            push=sc.load.push,
        )

    def time_planner(self, n: int) -> None:
        """Time `plan_route` over the final announcements, from `n` sites' true RTTs, outside the
        event loop's churn (after a full collection, so the simulation's own heap does not pause
        it): recorded as `plan_route_final`. The in-run `plan_route` figures include such pauses."""
        view, sc = self.world.board.snapshot(), self.scenario
        need = sc.load.prompt_tokens + sc.load.new_tokens
        timed = self.metrics.stopwatch.timed("plan_route_final", plan_route)
        gc.collect()
        for i in range(n):
            site = self.sites[i % len(self.sites)]
            spans = [replace(r, rtt_ms=1000.0 * site.rtt_s(self.world.peers[r.peer_id])) for r in view]
            try:
                timed(spans, sc.model.n_layers, need)
            except NoRoute:  # timed all the same: a small swarm may have none at the end
                pass

    def finish(self) -> SwarmReport:
        """Stop every peer and close the metrics; the report."""
        self.world.stop()
        self.metrics.finish(asyncio.get_running_loop().time())
        return self.metrics.report(self.scenario.name)


def run(scenario: Scenario, progress: Callable[[float, SwarmSim], None] | None = None) -> SwarmReport:
    """Play `scenario` (grow, settle, churn with clients) and return its report (wall time set).

    Args:
        scenario: what to play.
        progress: called every virtual minute with (virtual seconds, the simulation).
    """

    async def main() -> SwarmReport:
        sim = SwarmSim(scenario)
        watch = sim.metrics.stopwatch
        ticker = asyncio.get_running_loop().create_task(_tick(sim, progress)) if progress else None
        with (
            watch.patched(swarm.client.session, "plan_route"),
            watch.patched(swarm.peer.rebalance, "rebalance"),
        ):
            await sim.grow()
            await sim.churn()
        sim.time_planner(PLANNER_SAMPLES)
        if ticker is not None:
            ticker.cancel()
        return sim.finish()

    t0 = time.perf_counter()
    report = vloop.run(main())
    report.wall_s = time.perf_counter() - t0
    return report


async def _tick(sim: SwarmSim, progress: Callable[[float, SwarmSim], None]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(60.0)
        progress(loop.time(), sim)
