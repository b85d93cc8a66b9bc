"""The multi-token-prediction heads that read llama.cpp's `h_nextn` (`ArchRow.mtp_input`), served by
real peers: synthetic qwen35 (hybrid recurrent cache, M-RoPE positions) and deepseek2 (MLA, a cache
that truncates; its last span's head goes back as far as it remembers what it was fed) with one MTP
block each, on two peers apiece, the last span serving the head.

`Client(draft="mtp")` speculates with the head's chained guesses over a pushed route: the tokens are
the whole model's (llama.cpp, tests/helpers/oracle.py) and every chain the route answers is the whole
model's head's (tests/helpers/mtp_oracle.py), with guesses kept and guesses rolled back on every hop:
qwen35's from the state each hop exported before the pass (swarm/peer/checkpoints.py), deepseek2's by
truncation (its last span's `SpanExecutor.truncate_depth`). deepseek2's route sends each row's token
id (its layers read none: the head does) and offers no prefixes, as a non-truncating route does. The
deepseek4 head (the last block's residual) is covered by tests/integration/test_deepseek4_peers.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from swarm import Client
from swarm.manifest import build_manifest
from swarm.wire import Forward, Token, encode_frame
from tests.helpers.mtp_oracle import kept_by_chain, run_mtp_oracle
from tests.helpers.oracle import N_DECODE, PROMPT, run_oracle
from tests.helpers.peers import PeerSet, RawClient, serve_args
from tests.helpers.synthetic import MTP_SPECS, N_EMBD, N_VOCAB, write_synthetic

TEXT = PROMPT[:70]  # 71 tokens with BOS: a 64-row chunk and a short one on every peer
K = 3  # guesses per pass: the head's chained drafts
SPANS = {"qwen35": ("0:2", "2:6"), "deepseek2": ("0:2", "2:5")}


@pytest.fixture(scope="module", params=sorted(SPANS))
def mtp_swarm(request, tmp_path_factory):
    arch = request.param
    path = write_synthetic(arch, tmp_path_factory.mktemp(f"{arch}_mtp") / f"{arch}-mtp.gguf",
                           spec=MTP_SPECS[arch]())
    ps = PeerSet(tmp_path_factory.mktemp(f"{arch}_mtp_peers"))
    first, last = SPANS[arch]
    p0 = ps.start("m0", *serve_args(path, first, "--new-swarm"))
    ps.start("m1", *serve_args(path, last, "--initial-peers", p0.maddrs[0]))
    yield path, p0
    ps.stop_all()
    for p in ps.started:
        assert p.proc.returncode == 0, p.stderr_text()[-2000:]


def test_speculation_with_an_h_nextn_head_gives_the_whole_models_tokens(mtp_swarm):
    """Every pass verifies the head's chain of K guesses; the random head's guesses are almost never
    the trunk's token, so nearly every pass rolls back, the head's cache and its h with it: a guess
    answered after a rollback that left a rejected row in the head's cache would not be the whole
    model's. The last peer drafts each next chain from the pass's accepted rows, so every step is a
    pass, and every chain is the one llama.cpp's MTP driver chains at that position."""
    path, first = mtp_swarm
    assert build_manifest(path).mtp_head_tensors()
    prompt = run_oracle(path, TEXT).prompt
    want = run_mtp_oracle(path, prompt, N_VOCAB, n_chain=K)
    chains = np.argmax(want.chain_logits, axis=2).tolist()
    heads = {len(prompt) + 1 + i: tuple(c) for i, c in enumerate(chains)}
    tokens_at = {len(prompt) + i: t for i, t in enumerate(want.tokens)}
    assert len(set(heads.values())) > 3  # random weights: the guesses vary, so equality is a real check
    with Client(str(path), initial_peers=first.maddrs, draft="mtp", adaptive_speculation=False) as client:
        engine = client._engine  # noqa: SLF001 - the engine's documented attributes
        assert not engine.rollback_exact and engine.push
        got = client.stream_tokens(prompt, max_new_tokens=N_DECODE, speculate=K).run()
        plain = client.stream_tokens(prompt, max_new_tokens=8).run()
    # a request that does not speculate asks the head for nothing
    assert plain.telemetry.mtp_drafts == {} and plain.tokens == want.tokens[:8]
    n = len(got.tokens)
    assert n >= 8 and got.tokens == want.tokens[:n]
    spec = got.telemetry.speculation
    # K guesses per pass (fewer only where the request's budget ends), each pass the head's chain
    assert spec.passes > 0 and spec.passes < spec.drafted <= K * spec.passes
    # every step after the prompt was a pass with a guess, a rejected guess bringing the next one
    # (Token.draft after a pass's accepted rows): no plain decode step but the last (draft_budget:
    # no row is drafted for the token after the last one asked for)
    assert spec.passes + spec.accepted >= n - 2
    drafts = got.telemetry.mtp_drafts
    assert drafts and all(drafts[p] == heads[p] for p in drafts)
    assert spec.accepted < spec.drafted  # guesses rolled back on every hop
    assert spec.accepted <= sum(kept_by_chain(drafts[p], p, tokens_at) for p in drafts)
    assert got.telemetry.route[-1].pushed_steps > 0 and not got.telemetry.failovers


def test_a_draft_the_head_cannot_make_is_answered_as_none_beside_the_steps_token(tmp_path_factory):
    """A chain of drafts stops where the session's KV stream has no cell left for the next draft
    position, and a step that fills the stream leaves none for the first: the answer is the step's
    token without a draft (the step was computed and the session advanced), not an Error that would
    make the client fail the hop over."""
    path = write_synthetic("deepseek2", tmp_path_factory.mktemp("full") / "ds2-mtp.gguf",
                           spec=MTP_SPECS["deepseek2"]())
    ps = PeerSet(tmp_path_factory.mktemp("full_peer"))
    # two sessions of 256 cells each; one client may reserve half the cache (one session's stream)
    args = serve_args(path, "0:5", "--new-swarm", "--cache-tokens", "512", "--max-sessions", "2")
    p = ps.start("solo", *args)
    raw = RawClient(p, build_manifest(path).model_id, tmp_path_factory.mktemp("raw"), span=(0, 5))
    rows = (np.random.default_rng(0).standard_normal((256, N_EMBD)) * 0.1).astype(np.float32)
    ids = np.arange(256, dtype=np.int32) % (N_VOCAB - 4) + 4
    try:
        s = raw.open_session(max_tokens=256)
        chain = raw.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=rows[:253], token_ids=ids[:253],
                                                want_draft=5)))
        assert isinstance(chain, Token) and len(chain.draft) == 3, chain  # three cells left: three drafts
        head = raw.ask(s, encode_frame(Forward(step=1, pos0=253, hidden=rows[253:255], token_ids=ids[253:255],
                                               want_draft=1)))
        assert isinstance(head, Token) and len(head.draft) == 1, head  # one cell left: drafted
        full = raw.ask(s, encode_frame(Forward(step=2, pos0=255, hidden=rows[255:], token_ids=ids[255:],
                                               want_draft=1)))
        assert isinstance(full, Token) and full.draft == (), full
    finally:
        raw.close()
        ps.stop_all()
    assert p.proc.returncode == 0, p.stderr_text()[-2000:]
