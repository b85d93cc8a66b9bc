"""swarm.dht.storage: what one node keeps under one key (counts, bytes, lifetime, fairness)."""

from __future__ import annotations

from hivemind.dht.routing import DHTID
from hivemind.utils import get_dht_time

from swarm.dht.storage import BoundedStorage, Held, admit_subkey
from swarm.limits import (
    MAX_KEY_BYTES,
    MAX_RECORD_BYTES,
    MAX_RECORD_TTL_S,
    MAX_SUBKEYS_PER_KEY,
    MAX_SUBKEYS_PER_OWNER,
)

NOW = 1.8e9


def rec(name: bytes, owner: bytes, size: int = 100, exp: float = NOW + 60) -> Held:
    return Held(name + b"[owner:" + owner + b"]", size, exp)


def test_far_expirations_and_oversized_records_are_refused():
    assert admit_subkey([], rec(b"span", b"A", exp=NOW + MAX_RECORD_TTL_S), NOW) == []
    assert admit_subkey([], rec(b"span", b"A", exp=NOW + MAX_RECORD_TTL_S + 1), NOW) is None
    assert admit_subkey([], rec(b"span", b"A", exp=NOW + 10 * 365 * 86400), NOW) is None
    assert admit_subkey([], rec(b"blob:x", b"A", size=MAX_RECORD_BYTES), NOW) == []
    assert admit_subkey([], rec(b"blob:x", b"A", size=MAX_RECORD_BYTES + 1), NOW) is None


def test_one_signer_holds_at_most_its_share_of_subkeys():
    mine = [rec(b"blob:%d" % i, b"A") for i in range(MAX_SUBKEYS_PER_OWNER)]
    assert admit_subkey(mine, rec(b"blob:new", b"A"), NOW) is None
    assert admit_subkey(mine, rec(b"blob:0", b"A", exp=NOW + 90), NOW) == []  # a refresh replaces
    assert admit_subkey(mine, rec(b"span", b"B"), NOW) == []


def test_a_full_key_drops_the_biggest_signers_earliest_records_first():
    """Many flooders fill the key to MAX_SUBKEYS_PER_KEY; a peer with one announcement still gets in,
    and the record dropped is the earliest-expiring one of the signer holding the most bytes."""
    per = MAX_SUBKEYS_PER_KEY // 32
    flood = [rec(b"blob:%d" % i, b"K%d" % k, size=10, exp=NOW + i) for k in range(32) for i in range(per)]
    flood.append(rec(b"blob:big", b"K7", size=20, exp=NOW + 500))  # K7 now holds the most bytes
    flood = flood[1:]  # keep the key exactly full
    assert len(flood) == MAX_SUBKEYS_PER_KEY
    assert admit_subkey(flood, rec(b"span", b"HONEST", size=10), NOW) == [b"blob:0[owner:K7]"]
    # a flooder adding one more is refused: it would be the biggest itself
    assert admit_subkey(flood, rec(b"blob:more", b"K7", size=10), NOW) is None


def test_bytes_per_key_are_bounded_fairly():
    big = MAX_RECORD_BYTES
    n = MAX_KEY_BYTES // big
    heavy = [rec(b"blob:%d" % i, b"HEAVY", size=big, exp=NOW + i) for i in range(n)]
    assert admit_subkey(heavy, rec(b"span", b"HONEST", size=big), NOW) == [b"blob:0[owner:HEAVY]"]
    assert admit_subkey(heavy, rec(b"blob:more", b"HEAVY", size=big), NOW) is None
    # equal shares: the newcomer loses the tie instead of evicting an equal
    half = [rec(b"blob:%d" % i, b"A" if i % 2 else b"B", size=big) for i in range(n)]
    assert admit_subkey(half, rec(b"blob:x", b"C", size=MAX_KEY_BYTES // 2 + big), NOW) is None


def test_bounded_storage_keeps_a_flood_to_one_signers_share():
    """hivemind's own storage class with the bounds applied: 1,000 subkeys from one signer leave
    MAX_SUBKEYS_PER_OWNER, and another signer's record still goes in."""
    storage, key, now = BoundedStorage(), DHTID.generate(source="swarm/x/spans"), get_dht_time()
    stored = [storage.store(key, b"v" * 1000, now + 60, subkey=b"blob:%d[owner:K]" % i) for i in range(1000)]
    assert sum(stored) == MAX_SUBKEYS_PER_OWNER
    assert storage.store(key, b"a", now + 60, subkey=b"span[owner:P]")
    assert not storage.store(key, b"a", now + MAX_RECORD_TTL_S + 5, subkey=b"span[owner:Q]")
    held = dict(storage.get(key).value.items())
    assert len(held) == MAX_SUBKEYS_PER_OWNER + 1 and b"span[owner:P]" in held
