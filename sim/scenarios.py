"""Named simulation scenarios, and a large single-model snapshot for timing the planner."""

from __future__ import annotations

import random

from sim.swarm_sim import Scenario
from swarm.route.plan import PeerSpan

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        # 1,000 peers, 3 spans x 3 peers per model (111 models); 30% die at step 5 and their
        # records linger 3 steps.
        Scenario(
            name="churn_1000",
            n_peers=1000,
            kill_fraction=0.3,
            kill_step=5,
            record_ttl_steps=3,
            steps=15,
            requests_per_step=200,
            seed=1,
        ),
        # Few peers, long sessions, heavy load: slots run out and stale snapshots meet Busy.
        Scenario(
            name="saturation_90",
            n_peers=90,
            sessions_per_peer=2,
            session_steps=6,
            steps=12,
            requests_per_step=40,
            seed=2,
        ),
        # 10,000 peers, 5 peers per span, 20% die.
        Scenario(
            name="churn_10000",
            n_peers=10_000,
            redundancy=5,
            kill_fraction=0.2,
            kill_step=3,
            steps=8,
            requests_per_step=300,
            seed=3,
        ),
    )
}


def big_snapshot(n_peers: int, n_layers: int, rng: random.Random) -> list[PeerSpan]:
    """`n_peers` spans of one model on a 4-layer grid, 1-4 grid cells long, random speeds and RTTs."""
    spans = []
    for i in range(n_peers):
        start = 4 * rng.randrange(n_layers // 4)
        end = min(n_layers, start + 4 * rng.randint(1, 4))
        spans.append(
            PeerSpan(
                f"p{i}",
                start,
                end,
                rng.uniform(20, 400),
                rng.uniform(100, 3000),
                rng.randrange(0, 65536),
                rng.randrange(0, 16),
                rng.uniform(1, 150),
            )
        )
    return spans
