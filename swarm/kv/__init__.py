"""KV-cache accounting, the sessions of one served span, and prefix KV snapshots.

Files:
    budget.py: pure arithmetic — KV bytes per token for a span, tokens that fit a byte budget,
        which spans fit a peer's memory.
    sessions.py: `SessionTable`, the single mutator of a span's sessions (admission within each
        session's KV-stream cap, positions, idle eviction, seq-id slots, what a new session could
        reserve); it returns the seq ids its caller must clear in the executor.
    prefix.py: pure — sha256 chain hashes of token prefixes per block, the client's capped offers,
        the restore point every hop agrees on.
    snapshot.py: a prefix KV snapshot's key, versioned format and signed, bounded payload; its full
        check on receipt (`SnapshotRejected` with the reason).
    snapshot_store.py: a peer's LRU store of snapshots within byte budgets (memory, then disk).

Nothing here touches llama.cpp, sockets, the DHT or clocks (callers pass `now_s`); only
snapshot_store.py writes files (its disk tier).
"""
