"""Local swarm simulator: many peers with faults, driving the pure planners.

Files:
    swarm_sim.py: `Scenario`, `run(scenario) -> SimReport` — peers with spans, speeds, RTTs and
        real `SessionTable`s; deaths, record expiry and capacity exhaustion; clients that plan with
        `swarm.route.plan` and fail over.
    scenarios.py: named scenarios (`SCENARIOS`) and `big_snapshot` for planner timing.
    transport.py: simulated span peers (history-dependent stand-in blocks, scripted faults) behind
        the client's `RouteSession` transport and directory, on a virtual clock.
    failover.py: `FailoverScenario`, `run` — generations through faulty peers on the client's own
        route session, each checked against a fault-free run; leaks counted.
    __main__.py: `python -m sim [NAME ...]` prints one JSON line per scenario (with wall time).

Imports only swarm.route, swarm.kv, swarm.wire, swarm.errors and swarm.client.session (no I/O) —
never swarm.dht, hivemind, libtorrent or llama.cpp.
"""
