"""Spot checks on real peers: lying peers are caught and dropped, honest ones are never flagged, and
the text, repaired from the liar's first wrong row on, equals llama.cpp's whole model.

SmolLM2 on 127.0.0.1: 0:10, two honest peers for 10:20 (1 and 2 threads), 20:30. Each liar test
starts a lying 10:20 peer (`SWARM_TEST_LIE`, swarm/peer/testlie.py), which announces ten times its
measured speed so that routes take it; the honest 10:20 peers then serve the checks. Each test
starts from a client with no exclusions and no offences, with a fixed check seed, so which steps
are checked is the same every run.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from swarm.client.generate import GenerationRequest, TokenStream
from swarm.client.remote import connect_swarm
from swarm.route.failover import FailureReason
from swarm.route.plan import plan_route
from swarm.route.verify import DEFAULT_BAND, CheckPolicy

from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, serve_args, wait_for

PROMPT = "The old lighthouse keeper climbed the stairs one last time. At the top, he found"
N_NEW = 64


@pytest.fixture(scope="module")
def swarm(smollm2_path, tmp_path_factory):
    ps = PeerSet(tmp_path_factory.mktemp("verify"))
    first = ps.start("a", *serve_args(smollm2_path, "0:10", "--new-swarm"))
    join = ("--initial-peers", first.maddrs[0])
    ps.join = join
    ps.honest = {
        ps.start("h1", *serve_args(smollm2_path, "10:20", *join)).peer_id,
        ps.start("h2", *serve_args(smollm2_path, "10:20", *join, "--threads", "2")).peer_id,
    }
    ps.start("z", *serve_args(smollm2_path, "20:30", *join))
    yield ps
    ps.stop_all()


@pytest.fixture
def client(swarm, smollm2_path, tmp_path, monkeypatch):
    """A new client per test: no exclusions, no offences, and no memory of earlier tests' liars
    (a client keeps records it has seen until they expire, and a stopped liar's lingers)."""
    monkeypatch.setenv("SWARM_HOME", str(tmp_path))  # the evidence file
    tokenizer, engine = connect_swarm(str(smollm2_path), [swarm.join[1]])
    engine.settle_checks = True  # the test reads every check's verdict
    yield tokenizer, engine
    engine.close()


@pytest.fixture(scope="module")
def expected(smollm2_path) -> str:
    return oracle(smollm2_path, PROMPT, N_NEW)


def generate(client, policy: CheckPolicy) -> TokenStream:
    """One generation of N_NEW tokens with spot checks of `policy`."""
    tokenizer, engine = client
    engine.check_policy = policy
    stream = TokenStream(engine, tokenizer, tokenizer.encode(PROMPT), GenerationRequest(max_new_tokens=N_NEW),
                         backend="swarm")
    stream.run()
    return stream


def wait_until_routed(engine, peer_id: str, span: tuple[int, int]) -> None:
    """Wait until the client's route over `span` takes `peer_id` (a liar's ten-fold boast wins only
    a few ms per step). The client keeps the RTT of its first ping to a peer, and a first ping on a
    busy machine (the new peer still loading, other tests' peers computing) can cost more than
    the boast wins, so the liar's RTT is measured again until the route takes it."""
    loop = engine._conn.loop

    def routed() -> bool:
        loop.run(engine.directory.probe([peer_id]), 30)
        spans = loop.run(engine.directory.peers(frozenset(), True), 30)
        plan = plan_route(spans, engine.manifest.n_layers, N_NEW, start=span[0], end=span[1])
        return peer_id in [h.peer_id for h in plan.hops]

    wait_for(routed, f"the client's route over {span} takes {peer_id}", 120)


@pytest.fixture
def liar(swarm, client, smollm2_path, request):
    """A lying 10:20 peer: `request.param` is the mode, or (mode, seed of its lies)."""
    mode, seed = request.param if isinstance(request.param, tuple) else (request.param, 0)
    peer = swarm.start(f"liar-{mode.replace(':', '-')}", *serve_args(smollm2_path, "10:20", *swarm.join),
                       env={"SWARM_TEST_LIE": mode, "SWARM_TEST_LIE_SEED": str(seed)})
    assert "TEST MODE SWARM_TEST_LIE" in peer.stderr_text()
    wait_until_routed(client[1], peer.peer_id, (10, 20))
    yield peer
    peer.stop()
    swarm.started.remove(peer)


def assert_caught_and_dropped(s: TokenStream, liar_id: str, client, span: tuple[int, int] = (10, 20)) -> list:
    """The liar (serving `span`) was caught, its hop rebuilt on honest peers, the text rolled back to
    the token after its first wrong row, and it is excluded and priced."""
    t = s.telemetry
    of_liar = [c for c in t.checks if c.peer_id == liar_id]
    caught = [c for c in of_liar if c.verdict == "caught"]
    assert caught, [dataclasses.asdict(c) for c in t.checks]
    assert all(c.verdict == "ok" for c in t.checks if c.peer_id != liar_id)  # nobody else flagged
    [f] = t.failovers
    assert (f.peer_id, f.reason, f.start, f.end) == (liar_id, FailureReason.WRONG_OUTPUT.value, *span)
    assert liar_id not in [h.peer_id for h in t.route] and liar_id not in f.replacements
    first_wrong = next(c.first_outside for c in caught)
    assert f.rewound_to == max(first_wrong + 1, t.prompt_tokens) <= f.position
    _, engine = client
    assert engine.exclusions.reason(liar_id) is FailureReason.WRONG_OUTPUT
    assert liar_id in engine.checks.standing.penalties(time.monotonic())
    return of_liar


def test_honest_peers_are_never_flagged_and_their_replays_are_bit_equal(swarm, client, expected):
    """4 concurrent generations (the peers batch their decode steps), every other decode step
    checked: every check recomputes the same hidden states bit for bit on the other honest peer."""
    streams: list[TokenStream] = []
    policy = CheckPolicy(rate=0.5, first_check_step=0, seed=3)
    threads = [threading.Thread(target=lambda: streams.append(generate(client, policy))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    checks = [c for s in streams for c in s.telemetry.checks]
    assert all(s.telemetry.checks for s in streams) and len(checks) >= 8
    assert {c.peer_id for c in checks} <= swarm.honest and {c.verdict for c in checks} == {"ok"}
    assert max(c.rel_l2 for c in checks) < DEFAULT_BAND.max_rel_l2
    assert [s.result.text for s in streams] == [expected] * 4
    assert all(s.telemetry.failovers == [] for s in streams)


@pytest.mark.parametrize("liar", ["noise"], indirect=True)
def test_a_peer_lying_on_every_step_is_caught_at_its_first_check(liar, client, expected):
    s = generate(client, CheckPolicy(seed=0))
    [first, *_] = assert_caught_and_dropped(s, liar.peer_id, client)
    assert first.verdict == "caught" and first.decode_step == CheckPolicy().first_check_step
    assert first.rel_l2 > first.max_rel_l2
    assert s.result.text == expected


@pytest.mark.parametrize("liar", [("noise:10", 4)], indirect=True)
def test_a_peer_lying_on_one_step_in_ten_is_caught_within_50_decode_steps(liar, client, expected):
    """With lie seed 4 the liar first lies at decode step 9, after the first check (step 2), which
    it passes; a later check of the default rate (client seed 0) catches it."""
    s = generate(client, CheckPolicy(seed=0))
    of_liar = assert_caught_and_dropped(s, liar.peer_id, client)
    caught = next(c for c in of_liar if c.verdict == "caught")
    assert of_liar[0].verdict == "ok" and of_liar[0].decode_step == CheckPolicy().first_check_step
    assert 9 <= caught.decode_step < 50 and caught.position >= s.telemetry.prompt_tokens + 9
    assert s.result.text == expected


@pytest.mark.parametrize("liar", ["lazy:Q4_0"], indirect=True)
def test_a_lazy_peer_serving_a_lower_quantization_is_caught_and_the_text_repaired(liar, client, expected):
    """SmolLM2's Q4_1 weights requantized to Q4_0: caught at the first check (decode step 2). Its
    prefill already changed the first token, so the route rolls back to the prompt's end, the
    stream withdraws the text it gave out (a `Correction` from the first character), and the
    repaired text equals llama.cpp's."""
    s = generate(client, CheckPolicy(seed=0))
    [first, *_] = assert_caught_and_dropped(s, liar.peer_id, client)
    assert first.verdict == "caught" and first.decode_step == CheckPolicy().first_check_step
    assert first.first_outside < s.telemetry.prompt_tokens  # wrong already in the prompt's rows
    [f] = s.telemetry.failovers
    assert f.rewound_to == s.telemetry.prompt_tokens
    [c] = s.corrections
    assert c.token_position == 0 and c.text and len(c.tokens) >= 3
    assert s.result.text == expected
    assert s.telemetry.generated_tokens == len(s.result.tokens)


@pytest.mark.parametrize("liar", ["lazy:Q4_0"], indirect=True)
def test_checking_the_prompt_first_keeps_a_lazy_peer_from_changing_any_token(liar, client, expected):
    """With `verify_prefill` the prompt's rows are checked before the first token is given out: the
    lazy peer is caught there, the route rebuilt, and the whole text equals llama.cpp's."""
    s = generate(client, CheckPolicy(seed=0, verify_prefill=True))
    [first, *_] = assert_caught_and_dropped(s, liar.peer_id, client)
    assert (first.verdict, first.decode_step) == ("caught", -1)
    assert s.result.text == expected


@pytest.mark.parametrize("liar", ["transit"], indirect=True)
def test_rows_altered_between_pushing_peers_break_the_receipt_chain(liar, client, expected):
    """The liar answers the client honestly but pushes noisy rows to the last peer: the last peer's
    receipt is not of the rows the liar answered, so the step is relayed again and the rest of the
    generation relays; the text is unchanged."""
    s = generate(client, CheckPolicy(rate=0.0, first_check_step=-1))
    assert liar.peer_id in [h.peer_id for h in s.telemetry.route]
    [brk] = [c for c in s.telemetry.checks if c.verdict == "chain_break"]
    assert brk.peer_id == liar.peer_id and brk.start == 10 and len(brk.checkers) == 1
    # the first step pushed: the prompt, unless the push stream was not open yet (then a decode step)
    assert brk.position == 0 or brk.position >= s.telemetry.prompt_tokens
    assert s.result.text == expected


def test_a_last_peer_answering_wrong_tokens_is_caught_and_honest_last_peers_replay_exactly(swarm, client, expected,
                                                                                          smollm2_path):
    """The last hop answers tokens: its check replays its recorded steps exactly and every token must
    come back the same. A 20:30 peer sampling from noisy logits is caught and the text repaired; after
    it, the two honest 20:30 peers check each other's tokens and agree at every check."""
    z2 = swarm.start("z2", *serve_args(smollm2_path, "20:30", *swarm.join))
    liar = swarm.start("liar-last", *serve_args(smollm2_path, "20:30", *swarm.join), env={"SWARM_TEST_LIE": "noise"})
    _, engine = client
    try:
        wait_for(lambda: z2.peer_id in {s.peer_id for s in engine._conn.loop.run(engine.directory.peers(
            frozenset(), True), 30) if 0 <= (s.rtt_ms or -1) < float("inf")}, "the client measured z2's RTT", 120)
        wait_until_routed(engine, liar.peer_id, (20, 30))
        s = generate(client, CheckPolicy(rate=0.5, seed=0))
        assert_caught_and_dropped(s, liar.peer_id, client, span=(20, 30))
        honest_last = [c for c in s.telemetry.checks if c.start == 20 and c.peer_id != liar.peer_id]
        assert honest_last and {c.verdict for c in honest_last} == {"ok"}
        assert s.result.text == expected
    finally:
        for p in (liar, z2):
            p.stop()
            swarm.started.remove(p)


@pytest.fixture(scope="module")
def qwen_liar_swarm(qwen_path, tmp_path_factory):
    """Qwen2.5-Coder-0.5B: 12:24, an honest 0:12 on 2 threads (the checks' replays) and a 0:12 peer
    lying on every step on 1 thread, which boasts ten times its speed so that routes take it. (The
    liar serves the first span: a check replays a hop whose output the next hop received, so the
    last span, which answers tokens, is never the one checked.)"""
    ps = PeerSet(tmp_path_factory.mktemp("verify_qwen"))
    last = ps.start("q1", *serve_args(qwen_path, "12:24", "--new-swarm"))
    join = ("--initial-peers", last.maddrs[0])
    ps.start("h", *serve_args(qwen_path, "0:12", *join, "--threads", "2"))
    ps.liar = ps.start("liar", *serve_args(qwen_path, "0:12", *join), env={"SWARM_TEST_LIE": "noise"})
    ps.join = join
    yield ps
    ps.stop_all()


def test_a_qwen_peer_lying_on_every_step_is_caught_and_the_text_repaired(qwen_liar_swarm, qwen_path,
                                                                         tmp_path, monkeypatch):
    """The same check on a second model, the replay crossing thread counts (the liar computes on 1,
    the honest peer replays on 2) with Qwen's repacked Q4_K kernels: the liar is caught at its first
    check, nobody else is flagged, and the text equals llama.cpp's whole model."""
    monkeypatch.setenv("SWARM_HOME", str(tmp_path))
    tokenizer, engine = connect_swarm(str(qwen_path), [qwen_liar_swarm.join[1]])
    engine.settle_checks = True
    liar_id = qwen_liar_swarm.liar.peer_id
    try:
        wait_until_routed(engine, liar_id, (0, 12))
        s = generate((tokenizer, engine), CheckPolicy(seed=0))
        [first, *_] = assert_caught_and_dropped(s, liar_id, (tokenizer, engine), span=(0, 12))
        assert first.verdict == "caught" and first.decode_step == CheckPolicy().first_check_step
        assert s.result.text == oracle(qwen_path, PROMPT, N_NEW)
    finally:
        engine.close()
