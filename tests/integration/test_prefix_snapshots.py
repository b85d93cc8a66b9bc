"""Prefix KV snapshots on real peers: Qwen 0.5B as 0:8 / 8:16 / 16:24 on 127.0.0.1.

Two sessions share a ~400-token system prompt (six 64-token chunks of prefix): the second restores it on every hop; a fresh 8:16
peer that joins later fetches the snapshot from the first 8:16 peer; a holder that serves damaged
snapshots is refused with a logged reason. Every answer equals llama.cpp's whole model (greedy,
flash attention on) on the same full prompt. Behaviour only, never timings (see
scripts/bench_prefix.py for TTFT).
"""

from __future__ import annotations

import pytest

from swarm import Client
from swarm.localswarm import PeerSet
from tests.helpers.oracle import oracle
from tests.helpers.peers import serve_args, wait_for

pytestmark = pytest.mark.slow

SYSTEM = "".join(
    f"Rule {i}: about topic {i}, answer politely, concisely and only with facts.\n" for i in range(18)
)
QUESTIONS = (
    "Question: what is the capital of France?\nAnswer:",
    "Question: name three prime numbers.\nAnswer:",
)
N_NEW = 8
# A snapshot imports only into an executor with as many KV streams (sessions) as its writer's, so
# the peer that fetches from m1 serves as many sessions as m1 (else it refuses the format).
SAME_STREAMS_AS_M1 = ("--max-sessions", "1")


def _serve(path, layers, first, *extra):
    return serve_args(path, layers, "--announce-period", "2", "--initial-peers", first.maddrs[0], *extra)


def _mid(gen) -> object:
    return next(h for h in gen.telemetry.route if h.start == 8)


def _through_other_than(client, prompt: str, peer_id: str):
    """A generation whose 8:16 hop is not `peer_id`, or None."""
    g = client.generate(prompt, max_new_tokens=N_NEW)
    return g if _mid(g).peer_id != peer_id else None


def test_shared_prefix_is_restored_fetched_and_exact(qwen_path, tmp_path):
    prompts = [SYSTEM + q for q in QUESTIONS]
    want = [oracle(qwen_path, p, N_NEW) for p in prompts]
    ps = PeerSet(tmp_path)
    try:
        first = ps.start("a", *serve_args(qwen_path, "0:8", "--new-swarm", "--announce-period", "2"))
        m1, _ = ps.start_together([("m1", _serve(qwen_path, "8:16", first, "--max-sessions", "1")),
                                   ("z", _serve(qwen_path, "16:24", first))])
        with Client(str(qwen_path), initial_peers=first.maddrs) as client:
            g1 = client.generate(prompts[0], max_new_tokens=N_NEW)
            g2 = client.generate(prompts[1], max_new_tokens=N_NEW)
            assert [g1.text, g2.text] == want
            assert g1.telemetry.reused_tokens == 0
            shared = len(client.tokenizer.encode(SYSTEM)) // 64 * 64
            assert g2.telemetry.reused_tokens >= shared - 64 > 0
            assert all(h.reused_tokens == g2.telemetry.reused_tokens for h in g2.telemetry.route)

            # m1 busy (its one slot held): the next session must go through a fresh 8:16 peer,
            # which fetches the prefix from m1 instead of computing it.
            held = client.stream("Hello", max_new_tokens=64)
            next(iter(held))
            ps.start("m2", *_serve(qwen_path, "8:16", first, *SAME_STREAMS_AS_M1))
            g3 = wait_for(
                lambda: _through_other_than(client, prompts[1], m1.peer_id), what="a route through m2"
            )
            held.close()
            assert g3.text == want[1]
            assert _mid(g3).fetched_from == m1.peer_id
            assert _mid(g3).reused_tokens == g3.telemetry.reused_tokens > 0
    finally:
        ps.stop_all()


# One kind of damage end to end: the kinds differ only inside `decode_snapshot`, and
# tests/unit/test_kv_snapshot.py refuses each of them (flip, truncate, span, format) with its reason.
@pytest.mark.parametrize("tamper", ["flip"])
def test_tampered_snapshot_is_rejected_and_the_answer_is_still_right(qwen_path, tmp_path, tamper):
    prompts = [SYSTEM + q for q in QUESTIONS]
    want = oracle(qwen_path, prompts[1], N_NEW)
    ps = PeerSet(tmp_path)
    try:
        first = ps.start("a", *serve_args(qwen_path, "0:8", "--new-swarm", "--announce-period", "2"))
        bad, _ = ps.start_together([
            ("m1", _serve(qwen_path, "8:16", first, "--max-sessions", "1", "--debug-tamper-snapshots", tamper)),
            ("z", _serve(qwen_path, "16:24", first)),
        ])
        with Client(str(qwen_path), initial_peers=first.maddrs) as client:
            client.generate(prompts[0], max_new_tokens=2)
            held = client.stream("Hello", max_new_tokens=64)
            next(iter(held))
            m2 = ps.start("m2", *_serve(qwen_path, "8:16", first, *SAME_STREAMS_AS_M1))
            g = wait_for(
                lambda: _through_other_than(client, prompts[1], bad.peer_id), what="a route through m2"
            )
            held.close()
            assert g.text == want
            assert _mid(g).fetched_from == "" and g.telemetry.reused_tokens == 0
            assert "rejected a snapshot from" in m2.stderr_text()
    finally:
        ps.stop_all()
