"""swarm.reach_rules: reachability from dial-back answers, announced addresses, the dial-back budget."""

from __future__ import annotations

import pytest

from swarm.reach_rules import (
    PRIVATE,
    PUBLIC,
    UNKNOWN,
    DialBackAnswer,
    DialBackBudget,
    Reachability,
    announced_addrs,
    announced_direct_addrs,
    decide,
    dialback_targets,
    forced,
    unreachable_words,
)

PEER = "QmPeer" + "x" * 40


def test_a_dial_back_that_reached_the_listener_makes_the_peer_public_at_the_observed_host():
    answers = [DialBackAnswer("a", "203.0.113.7", direct_ok=False),
               DialBackAnswer("b", "203.0.113.7", direct_ok=True, libp2p_ok=False)]
    r = decide(answers, has_direct=True)
    assert (r.status, r.observed_host, r.direct_ok, r.libp2p_ok) == (PUBLIC, "203.0.113.7", True, False)
    assert "b" in r.reason and not r.private


def test_answers_that_all_failed_make_the_peer_private():
    answers = [DialBackAnswer("a", "203.0.113.7"), DialBackAnswer("b", "203.0.113.7", libp2p_ok=False)]
    r = decide(answers, has_direct=True)
    assert (r.status, r.observed_host) == (PRIVATE, "") and r.private
    assert "203.0.113.7" in r.reason


def test_fewer_failed_answers_than_required_leave_it_unknown():
    r = decide([DialBackAnswer("a", "203.0.113.7")], has_direct=True, min_answers=2)
    assert r.status == UNKNOWN


def test_no_answer_at_all_is_unknown_and_says_why():
    r = decide([DialBackAnswer("a", error="no answer within 10 s")], has_direct=True)
    assert r.status == UNKNOWN and "no answer within 10 s" in r.reason
    assert decide([], has_direct=True).reason == "no dial-back answer (no peer to ask)"


def test_without_a_direct_listener_the_libp2p_port_decides():
    assert decide([DialBackAnswer("a", "198.51.100.2", libp2p_ok=True)], has_direct=False).status == PUBLIC
    # a direct listener's proof is its nonce: the asked peer's word about libp2p alone does not count
    assert decide([DialBackAnswer("a", "198.51.100.2", libp2p_ok=True)], has_direct=True).status == PRIVATE


def test_forced_modes_and_a_bad_one():
    assert forced("private") == Reachability(PRIVATE, forced=True, reason="set by --reachability private")
    assert forced("public").status == PUBLIC
    with pytest.raises(ValueError):
        forced("auto")


def test_a_confirmed_public_endpoint_is_announced_first_and_once():
    local = ("/ip4/192.168.1.5/tcp/40003",)
    reach = Reachability(PUBLIC, "203.0.113.7", direct_ok=True, libp2p_ok=True)
    assert announced_direct_addrs(local, reach, 40003) == ("/ip4/203.0.113.7/tcp/40003", *local)
    again = announced_direct_addrs(("/ip4/203.0.113.7/tcp/40003",), reach, 40003)
    assert again == ("/ip4/203.0.113.7/tcp/40003",)
    maddrs = (f"/ip4/192.168.1.5/tcp/41000/p2p/{PEER}",)
    assert announced_addrs(maddrs, reach, 41000, PEER) == (f"/ip4/203.0.113.7/tcp/41000/p2p/{PEER}", *maddrs)
    v6 = Reachability(PUBLIC, "2001:db8::7", direct_ok=True)
    assert announced_direct_addrs((), v6, 5) == ("/ip6/2001:db8::7/tcp/5",)


def test_nothing_is_added_without_a_confirmation():
    local = ("/ip4/192.168.1.5/tcp/40003",)
    assert announced_direct_addrs(local, Reachability(PRIVATE), 40003) == local
    # a public libp2p port does not make the direct port public, nor the other way round
    assert announced_direct_addrs(local, Reachability(PUBLIC, "203.0.113.7", libp2p_ok=True), 40003) == local
    assert announced_addrs(local, Reachability(PUBLIC, "203.0.113.7", direct_ok=True), 1, PEER) == local


def test_dial_backs_go_to_the_observed_host_only():
    assert dialback_targets("/ip4/203.0.113.7/tcp/5555", [40003, 41000]) == [
        ("203.0.113.7", 40003), ("203.0.113.7", 41000)]
    assert dialback_targets("/ip6/2001:db8::1/tcp/5555", [40003]) == [("2001:db8::1", 40003)]


@pytest.mark.parametrize("observed, ports, words", [
    ("/ip4/203.0.113.7/udp/5555/quic", [40003], "no IP/TCP host"),
    ("", [40003], "no IP/TCP host"),
    ("/ip4/203.0.113.7/tcp/5555", [], "1..2 distinct ports"),
    ("/ip4/203.0.113.7/tcp/5555", [1, 2, 3], "1..2 distinct ports"),
    ("/ip4/203.0.113.7/tcp/5555", [40003, 40003], "1..2 distinct ports"),
    ("/ip4/203.0.113.7/tcp/5555", [22], "1024..65535"),
    ("/ip4/203.0.113.7/tcp/5555", [70000], "1024..65535"),
    ("/ip4/203.0.113.7/tcp/5555", [True], "1024..65535"),
])
def test_a_dial_back_that_cannot_be_made_safely_is_refused(observed, ports, words):
    with pytest.raises(ValueError, match=words):
        dialback_targets(observed, ports)


def test_the_budget_bounds_each_asker_and_all_together():
    budget = DialBackBudget(per_window=3, per_asker=2, window_s=60.0)
    assert budget.grant("a", 0.0) is None and budget.grant("a", 1.0) is None
    assert "per peer" in budget.grant("a", 2.0)
    assert budget.grant("b", 3.0) is None
    assert "busy" in budget.grant("c", 4.0)
    assert budget.grant("c", 60.5) is None  # the first grant left the window


def test_unreachable_words_name_the_cause_and_the_fix():
    assert "2 of them announce private reachability" in unreachable_words(["private", "unknown", "private"])
    assert unreachable_words(["private"]).startswith("it announces private reachability")
    words = unreachable_words(["unknown"])
    assert words.startswith("crashed, frozen, or behind a NAT") and "--public-address" in words
