"""Prefix hashes and offers, snapshot payloads (tampering refused with a reason), the bounded store,
and the prefix fields of the wire frames."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hivemind.utils.crypto import RSAPrivateKey

from swarm.dht.prefix_records import decode_holdings, encode_holdings
from swarm.errors import ProtocolError
from swarm.kv.prefix import (
    MAX_PREFIX_OFFERS,
    PREFIX_BLOCK_TOKENS,
    choose_restore,
    offer_lengths,
    prefix_hashes,
    prefix_offers,
)
from swarm.kv.snapshot import (
    Snapshot,
    SnapshotFormat,
    SnapshotKey,
    SnapshotRejected,
    decode_snapshot,
    encode_snapshot,
)
from swarm.kv.snapshot_store import SnapshotStore
from swarm.peer.snapshots import TAMPERS
from swarm.peerid import peer_id_of_public_key
from swarm.wire import MAX_HEADER_BYTES, Forward, Open, OpenOk, decode_frame, encode_frame

B = PREFIX_BLOCK_TOKENS
FMT = SnapshotFormat(1, "0.3.36", 3, "f16", True, B)
KEY = RSAPrivateKey()
HOLDER = peer_id_of_public_key(KEY.get_public_key())


def _tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 150_000, n)]


def test_shared_block_prefixes_hash_alike_and_differ_after_the_divergence():
    a, b = _tokens(1000), _tokens(1000)[:900] + _tokens(100, seed=1)
    la, lb = offer_lengths(1000), offer_lengths(1000)
    ha, hb = dict(zip(la, prefix_hashes(a, la))), dict(zip(lb, prefix_hashes(b, lb)))
    assert all(ha[n] == hb[n] for n in la if n <= 896)
    assert all(ha[n] != hb[n] for n in la if n > 900)
    # h(n) does not depend on which other lengths were asked for
    assert prefix_hashes(a, [192])[0] == ha[192] and prefix_hashes(a, [1000])[0] == ha[1000]


def test_offers_are_capped_fine_near_the_end_and_end_with_the_whole_prompt():
    assert offer_lengths(100) == [64, 100]
    assert offer_lengths(128) == [64, 128]  # 128 itself is the whole prompt, never a restore point
    long = offer_lengths(40_000)
    assert len(long) == MAX_PREFIX_OFFERS and long[-1] == 40_000
    top = (40_000 - 1) // B * B
    assert long[-33:-1] == list(range(top - 31 * B, top + 1, B))
    assert long == sorted(set(long))
    # the offers of a long prompt fit one Open header
    frame = Open(bytes(16), "c" * 52, "ab" * 32, 0, 8, 40_100, prefixes=prefix_offers(_tokens(40_000)))
    body = encode_frame(frame)
    assert len(body) < MAX_HEADER_BYTES and decode_frame(body) == frame


def test_choose_restore_takes_the_largest_block_every_hop_has_below_the_prompt():
    assert choose_restore([{64, 128, 960}, {64, 960}, {960, 1000}], below=1009) == 960
    assert choose_restore([{64, 128}, {192}], below=1009) == 0
    assert choose_restore([{1024}], below=1009) == 0
    assert choose_restore([], below=100) == 0


def test_wire_prefix_fields_round_trip_and_are_checked():
    offers = prefix_offers(_tokens(300))
    o = Open(bytes(16), "c", "ab", 0, 8, 400, prefixes=offers)
    assert decode_frame(encode_frame(o)) == o
    ok = OpenOk(400, restorable=(64, 128, 256), fetched_from="Qm" + "x" * 40)
    assert decode_frame(encode_frame(ok)) == ok
    f = Forward(step=1, pos0=256, hidden=np.zeros((3, 4), np.float32), restore=256)
    assert decode_frame(encode_frame(f)).restore == 256
    with pytest.raises(ProtocolError, match="restore"):
        Forward(step=1, pos0=0, hidden=np.zeros((3, 4), np.float32), restore=64)
    with pytest.raises(ProtocolError, match="prefixes"):
        Open(bytes(16), "c", "ab", 0, 8, 400, prefixes=((64, b"x" * 31),))
    with pytest.raises(ProtocolError, match="prefixes"):
        Open(bytes(16), "c", "ab", 0, 8, 400, prefixes=((128, bytes(32)), (64, bytes(32))))
    with pytest.raises(ProtocolError, match="restorable"):
        OpenOk(400, restorable=(128, 64))


def _snap(n: int = 300, start: int = 8, end: int = 16, kv: bytes | None = None, seed: int = 0) -> Snapshot:
    offers = prefix_offers(_tokens(n, seed))
    key = SnapshotKey("ab" * 32, start, end, offers[-1][1])
    return Snapshot(key, n, offers[:-1], FMT, kv if kv is not None else bytes(range(256)) * 40)


def test_snapshot_payload_round_trips_and_serves_block_prefixes():
    snap = _snap()
    got = decode_snapshot(encode_snapshot(snap, KEY), snap.key, FMT, HOLDER, 1 << 20)
    assert got == snap
    block = SnapshotKey(snap.key.model_id, 8, 16, snap.blocks[1][1])  # ask for the 128-token prefix
    assert decode_snapshot(encode_snapshot(snap, KEY), block, FMT, HOLDER, 1 << 20).kv == snap.kv


@pytest.mark.parametrize(
    "tamper, reason",
    [
        ("flip", "kv_sha256"),
        ("truncate", "truncated"),
        ("span", "key mismatch"),
        ("format", "format mismatch: version"),
    ],
)
def test_tampered_snapshots_are_rejected_with_a_reason(tamper, reason):
    snap = _snap()
    payload = TAMPERS[tamper](snap, KEY)
    with pytest.raises(SnapshotRejected, match=reason):
        decode_snapshot(payload, snap.key, FMT, HOLDER, 1 << 20)


def test_forged_signature_oversize_and_uncovered_prefix_are_rejected():
    snap = _snap()
    payload = bytearray(encode_snapshot(snap, KEY))
    payload[30] ^= 0x40  # inside the header: bad msgpack or bad signature
    with pytest.raises(SnapshotRejected):
        decode_snapshot(bytes(payload), snap.key, FMT, HOLDER, 1 << 20)
    other = peer_id_of_public_key(RSAPrivateKey().get_public_key())
    with pytest.raises(SnapshotRejected, match="not by the holder"):
        decode_snapshot(encode_snapshot(snap, KEY), snap.key, FMT, other, 1 << 20)
    with pytest.raises(SnapshotRejected, match="kv_bytes"):
        decode_snapshot(encode_snapshot(snap, KEY), snap.key, FMT, HOLDER, 100)
    stranger = SnapshotKey(snap.key.model_id, 8, 16, bytes(32))
    with pytest.raises(SnapshotRejected, match="does not cover"):
        decode_snapshot(encode_snapshot(snap, KEY), stranger, FMT, HOLDER, 1 << 20)
    with pytest.raises(SnapshotRejected, match="magic"):
        decode_snapshot(b"GGUF" + bytes(100), snap.key, FMT, HOLDER, 1 << 20)


def test_store_stays_in_budget_evicts_lru_and_indexes_blocks(tmp_path):
    store = SnapshotStore(memory_bytes=25_000, disk_dir=tmp_path, disk_bytes=25_000)
    snaps = [_snap(300, kv=bytes([i]) * 10_000, seed=i) for i in range(6)]
    for i, s in enumerate(snaps):
        assert store.put(s)
        assert store.memory_used <= 25_000 and store.disk_used <= 25_000
        if i == 2:
            assert store.get(snaps[0].key.prefix_hash) is not None  # touch: 0 is now most recent
    assert snaps[0].key.prefix_hash in store  # kept (recently used), 1 and 2 evicted
    assert snaps[1].key.prefix_hash not in store and snaps[2].key.prefix_hash not in store
    assert len(list(tmp_path.glob("*.kv"))) == 2
    for s in (snaps[0], snaps[5]):
        got = store.get(s.key.prefix_hash)
        assert got is not None and got.kv == s.kv
    offers = prefix_offers(_tokens(300, seed=5))
    restorable = store.restorable(offers)
    assert sorted(restorable) == [64, 128, 192, 256, 300]
    assert store.restorable(prefix_offers(_tokens(300, seed=1))) == {}
    assert not store.put(_snap(300, kv=bytes(30_000)))  # bigger than either tier


def test_full_disk_warns_and_the_store_keeps_working(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    store = SnapshotStore(memory_bytes=15_000, disk_dir=blocked / "snapshots", disk_bytes=100_000)
    with caplog.at_level(logging.WARNING):
        for i in range(3):
            store.put(_snap(300, kv=bytes([i]) * 10_000, seed=i))
    assert store.memory_used <= 15_000 and store.disk_used == 0
    assert store.warnings and "serving goes on" in store.warnings[0]
    assert any("cannot write a snapshot" in r.message for r in caplog.records)
    assert store.get(_snap(300, seed=2).key.prefix_hash) is not None


def test_holdings_record_round_trips_and_refuses_garbage():
    held = [(n, h) for n, h in prefix_offers(_tokens(300))]
    value = encode_holdings(["/ip4/127.0.0.1/tcp/1"], held)
    rec = decode_holdings("peer", value)
    assert rec is not None and list(rec.held) == held
    assert decode_holdings("peer", b"\x81\xa4held\x91\x92\x01\xa1x") is None
    assert decode_holdings("peer", b"\xff" * 10) is None


def test_offers_are_scoped_by_the_authenticated_owner():
    """A snapshot made from one client's rows is never found under another client's offers."""
    from swarm.kv.prefix import owner_scoped, prefix_offers

    offers = prefix_offers(list(range(300)))
    a, a2, b = owner_scoped(offers, "QmA"), owner_scoped(offers, "QmA"), owner_scoped(offers, "QmB")
    assert a == a2
    assert [n for n, _ in a] == [n for n, _ in offers]
    assert not {h for _, h in a} & {h for _, h in b}
    assert not {h for _, h in a} & {h for _, h in offers}
