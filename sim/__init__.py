"""Local swarm simulator: one swarm of up to 10,000 peers in virtual time, driving the real policies.

Files:
    vloop.py: `VirtualTimeLoop`, `run(coro)` — an asyncio loop whose clock jumps to the next timer,
        so sleeps, timeouts and many concurrent route sessions run in virtual time.
    geo.py: points on a globe and round trips between them.
    compute.py: the stand-in span computation (exact integers: any replay mistake changes the
        tokens) and `reference_tokens`, the fault-free run.
    records.py: `RecordBoard` — announcements with publish delay, tombstones and expiry.
    peers.py: `SimPeer` (span, real `SessionTable` and `Drain`, compute queue, ways to go, server
        push between peers) and `PeerLink`, the route session's link to it.
    world.py: `World` — joins through the real `choose_span`, the real `Rebalancer`, churn.
    clients.py: `ClientSite` (the route session's directory and transport), `generate`, `arrivals`.
    metrics.py: `Metrics`, `SwarmReport` — layout judged by `analyze_chains` over virtual time,
        generations, failover stalls, planner wall time.
    scenarios.py: `Scenario` and the named `SCENARIOS`.
    runner.py: `SwarmSim` (composition root) and `run(scenario) -> SwarmReport`.
    transport.py: simulated span peers with scripted faults behind one client's `RouteSession`,
        on a `VirtualClock` (one client at a time); used by failover.py and the unit tests.
    failover.py: `FailoverScenario`, `run` — generations through faulty peers, each checked
        against a fault-free run; leaks counted.
    __main__.py: `python -m sim [NAME ...]` lists the scenarios, or runs them (one JSON line each).

The network lab (real, not simulated: Linux network namespaces, for tests and benchmarks that run
real peers behind NAT routers and far apart; needs root):
    netlab.py: `Lab` — an internet bridge, public sites, home sites behind nftables NAT routers,
        port forwards, per-link delay and rate; `lab_available`; run or spawn commands in a site.
    netns.py: namespace plumbing — the ip/sysctl/ethtool/tc/nft commands, the processes inside,
        `missing` (why namespaces cannot be built here).
    delayline.py: `python -m sim.delayline` — the userspace delay line (AF_PACKET; no netem here),
        and `start` to run it in a namespace.
    netprobe.py: `listen`, `ping` — TCP probes run in the sites (observed address, RTT, bulk).
    upnplab.py: `enable_upnp`, `port_mappings` — miniupnpd on a home router (UPnP IGD).
    stunlab.py: `python -m sim.stunlab` — a STUN Binding responder (miniupnpd learns its address).

The simulator imports swarm.route, swarm.kv, swarm.wire, swarm.errors, swarm.client.session,
swarm.peer.rebalance, swarm.arch and swarm.sizing (all free of I/O) — never swarm.dht, hivemind,
libtorrent or llama.cpp.
The real code it drives is unchanged; the stand-ins are the network, the DHT and the compute.
"""
