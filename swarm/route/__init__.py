"""Choosing which peers serve a session, and which span a new peer serves.

Files:
    plan.py: pure planner — a snapshot of announced spans (+ RTTs) → the cheapest chain of whole
        spans covering the model's layers (`plan_route`, `PeerSpan`, `Hop`, `RoutePlan`).
    placement.py: pure — which span a new peer should serve (the least-covered reachable window).
    snapshot.py: pure — DHT announcements → the planner's `PeerSpan` snapshot.
    chains.py: pure — which spans chain into complete routes, dead ends, routable throughput.
    replay.py: pure — a failed hop's recorded steps into replay frames, never regrouping a step.
    failover.py: pure — step timeouts, retry backoff, failure reasons, and which failed peers to
        avoid for how long.
    ladder.py: pure — the open/retry ladder of a route session: when a plan reads the DHT anew and
        whether a NoRoute is retried or ends it.
    restore.py: pure — the prefix length newly opened hops start from, and what a rebuilt route replays.

Nothing here awaits, reads a clock, or imports swarm.dht; client/ and peer/ gather the snapshot and act.
"""
