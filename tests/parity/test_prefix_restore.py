"""Restoring a prefix snapshot then computing the rest gives exactly a full prefill's logits.

SmolLM2 as a 2-span chain with 64-row ubatches (the peers' PREFIX_BLOCK_TOKENS). Prompt B shares
its first 128 tokens with prompt A. A's KV is exported from every span, imported into an empty
cache (the same KV cells a fresh prefill takes), truncated to the shared block boundary, and B's
remaining rows are computed: every logit equals B's full prefill bit for bit. A restore point off
the block grid is not exact (rows are grouped into other ubatches), which is why clients only
restore at block boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest

from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.kv.prefix import PREFIX_BLOCK_TOKENS
from swarm.models import resolve_model
from tests.helpers.chains import chain_forward, open_chain

B = PREFIX_BLOCK_TOKENS


@pytest.fixture(scope="module")
def setup(span_cache):
    path = resolve_model("smollm2-135m")
    chain = open_chain(path, (15,), span_cache, n_seq_max=3, n_batch=B)
    yield chain, TokenEmbedder(path)
    for ex in chain:
        ex.close()


def _prefill(chain, emb, seq, ids, pos0=0):
    """Frames starting at multiples of B, as the client sends them (ubatches of B inside)."""
    outs = []
    for p in range(pos0, len(ids), 2 * B):
        outs.append(chain_forward(chain, emb, seq, p, ids[p : p + 2 * B], all_logits=True))
    return np.concatenate(outs)


def _clear(chain):
    for ex in chain:
        for s in range(3):
            ex.clear(s)


def test_restore_at_a_block_boundary_equals_a_full_prefill(setup):
    chain, emb = setup
    rng = np.random.default_rng(7)
    shared = [int(t) for t in rng.integers(100, 40_000, 2 * B)]
    a = shared + [int(t) for t in rng.integers(100, 40_000, 30)]
    b = shared + [int(t) for t in rng.integers(100, 40_000, 41)]
    _clear(chain)
    full = _prefill(chain, emb, 0, b)
    _clear(chain)
    _prefill(chain, emb, 1, a)
    snaps = [ex.export_seq(1) for ex in chain]
    for restore in (B, 2 * B):
        _clear(chain)
        for ex, kv in zip(chain, snaps):
            ex.import_seq(2, kv)
            ex.truncate(2, restore)
            assert ex.pos_max(2) == restore - 1
        rest = _prefill(chain, emb, 2, b, pos0=restore)
        assert np.array_equal(rest, full[restore:]), np.abs(rest - full[restore:]).max()
