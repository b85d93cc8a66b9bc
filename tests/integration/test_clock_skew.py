"""A serving peer whose wall clock goes wrong while it runs (issue 24, "a wrong clock is invisible").

The module's own swarm: two peers with true clocks serve SmolLM2's layers 0:15, and peer S serves
15:30 with its wall clock skewed by the test hook swarm/cli/testclock.py (the whole Python side: its
records and its hivemind DHT process). S refreshes every 2 s, so a record of its lives 5 s. Before,
S 120 s behind wrote records every other node found already expired (it vanished from status and
chat); S 600 s ahead wrote records that outlived it by ten minutes (or, with the 600 s bound on
expirations, were refused). Now S measures its offset against the other nodes, writes in swarm time,
logs the skew loudly, and `swarm status` shows it. The tests run in order: behind, then ahead and
killed.
"""

from __future__ import annotations

import signal

import pytest

from swarm import Client
from swarm.client.connection import SwarmConnection
from swarm.client.status import swarm_status
from swarm.dht.node import get_dht_time
from swarm.manifest import build_manifest
from swarm.limits import EXPIRY_PERIODS

from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, serve_args, wait_for

PROMPT = "The three most important inventions of the twentieth century are"
PERIOD_S = 2.0
"""S's announce period: its records live EXPIRY_PERIODS of it (5 s)."""


@pytest.fixture(scope="module")
def skewed(smollm2_path, tmp_path_factory):
    """(PeerSet, the skewed peer S, the file holding S's clock skew in seconds)."""
    root = tmp_path_factory.mktemp("clock")
    skew_file = root / "skew"
    skew_file.write_text("0")
    ps = PeerSet(root)
    first = ps.start("p0", *serve_args(smollm2_path, "0:15", "--new-swarm"))
    other = ps.start("p1", *serve_args(smollm2_path, "0:15", "--initial-peers", first.maddrs[0]))
    s = ps.start(
        "s",
        *serve_args(smollm2_path, "15:30", "--announce-period", str(PERIOD_S),
                    "--initial-peers", first.maddrs[0], other.maddrs[0]),
        env={"SWARM_TEST_CLOCK_SKEW_FILE": str(skew_file)},
    )
    yield ps, s, skew_file
    ps.stop_all()


def s_record(conn: SwarmConnection, model_id: str, peer_id: str):
    """S's announcement as a reader with a true clock finds it, or None."""
    return next((a for a in conn.announcements(model_id) if a.peer_id == peer_id), None)


def test_a_peer_120_s_behind_stays_listed_serves_and_is_reported(skewed, smollm2_path):
    ps, s, skew_file = skewed
    model_id = build_manifest(smollm2_path).model_id
    skew_file.write_text("-120")
    skewed_at = get_dht_time()
    wait_for(s.stderr_text, "S logs its clock 120 s behind",
             until=lambda log: "CLOCK: this machine's clock is 120 s behind the swarm's median of 2" in log)
    conn = SwarmConnection(ps.started[0].maddrs)
    try:
        # a record S stored after its clock fell behind: one from before expires by skewed_at + 5 s
        fresh = wait_for(lambda: s_record(conn, model_id, s.peer_id), "S refreshes after the skew",
                         until=lambda a: a is not None and a.expires_at > skewed_at + PERIOD_S * EXPIRY_PERIODS)
        # in the swarm's time: it expires one record lifetime from now, not 120 s earlier
        assert fresh.expires_at - get_dht_time() <= PERIOD_S * EXPIRY_PERIODS + 1.0
    finally:
        conn.close()
    with Client(str(smollm2_path), initial_peers=ps.started[0].maddrs) as client:
        got = client.generate(PROMPT, max_new_tokens=12)
    assert got.text == oracle(smollm2_path, PROMPT, 12)
    assert got.telemetry.route[-1].peer_id == s.peer_id
    report = swarm_status(str(smollm2_path), ps.started[0].maddrs)
    assert s.peer_id in {p.peer_id for p in report.peers}
    assert report.clock_s[s.peer_id] == pytest.approx(-120.0, abs=5.0)
    assert all(abs(report.clock_s[p.peer_id]) < 5.0 for p in ps.started[:2])
    assert any(line.startswith(f"clock: {s.peer_id[:16]}…'s clock is 120 s behind") for line in report.verdict())
    assert report.to_dict()["peers"][-1]["clock_skew_s"] == report.clock_s[s.peer_id]


def test_a_peer_600_s_ahead_that_dies_drops_out_within_a_record_lifetime(skewed, smollm2_path):
    ps, s, skew_file = skewed
    model_id = build_manifest(smollm2_path).model_id
    skew_file.write_text("600")
    skewed_at = get_dht_time()
    wait_for(s.stderr_text, "S logs its clock 600 s ahead",
             until=lambda log: "CLOCK: this machine's clock is 600 s ahead of" in log)
    conn = SwarmConnection(ps.started[0].maddrs)
    try:
        last = wait_for(lambda: s_record(conn, model_id, s.peer_id), "S refreshes after the skew",
                        until=lambda a: a is not None and a.expires_at > skewed_at + PERIOD_S * EXPIRY_PERIODS)
        # written in the swarm's time: about one record lifetime ahead, not 600 s more
        assert last.expires_at - get_dht_time() <= PERIOD_S * EXPIRY_PERIODS + 1.0
        s.stop(signal.SIGKILL)
        # the reader drops it once its (swarm-time) expiration passes: seconds, not ten minutes
        wait_for(lambda: s_record(conn, model_id, s.peer_id), "the dead S's record expiring",
                 until=lambda a: a is None)
    finally:
        conn.close()
    report = swarm_status(str(smollm2_path), ps.started[0].maddrs)
    assert s.peer_id not in {p.peer_id for p in report.peers}
