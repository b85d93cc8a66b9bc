"""Speculative decoding: drafts, and what a verify pass over the route accepts.

Files:
    draft.py: the `Draft` interface (`propose(tokens, k) -> list[int]`) and `PromptLookup`, drafts
        from n-grams of the prompt and the text so far (no model).
    policy.py: pure — `KPolicy`, the draft length of each pass (0..k) from the acceptance and pass
        times a generation measured, so speculation turns itself off where it would be slower.
    verify.py: pure — the rows of a verify pass, the steps they are computed as, the accepted prefix
        of a draft given the tokens the last span sampled for every row, and the acceptance counts.

Nothing here does I/O, awaits or reads a clock; swarm/client/ sends the verify passes, and runs the
draft models (swarm/client/draftmodel.py: a GGUF with the target's tokenizer, on llama.cpp).
"""
