"""Speculative decoding over a real route: the text equals plain decoding, token for token.

Prompt-lookup drafts and the self-draft (the model requantized to Q3_K_M, run in the client) on
SmolLM2 (the session's shared swarm, 0:10 / 10:20 / 20:30) and on Qwen2.5 0.5B (a swarm of its own,
`slow`). Each verify pass carries the last token and up to k drafted
tokens through every hop in one frame; the last span samples every row, the client keeps the
drafted tokens up to the first that differs, and every hop rolls the rest back on the next step
(`Forward.rewind`). A pass is computed in groups of the rows every span proved at load to compute
exactly as one-row steps (swarm/peer/exact_rows.py: 8 on SmolLM2, 3 on Qwen); the tokens must equal
a plain (non-speculative) run over the same route, greedy and seeded alike. The plain run is the
oracle here, not llama.cpp's whole model: on the parity prompt at 64 tokens SmolLM2's plain swarm
text already parts from llama.cpp's (measured, with speculation off), so only the plain run tells
whether speculation changed anything.
"""

from __future__ import annotations

import pytest

from swarm import Client
from swarm.errors import ModelError
from swarm.spec import policy
from tests.helpers.oracle import PROMPT
from tests.helpers.peers import PeerSet, serve_args

N_NEW = 64
COPY_PROMPT = (
    "Repeat the list exactly.\nList: alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa.\n"
    "Repeat: alpha, beta,"
)


def speculated(client: Client, prompt: str, k: int = 4, **kw):
    g = client.generate(prompt, max_new_tokens=N_NEW, speculate=k, **kw)
    s = g.telemetry.speculation
    assert s is not None and s.passes > 0 and s.accepted > 0, "the drafts were never used"
    return g


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("prompt", [PROMPT, COPY_PROMPT], ids=["parity", "copy"])
def test_greedy_speculative_tokens_equal_plain_decoding(smol_swarm, smollm2_path, prompt, k):
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs,
                adaptive_speculation=False) as client:
        plain = client.generate(prompt, max_new_tokens=N_NEW)
        got = speculated(client, prompt, k)
    assert got.tokens == plain.tokens
    # every span proved 8 rows exact at load: passes of k + 1 <= 5 rows went as one step each
    assert [h.verify_rows for h in got.telemetry.route] == [8, 8, 8]
    s = got.telemetry.speculation
    # the prefill's token, then per pass its kept drafted tokens plus one, per decode step one
    assert s.accepted + s.passes + 1 <= len(got.tokens)


@pytest.mark.parametrize("prompt", [PROMPT, COPY_PROMPT], ids=["parity", "copy"])
def test_adaptive_draft_length_keeps_the_plain_tokens(smol_swarm, smollm2_path, prompt):
    # The policy (swarm/spec/policy.py) mixes plain steps, shadow drafts and passes of 1..k rows as
    # its measurements say: whatever it picks, the tokens are plain decoding's.
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
        plain = client.generate(prompt, max_new_tokens=N_NEW)
        got = client.generate(prompt, max_new_tokens=N_NEW, speculate=4)
    assert got.tokens == plain.tokens
    s = got.telemetry.speculation
    # the first decode step is plain and the next pass drafts (to time both): at least one pass
    assert s.passes >= 1 and s.accepted + s.passes + 1 <= len(got.tokens)


@pytest.mark.parametrize("seed", [1, 7, 12345])
def test_seeded_sampling_speculative_text_equals_plain_sampling(smol_swarm, smollm2_path, monkeypatch, seed):
    # the last span draws every row with the seed of its position, as a decode step does: a kept
    # drafted token is the token plain sampling draws there (swarm/spec/verify.py); passes sent
    # ahead (on every pass here) draw with the seeds of their own positions too
    monkeypatch.setattr(policy, "AHEAD_MIN_USE", 0.0)
    sampling = dict(temperature=0.8, top_p=0.95, seed=seed)
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs,
                adaptive_speculation=False) as client:
        plain = client.generate(COPY_PROMPT, max_new_tokens=N_NEW, **sampling)
        got = speculated(client, COPY_PROMPT, **sampling)
    assert got.tokens == plain.tokens
    assert got.telemetry.speculation.ahead_sent > 0


@pytest.mark.parametrize("draft, prompt", [("lookup", COPY_PROMPT), ("self", PROMPT)], ids=["lookup-copy", "self"])
def test_pipelined_passes_keep_the_plain_tokens(smol_swarm, smollm2_path, monkeypatch, draft, prompt):
    # Every pass sends the next one ahead here (the bar that keeps unlikely passes from being sent
    # is lowered to 0): a pass sent ahead is read where the pass before kept every row and the guess
    # after them held, and otherwise rolled back unread by the next step's rewind on every hop.
    monkeypatch.setattr(policy, "AHEAD_MIN_USE", 0.0)
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs, draft=draft,
                adaptive_speculation=False) as client:
        plain = client.generate(prompt, max_new_tokens=N_NEW)
        client.pipeline_speculation = False
        one = speculated(client, prompt)
        client.pipeline_speculation = True
        piped = speculated(client, prompt)
    assert one.tokens == plain.tokens and piped.tokens == plain.tokens
    assert one.telemetry.speculation.ahead_sent == 0
    s = piped.telemetry.speculation
    assert 0 < s.ahead_used < s.ahead_sent  # both kinds: used, and rolled back unread
    # every hop answered each pass sent ahead once; the client read the used ones and skipped the
    # others' answers while waiting for the next step's (`RouteSession._receive`)
    assert piped.telemetry.finish_reason == "length"
    assert [h.skipped_replies for h in piped.telemetry.route] == [s.ahead_sent - s.ahead_used] * 3


NOVEL_PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n"
                "Once upon a time,")


@pytest.mark.parametrize("prompt, adaptive", [(PROMPT, False), (NOVEL_PROMPT, True)],
                         ids=["parity-fixed", "novel-adaptive"])
def test_greedy_tokens_with_the_self_draft_equal_plain_decoding(smol_swarm, smollm2_path, prompt, adaptive):
    # The self-draft (SmolLM2 requantized to Q3_K_M, run in this process: swarm/client/draftmodel.py)
    # guesses novel text too; its guesses are checked as prompt lookup's are.
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs, draft="self",
                adaptive_speculation=adaptive) as client:
        plain = client.generate(prompt, max_new_tokens=N_NEW)
        got = client.generate(prompt, max_new_tokens=N_NEW, speculate=4)
        again = client.generate(prompt, max_new_tokens=N_NEW, speculate=4)  # the draft's pooled context
    assert got.tokens == plain.tokens and again.tokens == plain.tokens
    s = got.telemetry.speculation
    assert s.passes >= 1 and s.accepted + s.passes + 1 <= len(got.tokens)
    if not adaptive:
        # a greedy draft of the same weights at another quantization: most guesses are kept
        assert s.rate > 0.5 and s.tokens_per_pass > 2.5


def test_seeded_sampling_with_the_self_draft_equals_plain_sampling(smol_swarm, smollm2_path):
    # a draft model's greedy guess is a single guess: kept where the seeded draw equals it
    sampling = dict(temperature=0.8, top_p=0.95, seed=7)
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs, draft="self",
                adaptive_speculation=False) as client:
        plain = client.generate(NOVEL_PROMPT, max_new_tokens=N_NEW, **sampling)
        got = speculated(client, NOVEL_PROMPT, **sampling)
    assert got.tokens == plain.tokens


def test_a_draft_model_of_another_tokenizer_is_refused(smol_swarm, smollm2_path, gemma_path):
    with pytest.raises(ModelError, match=r"cannot draft for .*smollm2-135m.gguf: its tokenizer differs"):
        Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs, draft=str(gemma_path))


@pytest.fixture(scope="module")
def qwen_swarm(qwen_path, tmp_path_factory):
    ps = PeerSet(tmp_path_factory.mktemp("qwen_spec"))
    first = ps.start("q0", *serve_args(qwen_path, "0:12", "--new-swarm"))
    ps.start("q1", *serve_args(qwen_path, "12:24", "--initial-peers", first.maddrs[0]))
    yield ps
    ps.stop_all()


@pytest.mark.parametrize(
    "draft, prompt", [("lookup", PROMPT), ("lookup", COPY_PROMPT), ("self", NOVEL_PROMPT)],
    ids=["parity", "copy", "self-draft-novel"],
)
def test_greedy_speculative_tokens_equal_plain_decoding_on_qwen(qwen_swarm, qwen_path, draft, prompt):
    with Client(str(qwen_path), initial_peers=qwen_swarm.started[0].maddrs, draft=draft,
                adaptive_speculation=False) as client:
        plain = client.generate(prompt, max_new_tokens=N_NEW)
        got = speculated(client, prompt)
    assert got.tokens == plain.tokens
    # Qwen's spans prove 3 rows exact (repacked Q4_K gemm from 4): passes of 5 rows go as 3 + 2
    assert [h.verify_rows for h in got.telemetry.route] == [3, 3]
