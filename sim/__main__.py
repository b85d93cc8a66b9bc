"""`python -m sim [NAME ...]`: list the named scenarios, or run them and print one JSON line each."""

import json
import sys
import time

from sim import failover
from sim.runner import run
from sim.scenarios import SCENARIOS

FAILOVER = failover.FailoverScenario(name="failover_100", generations=100, fault_rate=0.8, seed=1)


def main(argv: list[str]) -> int:
    """Run the scenarios named in argv (none: list them); returns the exit status."""
    known = sorted([*SCENARIOS, FAILOVER.name])
    if not argv:
        for name in known:
            sc = SCENARIOS.get(name)
            what = (
                f"{sc.members.n_peers} peers, {sc.model.name}, {sc.members.churn_per_min:.0%} churn a minute"
                if sc
                else "one client through 9 span peers with scripted faults"
            )
            print(f"{name:14} {what}")
        return 0
    unknown = [n for n in argv if n not in known]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {known}", file=sys.stderr)
        return 2
    for name in argv:
        t0 = time.perf_counter()
        summary = (
            failover.run(FAILOVER).summary() if name == FAILOVER.name else run(SCENARIOS[name]).summary()
        )
        summary["wall_s"] = round(time.perf_counter() - t0, 3)
        print(json.dumps({"scenario": name, **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
