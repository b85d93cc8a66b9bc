"""Names of token prefixes: a sha256 chain over fixed blocks, and the offers a client makes.

A prefix of `n` tokens is named by `h(n)`, a chain over blocks of `PREFIX_BLOCK_TOKENS` tokens
(vLLM's prefix caching does the same):

    h(0) = sha256(b"swarm-prefix-v1")
    h(k·B) = sha256(h((k-1)·B) || int32 LE token ids of block k)
    h(n) for n not a multiple of B = sha256(h(⌊n/B⌋·B) || int32 LE ids of the partial block)

so two prompts share `h(k·B)` exactly when they share their first k·B tokens, and `h(n)` of a
whole prompt is the name of the snapshot a peer keeps after that prompt's prefill.

Exactness decides where a prefix may be restored. llama.cpp's kernels depend on how rows are
grouped into a batch (measured on Qwen 0.5B, span [0, 8): restoring at 200 with 64-row batches
from 192 gives hidden states up to 0.50 logits away from a full prefill; at 192 or 128, 0.0).
So every path runs prefills in ubatches of exactly `PREFIX_BLOCK_TOKENS` rows (the ubatch grid of
swarm/numeric.py; the peers' executor n_batch) and clients start every prefill frame at a multiple of it: every ubatch is then one whole block at the
same positions, whether the positions before it were computed or restored, and a restore at a
block boundary followed by computing the rest gives bit-identical numbers (measured 0.0 over three
spans, when the restored sequence lands in the same KV cells as a fresh prefill would; see
swarm/kv/snapshot.py for the cell-placement caveat). Restorable lengths are therefore multiples of
the block, below the prompt length (at least one prompt row must be computed to sample from).

This module is pure: no I/O, no clocks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

import numpy as np

from swarm.limits import MAX_PREFIX_OFFERS
from swarm.numeric import UBATCH_TOKENS

PREFIX_BLOCK_TOKENS = UBATCH_TOKENS
"""Block of the hash chain and the granularity of restores: the ubatch grid (swarm/numeric.py)."""
DENSE_TAIL_OFFERS = 32
"""Offers always kept at consecutive block boundaries just below the prompt's end."""
_SEED = hashlib.sha256(b"swarm-prefix-v1").digest()


def _ids(tokens: Sequence[int]) -> bytes:
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > 2**31 - 1):
        raise ValueError("token ids must fit int32")
    return arr.astype("<i4").tobytes()


def prefix_hashes(
    tokens: Sequence[int], lengths: Sequence[int], block: int = PREFIX_BLOCK_TOKENS
) -> list[bytes]:
    """`h(n)` for each n in `lengths` (ascending, 1 <= n <= len(tokens)).

    Raises:
        ValueError: lengths not ascending or out of range, token ids not int32.
    """
    out: list[bytes] = []
    h, done, prev = _SEED, 0, 0
    for n in lengths:
        if not prev < n <= len(tokens):
            raise ValueError(f"prefix lengths must ascend within [1, {len(tokens)}], got {n} after {prev}")
        prev = n
        while done + block <= n:  # extend the chain by whole blocks
            h = hashlib.sha256(h + _ids(tokens[done : done + block])).digest()
            done += block
        out.append(h if done == n else hashlib.sha256(h + _ids(tokens[done:n])).digest())
    return out


def offer_lengths(
    n_prompt: int, block: int = PREFIX_BLOCK_TOKENS, max_offers: int = MAX_PREFIX_OFFERS
) -> list[int]:
    """Prefix lengths a client offers for a prompt of `n_prompt` tokens, ascending.

    Every block boundary below the prompt's end, thinned to `max_offers`: the last
    DENSE_TAIL_OFFERS boundaries are kept, the earlier ones evenly spaced; the whole prompt is
    always the last offer (it names the snapshot a peer keeps; it is never restored itself).
    """
    if n_prompt < 1:
        return []
    bounds = list(range(block, n_prompt, block))
    room = max_offers - 1
    if len(bounds) > room:
        tail = bounds[-DENSE_TAIL_OFFERS:]
        head = bounds[:-DENSE_TAIL_OFFERS]
        k = room - len(tail)
        head = [head[int(i * len(head) / k)] for i in range(k)] if k > 0 else []
        bounds = head + tail
    return bounds + [n_prompt]


def prefix_offers(tokens: Sequence[int], block: int = PREFIX_BLOCK_TOKENS) -> tuple[tuple[int, bytes], ...]:
    """(n_tokens, h(n_tokens)) pairs for `offer_lengths(len(tokens))`, the last one the whole prompt."""
    lengths = offer_lengths(len(tokens), block)
    return tuple(zip(lengths, prefix_hashes(tokens, lengths, block)))


def owner_scoped(offers: Sequence[tuple[int, bytes]], owner: str) -> tuple[tuple[int, bytes], ...]:
    """The offers renamed into the namespace of the session's authenticated owner (a peer id).

    A peer sees only hidden states, never the token ids a hash claims to name, so it cannot check an
    offer. A peer therefore stores and looks up snapshots under sha256(owner || h): a snapshot made
    from one client's rows can only ever be restored into that same client's sessions (on this peer
    or, fetched by the same name, on another peer of the span), and a client that lies about its
    hashes poisons only its own cache. The cost: prefixes are not shared between clients.
    """
    tag = hashlib.sha256(b"swarm-prefix-owner-v1" + owner.encode()).digest()
    return tuple((n, hashlib.sha256(tag + h).digest()) for n, h in offers)


def choose_restore(
    restorable_per_hop: Sequence[Collection[int]], below: int, block: int = PREFIX_BLOCK_TOKENS
) -> int:
    """Largest length every hop can restore: a multiple of `block`, below `below`; 0 for none.

    Hops must agree: hop i+1's rows come from hop i's outputs, so a hop that restores less would
    need rows the client never received.
    """
    if not restorable_per_hop:
        return 0
    common = set.intersection(*(set(r) for r in restorable_per_hop))
    ok = [n for n in common if 0 < n < below and n % block == 0]
    return max(ok, default=0)
