"""Spot checks of a route session's hops (swarm/client/checks.py) over simulated span peers.

The simulated peers (sim/transport.py) compute exactly, so an honest replay equals the checked
peer's answers bit for bit, and a peer scripted to lie ("lie": wrong low halves of its hidden
states after a number of Forward frames) is outside any band.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random

import numpy as np

from sim.transport import SimSwarm, SpanPeer, VirtualClock, embed
from swarm.client.checks import EVIDENCE_FILE, CheckContext, SpotChecks, read_evidence
from swarm.client.status import status_report
from swarm.client.session import Rewound, RouteSession, SessionSpec
from swarm.client.telemetry import GenerationTelemetry
from swarm.route.failover import Exclusions, FailoverPolicy, FailureReason
from swarm.route.verify import DEFAULT_BAND, CheckPolicy, Standing
from swarm.wire import Open
from swarm.sampling import SamplingParams

N_LAYERS = 30
PROMPT = [11, 22, 33, 44, 55, 66, 77]
N_NEW = 24
POLICY = FailoverPolicy(replay_chunk_tokens=4)


def swarm_of(liar_fault: str = "", lie_after: int = 0, third: bool = True,
             id_layers: int = 0) -> list[SpanPeer]:
    """0:10, 10:20 ("m1", preferred by a lower RTT; `liar_fault` after `lie_after` Forwards), 10:20
    ("m2", and "m3" when `third`), 20:30; layers [0, id_layers) read token ids."""
    peers = [
        SpanPeer("a", 0, 10, N_LAYERS, id_layers=id_layers),
        SpanPeer("m1", 10, 20, N_LAYERS, rtt_ms=0.5, fault=liar_fault, fault_after=lie_after,
                 id_layers=id_layers),
        SpanPeer("m2", 10, 20, N_LAYERS, rtt_ms=5.0, id_layers=id_layers),
        SpanPeer("z", 20, 30, N_LAYERS, id_layers=id_layers),
    ]
    if third:
        peers.append(SpanPeer("m3", 10, 20, N_LAYERS, rtt_ms=6.0, id_layers=id_layers))
    return peers


def generate(peers: list[SpanPeer], check: CheckPolicy, standing: Standing | None = None, evidence_dir=None,
             token_ids: bool = False):
    """Prefill PROMPT in chunks of 3, decode N_NEW tokens with spot checks, dropping the tokens a
    rewind replaces as swarm.client.generate's loop does; returns (tokens, telemetry, exclusions,
    standing). `token_ids`: every Forward carries its rows' token ids (`SessionSpec.token_ids`)."""
    clock = VirtualClock()
    swarm = SimSwarm(peers, clock)
    exclusions = Exclusions(POLICY.exclusion_s)
    standing = standing or Standing(check)
    telemetry = GenerationTelemetry(backend="sim")
    spec = SessionSpec("ab" * 8, "client", N_LAYERS, len(PROMPT) + N_NEW, SamplingParams(),
                       token_ids=token_ids)

    async def go() -> list[int]:
        s = RouteSession(spec, swarm, swarm, exclusions, telemetry, POLICY, now=clock.now, sleep=clock.sleep,
                         rng=random.Random(0))
        ctx = CheckContext(check, DEFAULT_BAND, standing, evidence_dir)
        s.checks = SpotChecks(ctx, spec, swarm, swarm, exclusions, POLICY, telemetry, now=clock.now,
                              rng=random.Random(1))
        s.checks.settle_on_close = True
        try:
            await s.open(prompt_tokens=len(PROMPT), prompt_ids=np.array(PROMPT))
            x = np.concatenate([embed(t) for t in PROMPT])
            for i in range(0, len(PROMPT), 3):
                tok = await s.step(x[i : i + 3], token_ids=np.array(PROMPT[i : i + 3]))
            tok = await s.verify_prefill() or tok  # as swarm.client.remote.RemoteSession.prefill does
            tokens = [tok.token]
            while True:
                while len(tokens) < N_NEW:
                    try:
                        tok = await s.step(embed(tokens[-1]), token_ids=np.array(tokens[-1:]))
                        tokens.append(tok.token)
                    except Rewound as r:
                        assert len(PROMPT) <= r.position < len(PROMPT) + len(tokens)
                        del tokens[r.position - len(PROMPT):]
                        tokens.append(r.token.token)
                    await asyncio.sleep(0)  # let the check tasks run beside the steps, as on a real loop
                settled = await s.settle()  # as swarm.client.generate's loop does after the last token
                if settled is None:
                    return tokens
                del tokens[s.pos - len(PROMPT):]
                tokens.append(settled.token)
        finally:
            await s.close()
        assert swarm.open_sessions() == 0

    return asyncio.run(go()), telemetry, exclusions, standing


# The simulated peers fold each step's row count into their state, as llama.cpp's kernels may round
# regrouped rows otherwise: checks here replay the recorded steps (regroup off), bit for bit.
EVERY_STEP = CheckPolicy(rate=1.0, first_check_step=0, seed=5, regroup=False)


def test_honest_peers_are_never_flagged_and_the_text_is_unchanged():
    plain, _, _, _ = generate(swarm_of(), CheckPolicy(rate=0.0, first_check_step=-1))
    tokens, t, exclusions, standing = generate(swarm_of(), EVERY_STEP)
    assert tokens == plain
    # one check in flight at a time: a check due while one runs is skipped
    steps = [c.decode_step for c in t.checks]
    assert len(steps) >= 3 and steps == sorted(set(steps)) and {c.verdict for c in t.checks} == {"ok"}
    assert all(c.peer_id == "m1" and c.rel_l2 == 0.0 and c.checkers == ["m2"] for c in t.checks)
    assert t.failovers == [] and standing.penalties(0.0) == {}


def test_each_check_of_a_hop_sends_only_the_rows_since_its_previous_check():
    """The checker's session stays open for the generation: the checks of m1 together compare each
    row it computed once, and still agree bit for bit (the checker's KV cache holds the rows before)."""
    _, t, _, _ = generate(swarm_of(), EVERY_STEP)
    assert len(t.checks) >= 3 and {c.verdict for c in t.checks} == {"ok"}
    last = t.checks[-1]
    # after decode step s m1 has computed len(PROMPT) + s rows (the prompt's last chunk, of one
    # row, is step 0 to the schedule); a check replaying from position 0 each time sends ~10x more
    assert sum(c.rows for c in t.checks) == len(PROMPT) + last.decode_step
    assert all(c.rel_l2 == 0.0 for c in t.checks)


def test_after_the_route_is_rebuilt_a_hop_is_checked_again_from_position_0():
    """m1 is caught and the route rebuilt, replaying every hop: z's kept checker (z2) holds rows
    that z's new session replayed, answers never checked, so z's next check starts over in a new
    session on z2; every other check of z sends only the rows since the one before."""
    z2 = SpanPeer("z2", 20, 30, N_LAYERS, rtt_ms=5.0)
    opens = []
    handle = z2.handle

    def counting(session_id, frame):  # a spy on the simulated peer: which sessions z2 opened
        if isinstance(frame, Open):
            opens.append(session_id)
        return handle(session_id, frame)

    z2.handle = counting
    plain, _, _, _ = generate(swarm_of(), CheckPolicy(rate=0.0, first_check_step=-1))
    tokens, t, _, _ = generate([*swarm_of("lie", lie_after=6), z2], EVERY_STEP)
    assert tokens == plain and [f.peer_id for f in t.failovers] == ["m1"]
    of_z = [c for c in t.checks if c.peer_id == "z"]
    assert len(of_z) >= 4 and {c.verdict for c in of_z} == {"ok"}
    assert len(opens) == 2


def test_checks_of_hops_that_read_token_ids_replay_them_with_each_rows_id():
    # layers 0:20 read token ids: the checker of m1 (10:20) computes as m1 only with the same ids
    plain, _, _, _ = generate(swarm_of(id_layers=20), CheckPolicy(rate=0.0, first_check_step=-1),
                              token_ids=True)
    tokens, t, _, standing = generate(swarm_of(id_layers=20), EVERY_STEP, token_ids=True)
    assert tokens == plain
    assert len(t.checks) >= 3 and {c.verdict for c in t.checks} == {"ok"}
    assert all(c.peer_id == "m1" and c.rel_l2 == 0.0 and c.checkers == ["m2"] for c in t.checks)
    assert t.failovers == [] and standing.penalties(0.0) == {}


def test_a_lying_hop_is_caught_dropped_and_the_route_rebuilt_without_it():
    plain, _, _, _ = generate(swarm_of(), CheckPolicy(rate=0.0, first_check_step=-1))
    tokens, t, exclusions, standing = generate(swarm_of("lie", lie_after=6), EVERY_STEP)
    caught = [c for c in t.checks if c.verdict != "ok"]
    assert caught and all((c.peer_id, c.verdict) == ("m1", "caught") for c in caught)
    first = caught[0]
    # m1 computed 3 prompt chunks and 3 decode steps honestly: the first wrong row is the next one
    # (the catching check may come some steps later: the first check, of every hop, takes longer)
    assert first.first_outside == len(PROMPT) + 3 <= first.position
    assert first.rel_l2 > DEFAULT_BAND.max_rel_l2
    assert first.checkers == ["m2", "m3"]  # the second checker agreed with the first
    [f] = t.failovers
    assert (f.peer_id, f.reason) == ("m1", FailureReason.WRONG_OUTPUT.value)
    assert "m1" not in f.replacements and [h.peer_id for h in t.route] == f.replacements
    # rolled back to the token after the first wrong row, the whole route replayed up to it from
    # the embedded rows; every token from there on was recomputed on honest peers
    assert f.rewound_to == first.first_outside + 1 < f.position
    assert f.replayed_tokens == f.rewound_to
    assert exclusions.reason("m1") is FailureReason.WRONG_OUTPUT
    assert standing.penalties(0.0) == {"m1": CheckPolicy().penalty_ms}
    assert tokens == plain


def test_without_a_second_checker_the_checked_peer_is_caught():
    _, t, _, _ = generate(swarm_of("lie", lie_after=6, third=False), EVERY_STEP)
    caught = [c for c in t.checks if c.verdict != "ok"]
    assert caught[0].peer_id == "m1" and caught[0].checkers == ["m2"]



def test_a_peer_that_starts_lying_after_the_first_check_is_caught_by_the_next_sweep():
    """m1 answers honestly until decode step 5, after the first check (step 2): with no random
    checks it would never be caught; the sweep at step 12 checks every row it computed and catches
    it, and the repaired text equals the fault-free run's."""
    plain, _, _, _ = generate(swarm_of(), CheckPolicy(rate=0.0, first_check_step=-1))
    _, t, _, _ = generate(swarm_of("lie", lie_after=8),
                          CheckPolicy(rate=0.0, first_check_step=2, sweep_steps=0, seed=5, regroup=False))
    assert [c.verdict for c in t.checks] == ["ok"]  # the first check only: m1 still honest then
    tokens, t, exclusions, _ = generate(swarm_of("lie", lie_after=8),
                                        CheckPolicy(rate=0.0, first_check_step=2, sweep_steps=10, seed=5,
                                                    regroup=False))
    caught = [c for c in t.checks if c.verdict == "caught"]
    assert [(c.peer_id, c.decode_step) for c in caught] == [("m1", 12)]
    assert exclusions.reason("m1") is FailureReason.WRONG_OUTPUT
    assert tokens == plain

def test_a_verdict_after_the_last_token_still_repairs_the_text():
    """The only check starts at the last decode step: the generation waits for it at its end, the
    liar is dropped, and the text is regenerated from its first wrong row (with `settle_at_end` off
    the verdict comes too late: caught, but nothing repaired)."""
    plain, _, _, _ = generate(swarm_of(), CheckPolicy(rate=0.0, first_check_step=-1))
    last = CheckPolicy(rate=0.0, first_check_step=N_NEW - 2, seed=5, regroup=False)
    tokens, t, _, _ = generate(swarm_of("lie", lie_after=6), last)
    [caught] = [c for c in t.checks if c.verdict == "caught"]
    assert caught.decode_step == N_NEW - 2
    [f] = t.failovers
    assert f.peer_id == "m1" and f.rewound_to == caught.first_outside + 1 == len(PROMPT) + 4
    assert tokens == plain
    late, t, _, _ = generate(swarm_of("lie", lie_after=6), dataclasses.replace(last, settle_at_end=False))
    assert [c.verdict for c in t.checks] == ["caught"] and t.failovers == []
    assert late != plain


def test_a_lying_checker_is_outvoted_and_caught_instead():
    """m2, the first checker (cheaper than m3), lies from its first Forward; m1 is honest."""
    peers = swarm_of()
    peers[2].fault, peers[2].fault_after = "lie", 0
    tokens, t, exclusions, _ = generate(peers, CheckPolicy(rate=0.0, first_check_step=2, seed=5, regroup=False))
    verdicts = [(c.peer_id, c.verdict) for c in t.checks]
    assert verdicts == [("m1", "checker_lied"), ("m2", "caught")]
    assert exclusions.reason("m2") is FailureReason.WRONG_OUTPUT and exclusions.reason("m1") is None
    assert t.failovers == []  # m1 stays in the route


def test_a_caught_peer_costs_more_in_later_routes():
    standing = Standing(EVERY_STEP)
    generate(swarm_of("lie", lie_after=6), EVERY_STEP, standing)
    # a fresh client session (exclusions not shared) still routes around it by price
    _, t, _, _ = generate(swarm_of(), CheckPolicy(rate=0.0, first_check_step=-1), standing)
    assert [h.peer_id for h in t.route][1] == "m2"


def test_the_evidence_is_written_for_swarm_status(tmp_path):
    _, t, _, _ = generate(swarm_of("lie", lie_after=6), EVERY_STEP, evidence_dir=tmp_path)
    (tmp_path / EVIDENCE_FILE).open("a").write("not json\n{\"peer_id\": 1}\n")  # junk lines are skipped
    [line] = read_evidence(tmp_path, "ab" * 8)
    assert (line["peer_id"], line["verdict"], line["first_outside"]) == ("m1", "caught", len(PROMPT) + 3)
    assert read_evidence(tmp_path, "cd" * 8) == () and read_evidence(tmp_path / "none", "ab" * 8) == ()
    report = status_report("ab" * 8, N_LAYERS, [], caught=(line,))
    assert any(v.startswith("caught computing wrong") and "m1" in v and "10:20" in v for v in report.verdict())
    assert report.to_dict()["caught"] == [line]


def test_a_regrouped_check_of_a_peer_that_rounds_by_grouping_is_outside_the_band():
    """Why regrouping needs a band: a peer whose results depend on how rows are grouped (as the
    simulated ones do, by design) differs from a one-prefill recomputation though it is honest."""
    _, t, _, _ = generate(swarm_of(), CheckPolicy(rate=0.0, first_check_step=2, seed=5))
    assert t.checks and t.checks[0].rel_l2 > 0.0


def test_a_dead_checker_is_excluded_and_the_next_one_checks():
    """m2, the cheapest checker, died before the generation (its record lingers): the check moves
    on to m3 instead of giving up, and m2 is excluded as unreachable."""
    peers = swarm_of()
    peers[2].state = "dead"
    _, t, exclusions, _ = generate(peers, CheckPolicy(rate=0.0, first_check_step=2, seed=5, regroup=False))
    [c] = t.checks
    assert (c.peer_id, c.checkers, c.verdict) == ("m1", ["m3"], "ok")
    assert exclusions.reason("m2") is FailureReason.UNREACHABLE


def test_checking_the_prompt_before_the_first_token_keeps_every_token_of_a_liar_from_the_start():
    """m1 lies from its second Forward (the prompt's second chunk) on: with `verify_prefill` it is
    caught before the first token is given out, and every token equals the fault-free run's."""
    plain, _, _, _ = generate(swarm_of(), CheckPolicy(rate=0.0, first_check_step=-1))
    check = CheckPolicy(rate=0.0, first_check_step=-1, regroup=False, verify_prefill=True)
    tokens, t, exclusions, _ = generate(swarm_of("lie", lie_after=1), check)
    assert tokens == plain
    [c] = t.checks
    assert (c.peer_id, c.verdict, c.decode_step) == ("m1", "caught", -1)
    assert 3 <= c.position < len(PROMPT)  # the worst row: one of the rows m1 lied on
    [f] = t.failovers
    assert (f.peer_id, f.reason, f.position) == ("m1", "wrong_output", len(PROMPT))
    unverified, _, _, _ = generate(swarm_of("lie", lie_after=1), CheckPolicy(rate=0.0, first_check_step=-1))
    assert unverified[0] != plain[0]  # without it the first token is the liar's
