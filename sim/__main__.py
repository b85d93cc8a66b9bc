"""`python -m sim [NAME ...]`: run named scenarios (default: all), print one JSON line each."""

import json
import sys
import time

from sim import failover
from sim.scenarios import SCENARIOS
from sim.swarm_sim import run

FAILOVER = failover.FailoverScenario(name="failover_100", generations=100, fault_rate=0.8, seed=1)


def main(argv: list[str]) -> int:
    """Run the scenarios named in argv (all when empty); returns the exit status."""
    known = sorted([*SCENARIOS, FAILOVER.name])
    names = argv or known
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {known}", file=sys.stderr)
        return 2
    for name in names:
        t0 = time.perf_counter()
        summary = (
            failover.run(FAILOVER).summary() if name == FAILOVER.name else run(SCENARIOS[name]).summary()
        )
        summary["wall_s"] = round(time.perf_counter() - t0, 3)
        print(json.dumps({"scenario": name, **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
