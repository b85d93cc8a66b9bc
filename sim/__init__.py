"""Local swarm simulator: many peers with faults, driving the pure planners.

Files:
    swarm_sim.py: `Scenario`, `run(scenario) -> SimReport` — peers with spans, speeds, RTTs and
        real `SessionTable`s; deaths, record expiry and capacity exhaustion; clients that plan with
        `swarm.route.plan` and fail over.
    scenarios.py: named scenarios (`SCENARIOS`) and `big_snapshot` for planner timing.
    __main__.py: `python -m sim [NAME ...]` prints one JSON line per scenario (with wall time).

Imports only swarm.route, swarm.kv and swarm.errors — never swarm.dht, hivemind, libtorrent or llama.cpp.
"""
