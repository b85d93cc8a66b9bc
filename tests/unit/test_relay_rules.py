"""swarm.relay.rules: relay roles, the relay's budget, token buckets and relay choice."""

from __future__ import annotations

import math

import pytest

from swarm.relay.records import RelayOffer
from swarm.relay.rules import RelayBudget, RelayLimits, RelayRoles, TokenBucket, choose_relay, relay_roles


@pytest.mark.parametrize("reach, relay, service, roles", [
    ("public", "auto", True, RelayRoles(serve=True, use=False)),
    ("public", "auto", False, RelayRoles(serve=False, use=False)),
    ("public", "off", True, RelayRoles(serve=True, use=False)),
    ("private", "auto", True, RelayRoles(serve=False, use=True)),  # nobody could dial its relay
    ("private", "off", True, RelayRoles(serve=False, use=False)),
])
def test_relay_roles(reach, relay, service, roles):
    assert relay_roles(reach, relay, service) == roles


def test_relay_roles_refuse_unknown_modes():
    with pytest.raises(ValueError):
        relay_roles("auto", "auto", True)
    with pytest.raises(ValueError):
        relay_roles("public", "on", True)


def test_budget_counts_peers_and_connections():
    budget = RelayBudget(RelayLimits(max_peers=2, max_conns_per_peer=2))
    assert budget.register("a") is None and budget.register("b") is None
    assert budget.free_peers == 0
    assert budget.register("a") is None  # a re-registration is not a new peer
    assert budget.register("c").startswith("BUSY: this relay serves 2 peers")
    assert budget.open("a") is None and budget.open("a") is None
    assert "BUSY" in budget.open("a") and "2 relayed connections" in budget.open("a")
    assert budget.open("b") is None  # the limit is per peer
    budget.close("a")
    assert budget.open("a") is None
    assert "not registered" in budget.open("c")
    budget.unregister("a")
    assert budget.free_peers == 1 and budget.register("c") is None
    budget.close("zz")  # an unknown peer's close is ignored
    assert budget.free_peers == 0


def test_token_bucket_paces_to_its_rate():
    bucket = TokenBucket(rate=1000.0, burst=500.0)
    assert bucket.take(500, now_s=10.0) == 0.0  # the burst is free
    assert bucket.take(250, now_s=10.0) == pytest.approx(0.25)  # 250 bytes in debt at 1000 B/s
    # 1 s later the debt of 250 is paid and the level refilled to the burst, not past it
    assert bucket.take(500, now_s=11.0) == 0.0
    assert bucket.take(100, now_s=11.0) == pytest.approx(0.1)
    # over a long run, the waits add up to (bytes - burst) / rate
    b = TokenBucket(rate=100.0, burst=0.0)
    waits = [b.take(10, now_s=0.0) for _ in range(10)]
    assert waits[-1] == pytest.approx(1.0)


def _offer(peer: str, free: int = 1) -> RelayOffer:
    return RelayOffer(peer, ("/ip4/10.0.0.1/tcp/1",), max_peers=4, free_peers=free, max_conns_per_peer=8,
                      bytes_per_s=1 << 20)


def test_choose_relay_takes_the_nearest_with_room():
    offers = [_offer("far"), _offer("near"), _offer("full", free=0), _offer("self"), _offer("dead")]
    rtt = {"far": 40.0, "near": 3.0, "full": 1.0, "self": 0.1, "dead": math.inf}
    assert choose_relay(offers, rtt, own_peer_id="self").peer_id == "near"
    assert choose_relay(offers, rtt, own_peer_id="self", avoid={"near"}).peer_id == "far"
    assert choose_relay(offers, rtt, own_peer_id="self", avoid={"near", "far"}) is None
    assert choose_relay([_offer("b"), _offer("a")], {"a": 5.0, "b": 5.0}, "x").peer_id == "a"  # tie: id
    assert choose_relay([_offer("unmeasured")], {}, "x") is None
