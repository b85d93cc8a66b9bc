"""Speculative decoding: drafts, and what a verify pass over the route accepts.

Files:
    draft.py: the `Draft` interface (`propose(tokens, k) -> list[int]`) and `PromptLookup`, drafts
        from n-grams of the prompt and the text so far (no model).
    verify.py: pure — the rows of a verify pass, the steps they are computed as, the accepted prefix
        of a draft given the tokens the last span sampled for every row, and the acceptance counts.

Nothing here does I/O, awaits or reads a clock; swarm/client/ sends the verify passes.
"""
