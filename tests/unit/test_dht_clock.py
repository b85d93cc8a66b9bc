"""swarm.dht.clock (swarm time from ping exchanges) and clockwatch.clock_targets; pure."""

from __future__ import annotations

import dataclasses

import pytest

from swarm.dht.clock import (
    CLOCK_PEERS,
    SKEW_WARN_S,
    ClockProbe,
    best,
    probe,
    relative_skews,
    skew_words,
    swarm_offset,
)
from swarm.dht.clockwatch import clock_targets
from swarm.dht.records import Announcement


def make_announcement(peer_id: str) -> Announcement:
    return Announcement(peer_id, ("/ip4/127.0.0.1/tcp/2",), "ab" * 16, 0, 10, 1.0, 1.0, 100, 1, 1, "0", 4,
                        None, 0.0)


def test_one_exchange_gives_the_offset_within_half_the_round_trip():
    # the remote read its clock (1000 s ahead) 10 ms into a 30 ms exchange: off by 5 ms, bound 15 ms
    got = probe(sent_s=100.0, received_s=100.030, remote_s=1100.010)
    assert got.rtt_s == pytest.approx(0.030)
    assert got.offset_s == pytest.approx(999.995)
    assert abs(got.offset_s - 1000.0) <= got.rtt_s / 2


def test_the_shortest_round_trip_wins():
    probes = [ClockProbe(5.0, 0.2), ClockProbe(1.0, 0.01), ClockProbe(3.0, 0.05)]
    assert best(probes) == ClockProbe(1.0, 0.01)
    assert best([]) is None


def test_swarm_offset_is_the_median_of_the_others():
    # a peer 120 s behind sees every other clock 120 s ahead; one wrong other clock does not move it
    assert swarm_offset([120.2, 119.8, 120.0, -480.0]) == pytest.approx(119.9)
    assert swarm_offset([-600.0, -600.1, -599.9]) == pytest.approx(-600.0)
    assert swarm_offset([]) is None
    # with one other clock nobody can tell which is wrong: meet halfway
    assert swarm_offset([120.0]) == 60.0


def test_skew_words_and_relative_skews():
    assert skew_words(-120.4) == "120 s behind"
    assert skew_words(600.0) == "600 s ahead"
    assert skew_words(SKEW_WARN_S) == f"in step (+{SKEW_WARN_S:.1f} s)"
    # the observer's own error cancels out: its clock 50 s behind everyone, one peer 120 s behind
    skews = relative_skews({"a": 50.0, "b": 50.2, "c": -70.0, "d": 49.8})
    assert skews == pytest.approx({"a": 0.2, "b": 0.4, "c": -119.8, "d": 0.0})
    # two peers: the observer's clock breaks the tie
    assert relative_skews({"ok": 0.1, "slow": -120.0}) == pytest.approx({"ok": 0.1, "slow": -120.0})
    assert relative_skews({}) == {}


def test_clock_targets_prefer_announced_peers_and_skip_itself():
    own = make_announcement(peer_id="Qm" + "a" * 44)
    others = [dataclasses.replace(own, peer_id="Qm" + chr(ord("b") + i) * 44) for i in range(CLOCK_PEERS + 2)]
    initial = "/ip4/127.0.0.1/tcp/1/p2p/QmXnSzCJUSkzKWfNki6cn7BAEHCHDLi3YKf7faWJzqg9Fn"
    got = clock_targets(own.peer_id, [own, *others[:2]], [initial, "not-a-maddr"])
    assert got == [(others[0].peer_id, own.addrs), (others[1].peer_id, own.addrs),
                   ("QmXnSzCJUSkzKWfNki6cn7BAEHCHDLi3YKf7faWJzqg9Fn", (initial,))]
    assert len(clock_targets(own.peer_id, others, [initial])) == CLOCK_PEERS
