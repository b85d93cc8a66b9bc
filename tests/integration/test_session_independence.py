"""Concurrent sessions on one real peer are independent: each one's logits equal its solo run's.

One `swarm serve` peer holds the whole of SmolLM2 (span 0:30, so it samples and can return the
logits). A raw client drives eight sessions (the peer's --max-sessions) with prompts of 7 to 300
tokens (none a multiple of the 64-row block): first each one alone on the peer, then all eight at once — every prefill sent before
any answer is read, so the peer's scheduler interleaves their 64-row chunks, then every decode
step of all eight sent together, so the scheduler batches them into shared `llama_decode` calls.
Every reply's logits (the last prompt row's, then each decode step's) and sampled token must equal
the solo run's bit for bit.

This held only once every sequence got a KV stream of its own (llama.cpp `kv_unified = false`):
with one stream shared by all sequences, a session's cells land after the other sessions' and its
logits differ from its solo run (measured on this test: see docs/benchmarks.md, issue 11).
"""

from __future__ import annotations

import numpy as np
import pytest

from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.manifest import build_manifest
from swarm.wire import Close, Forward, Token, encode_frame

from tests.helpers.peers import PeerSet, RawClient, serve_args

PROMPT_LENGTHS = (7, 70, 100, 131, 190, 33, 250, 300)
N_DECODE = 12
MAX_TOKENS = 320


@pytest.fixture(scope="module")
def raw(smollm2_path, tmp_path_factory):
    ps = PeerSet(tmp_path_factory.mktemp("independence_peer"))
    # one raw client drives every session: allow it all 8 (by default a client may hold 4)
    p = ps.start("p0", *serve_args(smollm2_path, "0:30", "--new-swarm", "--max-sessions", "8",
                                   "--client-sessions", "8"))
    c = RawClient(p, build_manifest(smollm2_path).model_id, tmp_path_factory.mktemp("independence_client"))
    yield c
    c.close()
    ps.stop_all()
    assert p.proc.returncode == 0, p.stderr_text()[-2000:]


def _forward(step: int, pos0: int, hidden: np.ndarray) -> bytes:
    return encode_frame(Forward(step=step, pos0=pos0, hidden=hidden, want_logits=True))


def _token(reply) -> Token:
    assert isinstance(reply, Token) and reply.logits is not None, reply
    return reply


def _run(raw: RawClient, emb: TokenEmbedder, prompts: list[list[int]]) -> list[list[Token]]:
    """Drive one session per prompt, all at once: each round sends every session's frame before
    reading any reply. Returns, per session, its prefill reply then N_DECODE step replies; the
    next input of each session is the argmax of its last logits (greedy)."""
    streams = [raw.open_session(max_tokens=MAX_TOKENS) for _ in prompts]
    replies: list[list[Token]] = [[] for _ in prompts]
    inputs = [emb.embed(p) for p in prompts]
    pos = [0] * len(prompts)
    for step in range(N_DECODE + 1):
        for s, x, p in zip(streams, inputs, pos):
            raw.send(s, _forward(step, p, x))
        for i, s in enumerate(streams):
            t = _token(raw.recv(s))
            assert t.step == step
            replies[i].append(t)
            pos[i] += inputs[i].shape[0]
            inputs[i] = emb.embed([int(np.argmax(t.logits[-1]))])
    for s in streams:
        raw.send(s, encode_frame(Close()))
        raw.assert_closed(s)
    return replies


def test_concurrent_sessions_equal_their_solo_runs(raw, smollm2_path):
    emb = TokenEmbedder(smollm2_path)
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(100, 20_000, size=n)] for n in PROMPT_LENGTHS]
    solo = [_run(raw, emb, [p])[0] for p in prompts]
    together = _run(raw, emb, prompts)
    differ = []
    for i, (a, b) in enumerate(zip(together, solo)):
        worst = max(float(np.abs(x.logits - y.logits).max()) for x, y in zip(a, b))
        tokens_equal = [x.token for x in a] == [y.token for y in b]
        if worst != 0.0 or not tokens_equal:
            differ.append((PROMPT_LENGTHS[i], worst, tokens_equal))
    assert not differ, f"unlike solo (prompt tokens, max abs logit difference, tokens equal): {differ}"
