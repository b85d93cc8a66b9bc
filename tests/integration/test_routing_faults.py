"""Routing around dead, full and departing peers in a real loopback swarm of SmolLM2.

A base route of two peers ([0, 15) and [15, 30)) stays up for the whole module; each test adds a
peer serving the whole model [0, 30) and then kills it, fills it or stops it. Every generation is
checked against llama.cpp's whole-model greedy text. Waits poll the DHT with a generous deadline;
nothing is timed: how a record left (expiry or a signed withdrawal) is read from the DHT itself.
"""

from __future__ import annotations

import os
import signal

import pytest
from hivemind.utils import get_dht_time

from swarm import Client
from swarm.client.connection import SwarmConnection
from swarm.dht.records import Announcement, announcements_key
from swarm.dht.validation import is_announcement_subkey, owner_public_key
from swarm.manifest import build_manifest
from swarm.limits import EXPIRY_PERIODS
from swarm.peerid import peer_id_of_public_key
from swarm.wire import Close, encode_frame

from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, RawClient, descendants, serve_args, wait_for

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


def withdrawn(watcher, model_id: str) -> set[str]:
    """Peer ids whose announcement subkey holds a signed tombstone (SwarmDHT.withdraw) in the DHT now."""
    entries = watcher.loop.run(watcher.dht._get_entries(announcements_key(model_id)), 30)  # noqa: SLF001
    return {
        peer_id_of_public_key(owner_public_key(subkey))
        for subkey, value, _ in entries
        if value is None and is_announcement_subkey(subkey)
    }


def wait_until_gone(watcher, model_id: str, seen: Announcement, what: str) -> tuple[Announcement, float]:
    """Wait until the peer of record `seen` is no longer announced.

    Returns:
        the peer's last record seen (`seen` or a later refresh) and the DHT time it was found missing.
    """
    last = [seen]

    def probe() -> dict:
        now = announced(watcher, model_id)
        last.extend([now[seen.peer_id]] if seen.peer_id in now else [])
        return now

    wait_for(probe, what, until=lambda now: seen.peer_id not in now)
    return last[-1], get_dht_time()


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
    first = wait_for(lambda: announced(watcher, model_id).get(k.peer_id), "the new peer's record")
    # a peer refreshing every second writes records that live 2.5 s, so a dead one drops out soon
    assert first.expires_at <= get_dht_time() + EXPIRY_PERIODS * 1.0
    tree = descendants(k.proc.pid)
    assert tree  # the peer's hivemind DHT process and p2pd daemons
    for pid in tree:  # the whole machine "dies": no process of the peer may withdraw or answer
        os.kill(pid, signal.SIGKILL)
    k.stop(signal.SIGKILL)
    assert k.proc.returncode == -signal.SIGKILL
    last, gone_at = wait_until_gone(watcher, model_id, first, "the dead peer's record expiring")
    # it left by expiry: nobody withdrew it, and the last record seen had expired when it was missed
    assert k.peer_id not in withdrawn(watcher, model_id)
    assert gone_at >= last.expires_at
    got = generate(base, smollm2_path)
    assert [h.peer_id for h in got.telemetry.route] == base_ids(base)
    assert got.text == expected


def test_status_shows_a_killed_peer_whose_record_lives_on_as_not_answering(
    base, smollm2_path, watcher, model_id
):
    """A peer killed with -9 stays announced until its record expires (75 s at the default period):
    `swarm status` pings every peer, shows it as not answering and routes without it."""
    from swarm.client.status import swarm_status

    k = start_whole(base, smollm2_path, "k_status")  # default announce period: records live 75 s
    wait_for(lambda: announced(watcher, model_id).get(k.peer_id), "the new peer's record")
    for pid in descendants(k.proc.pid):
        os.kill(pid, signal.SIGKILL)
    k.stop(signal.SIGKILL)
    report = swarm_status(str(smollm2_path), [base.started[0].maddrs[0]])
    assert k.peer_id in {p.peer_id for p in report.peers}  # its record is still there
    assert report.rtt_ms[k.peer_id] is None and [p.peer_id for p in report.silent] == [k.peer_id]
    assert all(report.rtt_ms[i] > 0 for i in base_ids(base))
    assert [h.peer_id for h in report.best_route.hops] == base_ids(base)  # not the dead 0:30 peer
    assert any(line.startswith("no answer: 0:30") for line in report.verdict())
    row = next(p for p in report.to_dict()["peers"] if p["peer_id"] == k.peer_id)
    assert (row["answered"], row["rtt_ms"]) == (False, None)


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
        # Once the slot is free again, the same preference routes through it. The peer releases the
        # session before it closes its end of the stream, so the end of the stream means "released".
        raw.send(held, encode_frame(Close()))
        raw.assert_closed(held)
        got = generate(base, smollm2_path, {i: 500.0 for i in base_ids(base)})
        assert [h.peer_id for h in got.telemetry.route] == [c.peer_id]
        assert got.text == expected
    finally:
        raw.close()
        assert c.stop() == 0


def test_sigterm_withdraws_tells_the_client_which_fails_over(base, smollm2_path, watcher, model_id):
    t = start_whole(base, smollm2_path, "term", "--announce-period", "30")  # record would live 75 s
    first = wait_for(lambda: announced(watcher, model_id).get(t.peer_id), "the new peer's record")
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
                t.proc.send_signal(signal.SIGTERM)
                t.proc.wait(30)  # the client sits idle until the peer is gone: its next step must
                # still learn why (the peer's SHUTTING_DOWN frame), not just "connection lost"
    got = deltas.result
    assert got.text == want  # replayed on the base route, token for token
    [f] = got.telemetry.failovers
    assert (f.peer_id, f.reason, f.start, f.end) == (t.peer_id, "shutting_down", 0, 30)
    assert f.replacements == base_ids(base)
    _, gone_at = wait_until_gone(watcher, model_id, first, "the withdrawal")
    # it left by its signed withdrawal, before the record seen would have expired
    assert t.peer_id in withdrawn(watcher, model_id)
    assert gone_at < first.expires_at
    assert t.proc.returncode == 0, t.stderr_text()[-2000:]
