"""Choosing which peers serve a session, and which span a new peer serves.

Files:
    plan.py: pure planner — a snapshot of announced spans (+ RTTs) → the cheapest chain of whole
        spans covering the model's layers (`plan_route`, `PeerSpan`, `Hop`, `RoutePlan`).
    chains.py: pure — which spans chain into complete routes (reachable and finishing boundaries,
        dead ends) and the swarm's routable throughput (max flow over layer boundaries).
    placement.py: pure — which span a peer should serve (on a complete chain, fits its memory, most
        added flow) and whether a serving peer should move (`MIN_GAIN` hysteresis).
    snapshot.py: pure — DHT announcements → the planner's `PeerSpan` snapshot.
    replay.py: pure — a failed hop's recorded steps into replay frames, never regrouping a step.
    failover.py: pure — step timeouts, retry backoff, failure reasons, and which failed peers to
        avoid for how long.
    ladder.py: pure — the open/retry ladder of a route session: when a plan reads the DHT anew and
        whether a NoRoute is retried or ends it.
    restore.py: pure — the prefix length newly opened hops start from, and what a rebuilt route replays.
    verify.py: pure — spot checks of remote computation: the measure and band, when to check which
        hop, and a caught peer's standing (route pricing).

Nothing here awaits, reads a clock, or imports swarm.dht; client/ and peer/ gather the snapshot and act.
"""
