"""DeepSeek-V4 (synthetic `deepseek4`) on real peers: rows four residual streams wide and each
row's token id beside them (`Forward.token_ids`), on every hop.

The spans are 0:1, 1:2 (two peers) and 2:4 of a 4-layer model whose first two layers route experts
by token id: the first two hops read the ids, one of them mid-route, so a generation equals
llama.cpp's whole model only if the client sends each row's id on every Forward, and (with server
push) each peer pushes them on with its output. A Forward without ids to a span that reads them gets
an Error frame, and the peer serves on. The cache cannot roll back into a sequence
(`ArchRow.rollback_exact` False): speculation's rejected rows roll back from the state each hop
exports before a verify pass, and killing the routed 1:2 peer mid-generation on a pushed route
rebuilds the whole route into fresh sessions (a later hop may hold the step from a push), and the
tokens stay the whole model's, with speculation on too. Those tests kill peers (one 1:2 peer each,
of three): they run last. A second, two-peer swarm of
the model with a multi-token-prediction block answers its head's drafts (`Forward.want_draft`).
"""

from __future__ import annotations

import signal

import numpy as np
import pytest
from gguf import GGUFReader

from swarm import Client
from swarm.client.telemetry import GenerationTelemetry
from swarm.errors import RequestError
from swarm.manifest import build_manifest
from swarm.sampling import SamplingParams
from swarm.wire import Error, ErrorCode, Forward, Hidden, Token, encode_frame
from tests.helpers.mtp_oracle import kept_by_chain, run_mtp_oracle
from tests.helpers.oracle import N_DECODE, PROMPT, run_oracle
from tests.helpers.peers import PeerSet, RawClient, serve_args, signal_tree
from tests.helpers.synthetic import N_EMBD, N_VOCAB, deepseek4_mtp, write_synthetic

SPANS = ("0:1", "1:2", "2:4")
PEERS = {"p0": "0:1", "p1": "1:2", "p1b": "1:2", "p1c": "1:2", "p2": "2:4"}
ROW = 4 * N_EMBD  # four hyper-connection streams per token (ArchRow.boundary_width)
TEXT = PROMPT[:120]  # 121 tokens with BOS in the byte vocabulary: two 64-row prefill chunks per peer
N_NEW = 32


@pytest.fixture(scope="module")
def ds4(tmp_path_factory):
    path = write_synthetic("deepseek4", tmp_path_factory.mktemp("ds4") / "deepseek4.gguf")
    ps = PeerSet(tmp_path_factory.mktemp("ds4_peers"))
    first = ps.start("p0", *serve_args(path, PEERS["p0"], "--new-swarm"))
    rest = ps.start_together([(name, serve_args(path, span, "--initial-peers", first.maddrs[0]))
                              for name, span in PEERS.items() if name != "p0"])
    yield path, dict(zip(PEERS, [first, *rest]))
    ps.stop_all()
    for p in ps.started:
        if p.proc.returncode != -signal.SIGKILL:  # the failover tests' victims
            assert p.proc.returncode == 0, p.stderr_text()[-2000:]


@pytest.fixture(scope="module")
def expected(ds4) -> tuple[list[int], list[int]]:
    """(the prompt's ids, llama.cpp's greedy tokens after it up to the first end of text)."""
    oracle = run_oracle(ds4[0], TEXT)
    tokens = oracle.tokens[:N_NEW]
    return oracle.prompt, tokens[: tokens.index(2)] if 2 in tokens else tokens  # 2: </s>


@pytest.mark.parametrize("push", [True, False], ids=["push", "relay"])
def test_three_peers_generate_the_whole_models_tokens(ds4, expected, push):
    path, peers = ds4
    prompt, want = expected
    assert len(want) >= 8  # enough decode steps through the hash-routed spans to tell
    with Client(str(path), initial_peers=peers["p0"].maddrs) as client:
        client._engine.push = push  # noqa: SLF001 - the engine's documented switch
        got = client.stream_tokens(prompt, max_new_tokens=N_NEW).run()
    assert got.tokens == want
    route = got.telemetry.route
    assert [f"{h.start}:{h.end}" for h in route] == list(SPANS)
    assert got.telemetry.failovers == []
    steps = route[0].steps - 1  # every Forward of the generation (the first counted step is the Open)
    assert [h.pushed_steps for h in route] == ([0, steps, steps] if push else [0, 0, 0])
    # the first hop is sent every row, four residual streams wide, and its token id
    assert route[0].bytes_sent >= (4 * ROW + 4) * (len(prompt) + len(want) - 1)


@pytest.mark.parametrize("pipeline,temperature", [(False, 0.0), (True, 0.0), (False, 0.8)],
                         ids=["one-pass", "pipelined", "seeded"])
def test_speculation_rolls_rejected_rows_back_from_checkpoints(ds4, expected, pipeline, temperature):
    """The cache cannot truncate, so each hop exports the session's state before a verify pass and
    rolls rejected rows back from it (swarm/peer/checkpoints.py): fixed k = 4 prompt-lookup drafts
    on this random model are mostly rejected, and the tokens are still plain decoding's (greedy: the
    whole model's; seeded: the plain seeded run's, each position drawn as a decode step draws it)."""
    path, peers = ds4
    prompt, want = expected
    with Client(str(path), initial_peers=peers["p0"].maddrs, adaptive_speculation=False,
                pipeline_speculation=pipeline) as client:
        if temperature:
            plain = client.stream_tokens(prompt, max_new_tokens=N_NEW, temperature=temperature, seed=1)
            want = plain.run().tokens
        got = client.stream_tokens(prompt, max_new_tokens=N_NEW, speculate=4, temperature=temperature,
                                   seed=1).run()
    assert got.tokens == want
    spec = got.telemetry.speculation
    assert spec is not None and spec.passes >= 3
    assert spec.accepted < spec.drafted  # rows were rejected: every hop rolled back
    assert got.telemetry.failovers == []  # rolled back in place, not by rebuilding the route


def rows(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, ROW)) * 0.1).astype(np.float32)


def test_a_forward_without_token_ids_to_a_hash_routed_span_is_refused_and_the_peer_serves_on(ds4, tmp_path):
    path, peers = ds4
    raw = RawClient(peers["p1"], build_manifest(path).model_id, tmp_path, span=(1, 2))  # mid-route hash layer
    try:
        s = raw.open_session()
        refused = raw.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=rows(3))))
        assert isinstance(refused, Error) and refused.code == ErrorCode.BAD_REQUEST, refused
        assert "layers [1, 2) read token ids" in refused.message
        out_of_vocab = raw.ask(s, encode_frame(Forward(step=1, pos0=0, hidden=rows(3),
                                                       token_ids=np.array([5, 260, 7]))))
        assert isinstance(out_of_vocab, Error) and "[0, 260)" in out_of_vocab.message, out_of_vocab
        # the same session goes on from position 0: neither refusal moved it
        ok = raw.ask(s, encode_frame(Forward(step=2, pos0=0, hidden=rows(3), token_ids=np.array([5, 6, 7]))))
        assert isinstance(ok, Hidden) and ok.hidden.shape == (3, ROW), ok
        assert np.isfinite(ok.hidden).all()
        # the ids pick a hash-routed layer's experts: layer 1 routes ids 6 and 7 to other experts, so
        # the last row's output changes with its id (and the rows before it do not)
        routes = {t.name: t.data for t in GGUFReader(path).tensors}["blk.1.ffn_gate_tid2eid.weight"]
        assert not set(routes[6].tolist()) & set(routes[7].tolist())
        other = raw.open_session()
        diff = raw.ask(other, encode_frame(Forward(step=0, pos0=0, hidden=rows(3),
                                                   token_ids=np.array([5, 6, 6]))))
        assert isinstance(diff, Hidden)
        assert np.array_equal(diff.hidden[:2], ok.hidden[:2])
        assert not np.array_equal(diff.hidden[2], ok.hidden[2])
    finally:
        raw.close()
    # and the last span, which reads no ids, takes a Forward without them; asked for a draft, this
    # model's last span (no MTP head) answers none
    (tmp_path / "last").mkdir()
    last = RawClient(peers["p2"], build_manifest(path).model_id, tmp_path / "last", span=(2, 4))
    try:
        s = last.open_session()
        answer = last.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=rows(2), want_draft=1)))
        assert isinstance(answer, Token) and answer.draft == (), answer
    finally:
        last.close()


@pytest.fixture(scope="module")
def ds4_mtp(tmp_path_factory):
    """The synthetic deepseek4 with one multi-token-prediction block on two peers, 0:2 and 2:4 (the
    last span serves the head)."""
    path = write_synthetic("deepseek4", tmp_path_factory.mktemp("ds4_mtp") / "ds4-mtp.gguf", spec=deepseek4_mtp())
    ps = PeerSet(tmp_path_factory.mktemp("ds4_mtp_peers"))
    first = ps.start("m0", *serve_args(path, "0:2", "--new-swarm"))
    ps.start("m1", *serve_args(path, "2:4", "--initial-peers", first.maddrs[0]))
    yield path, first
    ps.stop_all()


@pytest.mark.parametrize("push", [True, False], ids=["push", "relay"])
def test_the_last_peer_answers_the_drafts_of_the_whole_models_mtp_head(ds4_mtp, push):
    """With `mtp_drafts` every kept token's answer carries the last span's MTP draft of the token
    after it: after the prompt and after every greedy step, each equals the argmax of llama.cpp's
    MTP head on the whole model (tests/helpers/mtp_oracle.py), pushed route or relayed."""
    path, first = ds4_mtp
    prompt = run_oracle(path, TEXT).prompt
    want = run_mtp_oracle(path, prompt, N_VOCAB)
    want_drafts = np.argmax(want.draft_logits, axis=1).tolist()
    assert len(set(want_drafts)) > 3  # random weights: the drafts vary, so equality is a real check
    with Client(str(path), initial_peers=first.maddrs) as client:
        client._engine.push = push  # noqa: SLF001 - the engine's documented switches
        client._engine.mtp_drafts = 1  # noqa: SLF001
        got = client.stream_tokens(prompt, max_new_tokens=N_DECODE + 1).run()
    n = min(len(got.tokens), N_DECODE + 1)
    assert n >= 8 and got.tokens[:min(n, N_DECODE)] == want.tokens[:min(n, N_DECODE)]
    drafts = got.telemetry.mtp_drafts
    assert [drafts[len(prompt) + 1 + i] for i in range(n)] == [(d,) for d in want_drafts[:n]]
    assert [h.pushed_steps > 0 for h in got.telemetry.route] == [False, push]


@pytest.mark.parametrize("push", [True, False], ids=["push", "relay"])
def test_speculation_with_the_mtp_heads_drafts_gives_the_whole_models_tokens(ds4_mtp, push):
    """`draft="mtp"`: each pass verifies the head's chain of 4 guesses of the tokens after the last
    kept one; a rejected guess rolls every hop back from its checkpoint, the head's state with it, so
    every chain the route answers after that is still the whole model's head's (none from rejected
    rows), and the pass that rejects a guess answers the chain after the token replacing it."""
    path, first = ds4_mtp
    prompt = run_oracle(path, TEXT).prompt
    want = run_mtp_oracle(path, prompt, N_VOCAB, n_chain=4)
    with Client(str(path), initial_peers=first.maddrs, draft="mtp", adaptive_speculation=False) as client:
        client._engine.push = push  # noqa: SLF001 - the engine's documented switch
        got = client.stream_tokens(prompt, max_new_tokens=N_DECODE, speculate=4).run()
    n = len(got.tokens)
    assert n >= 8 and got.tokens == want.tokens[:n]
    spec = got.telemetry.speculation
    assert spec.passes > 0 and spec.passes < spec.drafted <= 4 * spec.passes  # the head's chains
    assert spec.passes + spec.accepted >= n - 2  # a rejected guess brings the next: a plain step only last
    # each verified chain was the head's for that position, its first guess kept exactly when it
    # was the token there
    chains = np.argmax(want.chain_logits, axis=2).tolist()
    heads = {len(prompt) + 1 + i: tuple(c) for i, c in enumerate(chains)}
    tokens_at = {len(prompt) + i: t for i, t in enumerate(want.tokens)}
    drafts = got.telemetry.mtp_drafts
    assert drafts and all(drafts[p] == heads[p] for p in drafts)
    assert 0 < spec.accepted < spec.drafted  # some guesses kept, some rolled back
    assert spec.accepted <= sum(kept_by_chain(drafts[p], p, tokens_at) for p in drafts)


def test_draft_mtp_is_refused_for_a_model_without_a_served_head(ds4):
    path, peers = ds4
    with pytest.raises(RequestError, match="no multi-token-prediction head"):
        Client(str(path), initial_peers=peers["p0"].maddrs, draft="mtp")


def test_a_routed_hash_span_killed_mid_speculation_rebuilds_the_route_and_the_text_holds(ds4, expected):
    path, peers = ds4
    prompt, want = expected
    with Client(str(path), initial_peers=peers["p0"].maddrs, adaptive_speculation=False) as client:
        stream = client.stream_tokens(prompt, max_new_tokens=N_NEW, speculate=4)
        victim = None
        for i, _ in enumerate(stream):
            if i == 5:  # after the first verify passes: the hops hold checkpoints
                victim = next(p for p in peers.values() if p.peer_id == stream.telemetry.route[1].peer_id)
                signal_tree(victim, signal.SIGKILL)
                victim.proc.wait(30)
    got = stream.result
    assert victim is not None and got.tokens == want
    assert got.telemetry.speculation.passes > 2
    [f] = got.telemetry.failovers
    assert f.peer_id == victim.peer_id and len(f.replacements) == 3 and victim.peer_id not in f.replacements
    assert f.restored_tokens == 0 and f.replayed_tokens == f.position  # fresh sessions, replayed from 0


def test_a_routed_hash_span_killed_mid_generation_rebuilds_the_pushed_route(ds4, expected):
    path, peers = ds4
    prompt, want = expected
    t = GenerationTelemetry(backend="swarm")
    with Client(str(path), initial_peers=peers["p0"].maddrs) as client:
        session = client._engine.open_session(len(prompt) + N_NEW, SamplingParams(), t)  # noqa: SLF001
        try:
            tokens = [session.prefill(prompt).token]
            while len(tokens) < 4:
                tokens.append(session.decode(tokens[-1]).token)
            victim = next(p for p in peers.values() if p.peer_id == t.route[1].peer_id)
            signal_tree(victim, signal.SIGKILL)
            victim.proc.wait(30)
            while len(tokens) < len(want):
                tokens.append(session.decode(tokens[-1]).token)
        finally:
            session.close()
    assert tokens == want
    [f] = t.failovers
    assert f.peer_id == victim.peer_id and f.position == len(prompt) + 3
    # every hop was replaced by a fresh session (the other two on the same peers), replayed from 0
    assert len(f.replacements) == 3 and victim.peer_id not in f.replacements
    assert [f"{h.start}:{h.end}" for h in t.route] == list(SPANS)
    assert f.restored_tokens == 0 and f.replayed_tokens == len(prompt) + 3
