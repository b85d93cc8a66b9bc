"""The route session's failover policy over simulated span peers (sim/transport.py).

Every generation is compared with a fault-free run over one peer that serves the whole model:
the simulated blocks make each output depend on every earlier row in order, so a failover that
replayed too little, too much or out of order gives other tokens.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from sim.transport import SimSwarm, SpanPeer, VirtualClock, embed
from swarm.client.session import RouteSession, SessionSpec
from swarm.client.telemetry import GenerationTelemetry
from swarm.errors import NoRoute, SessionTooLong, SwarmError
from swarm.route.failover import Exclusions, FailoverPolicy
from swarm.sampling import SamplingParams
from swarm.spec.verify import accepted, draft_budget

N_LAYERS = 30
PROMPT = [11, 22, 33, 44, 55, 66, 77]
N_NEW = 12
POLICY = FailoverPolicy(replay_chunk_tokens=4)


def peer(peer_id: str, start: int, end: int, **kw) -> SpanPeer:
    return SpanPeer(peer_id, start, end, N_LAYERS, **kw)


class Run:
    """A simulated swarm, its clock, and the exclusions its client keeps across generations."""

    def __init__(self, peers: list[SpanPeer], policy: FailoverPolicy = POLICY, **spec):
        self.clock = VirtualClock()
        self.swarm = SimSwarm(peers, self.clock)
        self.policy = policy
        self.exclusions = Exclusions(policy.exclusion_s)
        self.spec = spec  # SessionSpec's token_ids / rollback_exact

    def session(self, telemetry: GenerationTelemetry) -> RouteSession:
        spec = SessionSpec("ab" * 8, "client", N_LAYERS, len(PROMPT) + N_NEW, SamplingParams(), **self.spec)
        return RouteSession(
            spec,
            self.swarm,
            self.swarm,
            self.exclusions,
            telemetry,
            self.policy,
            now=self.clock.now,
            sleep=self.clock.sleep,
            rng=random.Random(0),
        )

    def generate(self, n_new: int = N_NEW, on_token=None) -> tuple[list[int], GenerationTelemetry]:
        """Prefill PROMPT in chunks of 3, then greedy-style decode n_new tokens; always closes."""
        telemetry = GenerationTelemetry(backend="sim")

        async def go() -> list[int]:
            s = self.session(telemetry)
            try:
                await s.open()
                x = np.concatenate([embed(t) for t in PROMPT])
                for i in range(0, len(PROMPT), 3):
                    tok = await s.step(x[i : i + 3], token_ids=np.array(PROMPT[i : i + 3]))
                tokens = [tok.token]
                while len(tokens) < n_new:
                    if on_token:
                        on_token(len(tokens))
                    tokens.append((await s.step(embed(tokens[-1]), token_ids=np.array(tokens[-1:]))).token)
                return tokens
            finally:
                await s.close()

        return asyncio.run(go()), telemetry


    def generate_speculative(self, draft, k: int = 3, group_rows: int | None = None):
        """Like `generate`, with verify passes of `draft(tokens, k)` (RemoteSession.verify's steps).
        Returns the tokens, the number of drafted tokens kept per pass, and the telemetry."""
        kept: list[int] = []
        telemetry = GenerationTelemetry(backend="sim")

        async def go() -> list[int]:
            s = self.session(telemetry)
            try:
                await s.open()
                x = np.concatenate([embed(t) for t in PROMPT])
                for i in range(0, len(PROMPT), 3):
                    tok = await s.step(x[i : i + 3])
                tokens = [tok.token]
                while len(tokens) < N_NEW:
                    d = draft(tokens, draft_budget(k, len(tokens), N_NEW))
                    if not d:
                        tokens.append((await s.step(embed(tokens[-1]))).token)
                        continue
                    rows = np.concatenate([embed(t) for t in [tokens[-1], *d]])
                    t = await s.step(rows, verify=True, group_rows=group_rows)
                    new = accepted(d, t.tokens)
                    s.keep(len(new))
                    kept.append(len(new) - 1)
                    tokens += new
                return tokens
            finally:
                await s.close()

        return asyncio.run(go()), kept, telemetry


@pytest.fixture(scope="module")
def expected() -> list[int]:
    tokens, _ = Run([peer("whole", 0, N_LAYERS)]).generate()
    return tokens


def three_spans(**middle_fault) -> list[SpanPeer]:
    """0:10, 10:20 (the faulty "m1", preferred by a lower RTT), 10:20 ("m2"), 20:30."""
    return [
        peer("a", 0, 10),
        peer("m1", 10, 20, rtt_ms=0.5, **middle_fault),
        peer("m2", 10, 20, rtt_ms=5.0),
        peer("z", 20, 30),
    ]


def test_fault_free_chain_equals_the_whole_model(expected):
    run = Run(three_spans())
    tokens, t = run.generate()
    assert tokens == expected
    assert [h.peer_id for h in t.route] == ["a", "m1", "z"]
    assert t.failovers == [] and run.swarm.open_sessions() == 0


@pytest.mark.parametrize(
    "fault, reason",
    [("die", "unreachable"), ("freeze", "timeout"), ("leave", "shutting_down"), ("malformed", "malformed")],
)
def test_middle_hop_fails_mid_generation_and_the_text_is_unchanged(expected, fault, reason):
    run = Run(three_spans(fault=fault, fault_after=8))  # 3 prefill chunks + 5 decode steps
    tokens, t = run.generate()
    assert tokens == expected
    [f] = t.failovers
    assert (f.peer_id, f.start, f.end, f.reason) == ("m1", 10, 20, reason)
    assert f.replacements == ["m2"]
    # m1 handled 3 prompt chunks and 5 decode steps: every one of those rows is replayed on m2
    assert f.replayed_tokens == f.position == len(PROMPT) + 5
    assert [h.peer_id for h in t.route] == ["a", "m2", "z"]
    assert run.swarm.open_sessions() == 0


def test_a_replay_chunk_smaller_than_a_recorded_step_does_not_cut_the_step(expected):
    # prompt steps of 3 rows, replay frames of at most 2: a cut step would compute as two (other
    # tokens on these peers, as on llama.cpp's kernels); the frame grows to hold it instead
    run = Run(three_spans(fault="die", fault_after=8), FailoverPolicy(replay_chunk_tokens=2))
    tokens, t = run.generate()
    assert tokens == expected and len(t.failovers) == 1


def test_frozen_hop_is_detected_by_its_step_timeout_not_a_fixed_one(expected):
    run = Run(three_spans(fault="freeze", fault_after=8))
    _, t = run.generate()
    [f] = t.failovers
    # floor + slack * (1/200 steps/s + 0.5 ms rtt) = 3.0 + 8 * 0.0055 s, plus the replay's round trips
    assert 3000.0 < f.stall_ms < 3100.0


def test_replacement_may_be_several_peers(expected):
    peers = [peer("a", 0, 10), peer("m1", 10, 20, fault="die", fault_after=8), peer("b", 10, 15)]
    peers += [peer("c", 15, 20), peer("z", 20, 30)]
    run = Run(peers)
    tokens, t = run.generate()
    assert tokens == expected
    assert t.failovers[0].replacements == ["b", "c"]
    assert [h.peer_id for h in t.route] == ["a", "b", "c", "z"]


def test_last_hop_failure_is_replayed_too(expected):
    peers = [peer("a", 0, 15), peer("z1", 15, 30, rtt_ms=0.5, fault="die", fault_after=6), peer("z2", 15, 30)]
    run = Run(peers)
    tokens, t = run.generate()
    assert tokens == expected
    assert [f.replacements for f in t.failovers] == [["z2"]]


def test_replacement_that_fails_during_replay_is_replaced_again(expected):
    peers = three_spans(fault="die", fault_after=8)
    peers.insert(
        2, peer("m0", 10, 20, rtt_ms=1.0, fault="die", fault_after=1)
    )  # dies on its first replay chunk
    run = Run(peers)
    tokens, t = run.generate()
    assert tokens == expected
    assert [f.replacements for f in t.failovers] == [["m2"]]
    assert t.retries == 1
    assert run.swarm.open_sessions() == 0


def test_no_replacement_raises_no_route_and_leaks_nothing():
    peers = [peer("a", 0, 10), peer("m1", 10, 20, fault="die", fault_after=8), peer("z", 20, 30)]
    run = Run(peers)
    with pytest.raises(NoRoute, match=r"layers 10:20"):
        run.generate()
    assert run.swarm.open_sessions() == 0


def test_a_session_longer_than_every_peer_takes_fails_at_open_without_retries():
    small = len(PROMPT) + N_NEW - 1
    peers = [peer("a", 0, 10), peer("m", 10, 20, free_cache_tokens=small), peer("z", 20, 30)]
    run = Run(peers)
    with pytest.raises(SessionTooLong, match=f"needs {len(PROMPT) + N_NEW} KV tokens .* layers 10:20"):
        run.generate()
    assert run.clock.now_s < POLICY.backoff_base_s  # no backoff: asking again cannot help
    assert run.swarm.open_sessions() == 0


def test_mid_generation_a_replacement_too_small_is_a_plain_no_route_not_a_request_error():
    # the big peer leaves (its record withdrawn); the only other one for its layers takes shorter
    # sessions: the request was fine, the swarm lost the peers that could hold it
    peers = [peer("a", 0, 10), peer("m1", 10, 20, fault="leave", fault_after=8),
             peer("m2", 10, 20, rtt_ms=5.0, free_cache_tokens=len(PROMPT) + N_NEW - 1), peer("z", 20, 30)]
    run = Run(peers)
    with pytest.raises(NoRoute, match="no live peer left for layers 10:20 can hold this session") as e:
        run.generate(on_token=lambda n: run.swarm.withdrawn.add("m1") if n == 5 else None)
    assert not isinstance(e.value, SessionTooLong)
    assert run.swarm.open_sessions() == 0


def test_failovers_per_generation_are_bounded():
    peers = [peer("a", 0, 10), peer("z", 20, 30)]
    peers += [peer(f"m{i}", 10, 20, rtt_ms=1.0 + i, fault="die", fault_after=4 + i) for i in range(6)]
    run = Run(peers, FailoverPolicy(max_failovers=3, replay_chunk_tokens=4))
    with pytest.raises(SwarmError, match="gave up after 3 failovers"):
        run.generate()
    assert run.swarm.open_sessions() == 0


def test_busy_peer_at_open_is_retried_elsewhere_with_backoff(expected):
    peers = three_spans(max_sessions=0, announced_sessions_free=1)  # a stale record: "1 free"
    run = Run(peers)
    tokens, t = run.generate()
    assert tokens == expected and t.retries == 1
    assert [h.peer_id for h in t.route] == ["a", "m2", "z"]
    assert run.clock.now_s >= POLICY.backoff_base_s * 0.5  # the second attempt waited


def test_exclusions_outlive_a_generation_then_expire(expected):
    run = Run(three_spans(fault="freeze", fault_after=8))
    run.generate()
    run.swarm.by_id["m1"].thaw()  # it runs again, but the client stays away for a while
    _, t = run.generate()
    assert [h.peer_id for h in t.route] == ["a", "m2", "z"]
    run.clock.now_s += POLICY.exclusion_s
    tokens, t = run.generate()
    assert [h.peer_id for h in t.route] == ["a", "m1", "z"] and tokens == expected


def test_restarted_peer_is_used_again_at_once(expected):
    run = Run(three_spans(fault="die", fault_after=8))
    run.generate()
    run.swarm.by_id["m1"].restart()  # same identity, new incarnation in its announcement
    tokens, t = run.generate()
    assert [h.peer_id for h in t.route] == ["a", "m1", "z"] and tokens == expected


def test_excluded_peer_that_answers_a_fresh_probe_is_used_before_no_route(expected):
    peers = [peer("a", 0, 10), peer("m1", 10, 20, fault="freeze", fault_after=8), peer("z", 20, 30)]
    run = Run(peers)
    with pytest.raises(NoRoute):
        run.generate()
    run.swarm.by_id["m1"].thaw()  # the only 10:20 peer, still excluded
    tokens, t = run.generate()
    assert [h.peer_id for h in t.route] == ["a", "m1", "z"] and tokens == expected


def test_unreachable_peer_at_plan_time_is_left_out(expected):
    peers = three_spans()
    peers[1].state = "dead"  # its record lingers in the DHT
    run = Run(peers)
    tokens, t = run.generate()
    assert [h.peer_id for h in t.route] == ["a", "m2", "z"] and tokens == expected
    assert t.failovers == []


def test_cancelled_step_then_close_releases_every_peer_session():
    peers = three_spans()
    run = Run(peers)
    telemetry = GenerationTelemetry(backend="sim")

    async def go() -> None:
        s = run.session(telemetry)
        await s.open()
        x = np.concatenate([embed(t) for t in PROMPT])
        peers[3].state = "hung"  # the last hop never answers: the caller gives up (Ctrl-C)
        task = asyncio.ensure_future(s.step(x))
        while peers[1].forwards == 0:  # until the step is past the middle hop
            await asyncio.sleep(0)
        peers[3].state = "up"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert run.swarm.open_sessions() > 0
        await s.close()

    asyncio.run(go())
    assert run.swarm.open_sessions() == 0


def test_a_peer_that_answered_garbage_is_not_forgiven_by_a_probe():
    peers = [peer("a", 0, 10), peer("m1", 10, 20, fault="malformed", fault_after=8), peer("z", 20, 30)]
    run = Run(peers)
    with pytest.raises(NoRoute, match="1 excluded"):
        run.generate()  # m1 is alive (it answers pings) but stays excluded: no route for 10:20
    assert run.swarm.by_id["m1"].forwards == 9  # it was not tried again


def flawed_draft(expected: list[int]):
    """Drafts the right continuation, except a wrong second token on every other pass and nothing
    on every fifth: passes with rejected rows, fully kept ones and plain decode steps."""
    calls = [0]

    def draft(tokens: list[int], k: int) -> list[int]:
        calls[0] += 1
        d = list(expected[len(tokens) : len(tokens) + k])
        if calls[0] % 5 == 0:
            return []
        if calls[0] % 2 == 0 and len(d) > 1:
            d[1] = (d[1] + 1) % 50_000
        return d

    return draft


ID_LAYERS = 10
"""Layers [0, ID_LAYERS) of the token-id tests read each row's token id (deepseek4's hash layers)."""


@pytest.fixture(scope="module")
def expected_with_ids(expected) -> list[int]:
    tokens, _ = Run([peer("whole", 0, N_LAYERS, id_layers=ID_LAYERS)], token_ids=True).generate()
    assert tokens != expected  # the ids enter the computation
    return tokens


def test_token_ids_reach_the_layers_that_read_them_through_a_failover_replay(expected_with_ids):
    # the first hop, which reads the ids, dies after the prompt's 3 frames and 2 decode steps: its
    # replacement must be replayed every recorded row with the id of its position
    run = Run([peer("a1", 0, 10, rtt_ms=0.5, id_layers=ID_LAYERS, fault="die", fault_after=5),
               peer("a2", 0, 10, rtt_ms=5.0, id_layers=ID_LAYERS), peer("m", 10, 20, id_layers=ID_LAYERS),
               peer("z", 20, 30, id_layers=ID_LAYERS)], token_ids=True)
    tokens, t = run.generate()
    assert tokens == expected_with_ids
    assert [(f.peer_id, f.replacements) for f in t.failovers] == [("a1", ["a2"])]
    assert t.failovers[0].replayed_tokens == len(PROMPT) + 2


def test_a_peer_that_reads_token_ids_refuses_forwards_without_them():
    run = Run([peer("a", 0, 10, id_layers=ID_LAYERS), peer("z", 10, 30, id_layers=ID_LAYERS)])
    t = GenerationTelemetry(backend="sim")

    async def go():
        s = run.session(t)  # a spec without token_ids: its Forwards carry none
        try:
            await s.open()
            with pytest.raises(NoRoute):
                await s.step(np.concatenate([embed(tok) for tok in PROMPT]))
        finally:
            await s.close()

    asyncio.run(go())
    assert [(f.peer_id, f.reason) for f in t.failovers] == [("a", "error")]
    assert "layers [0, 10) read token ids" in t.failovers[0].message
    assert run.swarm.open_sessions() == 0


def test_a_route_that_sends_token_ids_needs_them_for_every_step():
    async def go():
        s = Run([peer("whole", 0, N_LAYERS)], token_ids=True).session(GenerationTelemetry(backend="sim"))
        try:
            await s.open()
            with pytest.raises(ValueError, match="give 2, one per row"):
                await s.step(np.concatenate([embed(1), embed(2)]))
            with pytest.raises(ValueError, match="give 2, one per row"):
                await s.step(np.concatenate([embed(1), embed(2)]), token_ids=np.array([1]))
            assert s.pos == 0
        finally:
            await s.close()

    asyncio.run(go())


def test_rows_kept_short_of_a_verify_pass_roll_back_where_hops_keep_no_positions_either():
    # hops of a recurrent or compressed state roll a verify pass back from a checkpoint
    # (swarm/peer/checkpoints.py; real peers: tests/integration/test_hybrid_peer.py): the session
    # keeps part of a pass as on any model, and its next step rolls the hops back
    async def go(rows: list[list[int]], rollback_exact: bool) -> tuple[int, int]:
        run = Run([peer("whole", 0, N_LAYERS)], rollback_exact=rollback_exact)
        s = run.session(GenerationTelemetry(backend="sim"))
        try:
            await s.open()
            await s.step(np.concatenate([embed(t) for t in PROMPT]))
            for r in rows:
                await s.step(np.concatenate([embed(t) for t in r]), verify=len(r) > 1)
                if len(r) > 1:
                    s.keep(1)
            return s.pos, (await s.step(embed(6))).token
        finally:
            await s.close()

    kept_one = asyncio.run(go([[4, 5]], rollback_exact=False))
    assert kept_one == asyncio.run(go([[4]], rollback_exact=True))
    assert kept_one[0] == len(PROMPT) + 1


def test_speculative_generation_equals_plain_decoding(expected):
    run = Run(three_spans())
    tokens, kept, _ = run.generate_speculative(flawed_draft(expected))
    assert tokens == expected
    assert 1 in kept and 3 in kept  # some passes rejected rows (rolled back by rewind), some kept all
    assert run.swarm.open_sessions() == 0


def test_a_failover_after_rejected_rows_replays_exactly_the_kept_rows(expected):
    # m1 dies after 3 prefill chunks and 3 passes: the replacement replays only the kept rows,
    # each as the one-row step it was computed as, and the text is unchanged
    run = Run(three_spans(fault="die", fault_after=6))
    tokens, kept, t = run.generate_speculative(flawed_draft(expected))
    assert tokens == expected
    [f] = t.failovers
    assert kept[:2] == [3, 1]  # the second pass's rows were rolled back before the failover
    # m1 computed the prompt and 3 passes; only their kept rows (the last token + kept drafts) replay
    assert f.replayed_tokens == f.position == len(PROMPT) + sum(n + 1 for n in kept[:3])
    assert run.swarm.open_sessions() == 0


def test_verify_rows_computed_as_one_step_differ_where_step_shape_matters(expected):
    # the simulated span, like llama.cpp's kernels, rounds a step of many rows differently from
    # one-row steps (and so says verify_rows 1 at open): a pass forced into one step of 4 rows drifts
    tokens, _, _ = Run(three_spans()).generate_speculative(flawed_draft(expected), group_rows=4)
    assert tokens != expected
