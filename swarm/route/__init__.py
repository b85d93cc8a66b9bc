"""Choosing which peers serve a session, and which span a new peer serves.

Files:
    plan.py: pure planner — a snapshot of announced spans (+ RTTs) → the cheapest chain of whole
        spans covering the model's layers (`plan_route`, `PeerSpan`, `Hop`, `RoutePlan`).
    placement.py: pure — which span a new peer should serve (the least-covered reachable window).
    snapshot.py: pure — DHT announcements → the planner's `PeerSpan` snapshot.
    failover.py: pure — step timeouts, retry backoff, and which failed peers to avoid for how long.

Nothing here awaits, reads a clock, or imports swarm.dht; client/ and peer/ gather the snapshot and act.
"""
