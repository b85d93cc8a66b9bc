"""Routing around dead, full and departing peers in a real loopback swarm of SmolLM2.

A base route of two peers ([0, 15) and [15, 30)) stays up for the whole module; each test adds a
peer serving the whole model [0, 30) and then kills it, fills it or stops it. Every generation is
checked against llama.cpp's whole-model greedy text. Waits poll the DHT with a deadline.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from swarm import Client
from swarm.client.remote import SwarmConnection
from swarm.manifest import build_manifest

from peerproc import PeerSet, RawClient, descendants, oracle, serve_args, wait_for

PROMPT = "The capital of France is"
N_NEW = 16
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"


@pytest.fixture(scope="module")
def base(smollm2_path, tmp_path_factory):
    """Peers for [0, 15) (the bootstrap) and [15, 30), refreshing their records every second."""
    ps = PeerSet(tmp_path_factory.mktemp("faults_base"))
    b0 = ps.start("b0", *serve_args(smollm2_path, "0:15", "--new-swarm", "--announce-period", "1"))
    ps.start(
        "b1", *serve_args(smollm2_path, "15:30", "--initial-peers", b0.maddrs[0], "--announce-period", "1")
    )
    yield ps
    ps.stop_all()


@pytest.fixture(scope="module")
def model_id(smollm2_path) -> str:
    return build_manifest(smollm2_path).model_id


@pytest.fixture(scope="module")
def expected(smollm2_path) -> str:
    return oracle(smollm2_path, PROMPT, N_NEW)


@pytest.fixture(scope="module")
def watcher(base):
    """A client-mode DHT node that reads announcements."""
    conn = SwarmConnection(base.started[0].maddrs)
    yield conn
    conn.close()


def base_ids(base) -> list[str]:
    return [p.peer_id for p in base.started[:2]]


def announced(watcher, model_id: str) -> dict:
    return {a.peer_id: a for a in watcher.announcements(model_id)}


def generate(base, smollm2_path, rtt_ms: dict[str, float] | None = None):
    with Client(str(smollm2_path), initial_peers=base.started[0].maddrs) as client:
        if rtt_ms:
            client._engine.directory.rtt_ms.update(rtt_ms)  # noqa: SLF001 - steer the planner deterministically
        return client.generate(PROMPT, max_new_tokens=N_NEW)


def start_whole(base, smollm2_path, name: str, *extra: str):
    join = ("--initial-peers", base.started[0].maddrs[0])
    return base.start(name, *serve_args(smollm2_path, "0:30", *join, *extra))


def test_killed_peer_is_dropped_once_its_record_expires(base, smollm2_path, watcher, model_id, expected):
    k = start_whole(base, smollm2_path, "k", "--announce-period", "1")
    wait_for(lambda: k.peer_id in announced(watcher, model_id), "the new peer's record")
    tree = descendants(k.proc.pid)
    assert tree  # the peer's hivemind DHT process and p2pd daemons
    for pid in tree:  # the whole machine "dies": no process of the peer may withdraw or answer
        os.kill(pid, signal.SIGKILL)
    k.stop(signal.SIGKILL)
    assert k.proc.returncode == -signal.SIGKILL
    took = wait_for(lambda: k.peer_id not in announced(watcher, model_id), "the dead peer's record expiring")
    assert took < 10.0  # 2.5 announce periods after its last refresh, plus DHT slack
    got = generate(base, smollm2_path)
    assert [h.peer_id for h in got.telemetry.route] == base_ids(base)
    assert got.text == expected


def test_full_peer_is_routed_around(base, smollm2_path, watcher, model_id, expected, tmp_path):
    c = start_whole(base, smollm2_path, "full", "--max-sessions", "1", "--announce-period", "1")
    raw = RawClient(c, model_id, tmp_path / "raw")
    try:
        wait_for(lambda: c.peer_id in announced(watcher, model_id), "the new peer's record")
        held = raw.open_session(max_tokens=64)
        wait_for(lambda: announced(watcher, model_id)[c.peer_id].sessions_free == 0, "sessions_free == 0")
        # Even when the planner is made to prefer it (the others look slow), a full peer is skipped.
        got = generate(base, smollm2_path, {i: 500.0 for i in base_ids(base)})
        assert [h.peer_id for h in got.telemetry.route] == base_ids(base)
        assert got.text == expected
        raw.loop.run(held.close(), 10)
    finally:
        raw.close()
        assert c.stop() == 0


def test_busy_peer_with_a_stale_record_makes_the_client_reroute(
    base, smollm2_path, watcher, model_id, expected, tmp_path
):
    # A long period: the record keeps saying "1 session free" while the only slot is taken.
    c = start_whole(base, smollm2_path, "stale", "--max-sessions", "1", "--announce-period", "120")
    raw = RawClient(c, model_id, tmp_path / "raw")
    try:
        wait_for(lambda: c.peer_id in announced(watcher, model_id), "the new peer's record")
        held = raw.open_session(max_tokens=64)
        assert announced(watcher, model_id)[c.peer_id].sessions_free == 1
        got = generate(base, smollm2_path, {i: 500.0 for i in base_ids(base)})  # first plan: the busy peer
        assert [h.peer_id for h in got.telemetry.route] == base_ids(base)
        assert got.text == expected
        # Once the slot is free again, the same preference routes through it.
        raw.loop.run(held.close(), 10)
        time.sleep(0.5)  # the peer releases the session when it reads the stream's end
        got = generate(base, smollm2_path, {i: 500.0 for i in base_ids(base)})
        assert [h.peer_id for h in got.telemetry.route] == [c.peer_id]
        assert got.text == expected
    finally:
        raw.close()
        assert c.stop() == 0


def test_sigterm_withdraws_tells_the_client_which_fails_over(base, smollm2_path, watcher, model_id):
    t = start_whole(base, smollm2_path, "term", "--announce-period", "30")  # record would live 75 s
    wait_for(lambda: t.peer_id in announced(watcher, model_id), "the new peer's record")
    n_new = 120
    want = oracle(smollm2_path, COUNTING, n_new)
    n_deltas = 0
    with Client(str(smollm2_path), initial_peers=base.started[0].maddrs) as client:
        client._engine.directory.rtt_ms.update({i: 500.0 for i in base_ids(base)})  # noqa: SLF001 - route via `t`
        deltas = client.stream(COUNTING, max_new_tokens=n_new)
        for _ in deltas:
            n_deltas += 1
            if n_deltas == 1:
                assert [h.peer_id for h in deltas.telemetry.route] == [t.peer_id]
                t0 = time.monotonic()
                t.proc.send_signal(signal.SIGTERM)
                t.proc.wait(15)  # the client sits idle until the peer is gone: its next step must
                # still learn why (the peer's SHUTTING_DOWN frame), not just "connection lost"
        assert time.monotonic() - t0 < 15.0
    got = deltas.result
    assert got.text == want  # replayed on the base route, token for token
    [f] = got.telemetry.failovers
    assert (f.peer_id, f.reason, f.start, f.end) == (t.peer_id, "shutting_down", 0, 30)
    assert f.replacements == base_ids(base)
    wait_for(lambda: t.peer_id not in announced(watcher, model_id), "withdrawal", deadline_s=10.0)
    assert time.monotonic() - t0 < 10.0  # gone long before the record's 75 s expiry
    assert t.proc.returncode == 0, t.stderr_text()[-2000:]
