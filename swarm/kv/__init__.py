"""KV-cache accounting and the sessions of one served span.

Files:
    budget.py: pure arithmetic — KV bytes per token for a span, tokens that fit a byte budget.
    sessions.py: `SessionTable`, the single mutator of a span's sessions (admission within each
        session's KV-stream cap, positions, idle eviction, seq-id slots, what a new session could
        reserve); it returns the seq ids its caller must clear in the executor.

Nothing here touches llama.cpp, sockets or clocks (callers pass `now_s`).
"""
