"""A real swarm on 127.0.0.1: `swarm serve` processes, the DHT, streams, and a client.

The oracle for every output is llama-cpp-python's own whole-model greedy completion.
"""

from __future__ import annotations

import os
import threading

import pytest

from swarm import Client
from swarm.client.directory import DHTDirectory

from tests.helpers.oracle import oracle
from tests.helpers.peers import serve_args, wait_for

PROMPT = "The three most important inventions of the twentieth century are"


def test_three_span_route_matches_llama_cpp(smol_swarm, smollm2_path):
    expected = oracle(smollm2_path, PROMPT, 32)
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
        got = client.generate(PROMPT, max_new_tokens=32)
    assert got.text == expected
    route = got.telemetry.route
    assert [(h.start, h.end) for h in route] == [(0, 10), (10, 20), (20, 30)]
    assert [h.peer_id for h in route] == [p.peer_id for p in smol_swarm.started]
    assert [h.transport for h in route] == ["direct"] * 3  # every peer offers a direct stream
    n_prompt = got.telemetry.prompt_tokens
    for hop in route:
        assert hop.steps == 1 + 1 + 31  # open, one prefill chunk, then one step per decoded token
        assert hop.compute_ms > 0
    # Server push: the client sends each step to the first hop only; the peers push it on.
    assert [h.pushed_steps for h in route] == [0, 32, 32]
    # Only hidden states cross the hops: a decode step sends [1, 576] float32 to the first hop; the
    # others get theirs pushed (the client sends them Open and Chain only) and answer a copy.
    assert all(h.skipped_replies == 0 for h in route)
    assert route[0].bytes_sent >= 4 * 576 * (n_prompt + 31)
    assert all(h.bytes_sent < 2000 for h in route[1:])
    assert route[1].bytes_received >= 4 * 576 * (n_prompt + 31)
    assert route[-1].bytes_received < 200 * 32  # the last hop returns token ids, not logits or hidden states


def test_an_rtt_measured_while_a_peer_was_busy_is_measured_again(smol_swarm, smollm2_path):
    """A client keeps each peer's RTT and measures it again, in the background, once it is older
    than `rtt_max_age_s`: an RTT read while the peer was busy (here 5 s, as a first ping during a new
    peer's start-up could read) does not price the peer out of routes for the client's whole life."""
    middle = smol_swarm.started[1].peer_id
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
        directory, loop = client._engine.directory, client._engine._conn.loop  # noqa: SLF001

        def rtts() -> dict[str, float]:
            return {s.peer_id: s.rtt_ms for s in loop.run(directory.peers(frozenset(), False), 30)}

        assert 0 < rtts()[middle] < 5000.0
        directory.rtt_ms[middle] = 5000.0
        assert rtts()[middle] == 5000.0  # younger than rtt_max_age_s: kept
        directory.rtt_max_age_s = 0.0
        wait_for(lambda: rtts()[middle] < 5000.0, "the middle peer's RTT measured again", 60)


def test_direct_streams_fall_back_to_libp2p_with_the_same_answer(smol_swarm, smollm2_path, monkeypatch):
    """A client that does not use direct streams, and one whose direct dial to the middle peer fails
    (its announced endpoint refuses connections), get llama.cpp's answer over libp2p."""
    expected = oracle(smollm2_path, PROMPT, 16)
    middle = smol_swarm.started[1].peer_id
    announced = DHTDirectory.direct_addrs
    monkeypatch.setattr(
        DHTDirectory,
        "direct_addrs",
        lambda self, peer_id: ("/ip4/127.0.0.1/tcp/1",) if peer_id == middle else announced(self, peer_id),
    )
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
        fell_back = client.generate(PROMPT, max_new_tokens=16)
        again = client.generate(PROMPT, max_new_tokens=16)  # remembered: no second dial
        client._engine.transport.direct = False  # noqa: SLF001 - the engine's documented switch
        libp2p_only = client.generate(PROMPT, max_new_tokens=16)
    assert fell_back.text == again.text == libp2p_only.text == expected
    assert [h.transport for h in libp2p_only.telemetry.route] == ["libp2p"] * 3
    # the user can see why the middle hop went through libp2p, also when it was remembered
    for got in (fell_back, again):
        route = got.telemetry.route
        assert route[1].transport == "libp2p"
        assert "Connection refused dialling 127.0.0.1:1" in route[1].direct_error, route[1].direct_error
        assert f"(libp2p) (direct failed: {route[1].direct_error})" in got.telemetry.summary()
        # The other hops dial direct. Their hops open at once, and on a loaded machine a direct dial
        # may miss its head start (swarm/dialing.py, RFC 8305): libp2p then wins, saying so.
        for hop in (route[0], route[2]):
            assert (hop.transport, hop.direct_error) == ("direct", "") or (
                hop.transport == "libp2p" and hop.direct_error.startswith("direct dial abandoned")), hop
    assert [h.direct_error for h in libp2p_only.telemetry.route] == [""] * 3  # not tried, not failed


def test_a_peer_without_direct_streams_is_reached_over_libp2p(smollm2_path, peers):
    first = peers.start("solo", *serve_args(smollm2_path, "0:30", "--new-swarm", "--no-direct"))
    with Client(str(smollm2_path), initial_peers=first.maddrs) as client:
        got = client.generate(PROMPT, max_new_tokens=8)
    assert got.text == oracle(smollm2_path, PROMPT, 8)
    assert [h.transport for h in got.telemetry.route] == ["libp2p"]


def test_two_clients_at_once_get_their_own_answers(smol_swarm, smollm2_path):
    prompts = ["The capital of France is", "def fibonacci(n):"]
    expected = [oracle(smollm2_path, p, 24) for p in prompts]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
                results[i] = client.generate(prompts[i], max_new_tokens=24).text
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert [results[0], results[1]] == expected


def test_qwen_in_two_spans(qwen_path, peers):
    first = peers.start("q0", *serve_args(qwen_path, "0:12", "--new-swarm"))
    peers.start("q1", *serve_args(qwen_path, "12:24", "--initial-peers", first.maddrs[0]))
    expected = oracle(qwen_path, PROMPT, 32)
    with Client(str(qwen_path), initial_peers=first.maddrs) as client:
        got = client.generate(PROMPT, max_new_tokens=32)
    assert got.text == expected
    assert [(h.start, h.end) for h in got.telemetry.route] == [(0, 12), (12, 24)]


def test_serve_without_layers_extends_the_chain_then_completes_it(smollm2_path, peers):
    first = peers.start("f0", *serve_args(smollm2_path, "0:10", "--new-swarm"))
    second = peers.start(
        "f1",
        "serve",
        "--model",
        str(smollm2_path),
        "--max-layers",
        "10",
        "--threads",
        "1",
        "--cache-tokens",
        "1024",
        "--initial-peers",
        first.maddrs[0],
    )
    assert "serving layers 10:20 " in second.stderr_text()
    third = peers.start(
        "f2",
        "serve",
        "--model",
        str(smollm2_path),
        "--max-layers",
        "10",
        "--threads",
        "1",
        "--cache-tokens",
        "1024",
        "--initial-peers",
        first.maddrs[0],
    )
    assert "serving layers 20:30 " in third.stderr_text()
    # a peer process runs on uvloop's event loop unless SWARM_EVENT_LOOP says otherwise
    want = os.environ.get("SWARM_EVENT_LOOP") or "uvloop"
    assert all(f"; event loop {want}" in p.stderr_text() for p in (second, third))


def test_seeded_sampling_over_the_swarm_equals_local(smol_swarm, smollm2_path):
    """The last span samples with rng([seed, position]) from exact logits: the local backend's tokens."""
    kwargs = dict(max_new_tokens=24, temperature=0.9, top_p=0.95, top_k=40, seed=11)
    local = Client(str(smollm2_path), local=True, n_ctx=512, n_threads=1).generate(PROMPT, **kwargs)
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
        remote = client.generate(PROMPT, **kwargs)
        greedy = client.generate(PROMPT, max_new_tokens=24)
    assert remote.tokens == local.tokens
    assert remote.tokens != greedy.tokens  # the sampler really sampled


def test_status_lists_the_spans_and_coverage(smol_swarm, smollm2_path):
    import json
    import subprocess
    import sys

    from swarm.manifest import build_manifest

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm.cli",
            "status",
            "--model",
            str(smollm2_path),
            "--json",
            "--initial-peers",
            smol_swarm.started[0].maddrs[0],
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["model_id"] == build_manifest(smollm2_path).model_id
    assert report["covered"] is True and report["missing"] == []
    assert report["route_exists"] is True and report["dead_ends"] == []
    assert [h[1:] for h in report["best_route"]["hops"]] == [[0, 10], [10, 20], [20, 30]]
    assert report["routable_tokens_per_s"] > 0 and report["best_route"]["tokens_per_s"] > 0
    spans = sorted((p["start"], p["end"], p["peer_id"]) for p in report["peers"])
    assert spans == [
        (0, 10, smol_swarm.started[0].peer_id),
        (10, 20, smol_swarm.started[1].peer_id),
        (20, 30, smol_swarm.started[2].peer_id),
    ]


def test_the_next_decode_step_is_sent_ahead_once_and_read_by_the_next_call(smol_swarm, smollm2_path):
    """`RemoteSession.decode(token, follow)`: when `follow` says the next call will decode the token
    just sampled, that step goes out from the loop thread at once, and the next call only reads its
    answer; never more than one step ahead, and none when `follow` says no."""
    from swarm.client.telemetry import GenerationTelemetry
    from swarm.sampling import SamplingParams

    local = Client(str(smollm2_path), local=True, n_ctx=512, n_threads=1).generate(PROMPT, max_new_tokens=4)
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
        prompt = client.tokenizer.encode(PROMPT)
        engine = client._engine  # noqa: SLF001 - the engine's sessions, as the generation loop drives them
        session = engine.open_session(len(prompt) + 8, SamplingParams(), GenerationTelemetry("swarm"))
        try:
            t0 = session.prefill(prompt).token
            t1 = session.decode(t0, follow=lambda t: True).token
            assert session.settle() is None  # waits for the step sent ahead, whose token is t1
            # the hops computed t0 and, ahead, t1 (nothing after it), so the route stands past t1
            assert session.route.pos == len(prompt) + 2
            assert [h.steps for h in session.route.telemetry.route] == [1 + 1 + 2] * 3
        finally:
            session.close()
        session = engine.open_session(len(prompt) + 8, SamplingParams(), GenerationTelemetry("swarm"))
        try:
            t0 = session.prefill(prompt).token
            t1 = session.decode(t0, follow=lambda t: True).token
            t2 = session.decode(t1).token  # read from the step sent ahead: no step of its own
            t3 = session.decode(t2, follow=lambda t: False).token
            assert session.settle() is None
            assert [t0, t1, t2, t3] == local.tokens
            assert session.route.pos == len(prompt) + 3
            assert [h.steps for h in session.route.telemetry.route] == [1 + 1 + 3] * 3
            with pytest.raises(ValueError, match="sent ahead for token"):
                t4 = session.decode(t3, follow=lambda t: True).token
                session.decode(t4 + 1)
        finally:
            session.close()


def test_a_stop_string_leaves_one_step_computed_ahead_and_the_text_as_without_it(smol_swarm, smollm2_path):
    """The generation loop sends each decode step ahead unless the length or the end token rules
    the next one out; a stop string ends the text with one step computed and never given out."""
    full = Client(str(smollm2_path), local=True, n_ctx=512, n_threads=1).generate(PROMPT, max_new_tokens=24)
    stop = full.text[len(full.text) // 2:][:6]
    assert stop.strip() and stop in full.text
    want = full.text[: full.text.index(stop)]
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
        got = client.generate(PROMPT, max_new_tokens=24, stop=[stop])
    assert got.text == want
    assert got.telemetry.finish_reason == "stop"
    n = len(got.tokens)  # given out: the first from the prefill, then n - 1 decode steps
    assert [h.steps for h in got.telemetry.route] == [1 + 1 + (n - 1) + 1] * 3
