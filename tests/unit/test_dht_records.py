"""Announcement codec bounds, and the store-time validator chain (signature + schema), without a network."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPrivateKey

from swarm.dht.records import (
    ANNOUNCE_SUBKEY_TAG,
    BLOB_SUBKEY_TAG,
    MAX_ADDRS,
    MAX_BLOB_BYTES,
    MAX_LAYER,
    Announcement,
    announcements_key,
    decode_announcement,
    encode_announcement,
)
from swarm.dht.validation import SwarmRecordValidator, bound_entries, check_announcement
from swarm.errors import ProtocolError
from swarm.limits import MAX_LAYERS, MAX_RECORD_TTL_S, MAX_SUBKEYS_PER_KEY, MAX_SUBKEYS_PER_OWNER
from swarm.peerid import peer_id_of_public_key

KEY = RSAPrivateKey()
OTHER_KEY = RSAPrivateKey()
PEER_ID = peer_id_of_public_key(KEY.get_public_key())


def make_ann(**changes) -> Announcement:
    ann = Announcement(
        peer_id=PEER_ID,
        addrs=(f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER_ID}",),
        model_id="0123456789abcdef" * 4,
        start=3,
        end=17,
        decode_steps_per_s=120.5,
        prefill_tokens_per_s=900.0,
        free_cache_tokens=65536,
        max_sessions=8,
        sessions_free=5,
        version="0.1.0",
        protocol=1,
        public_name="alice",
        expires_at=1.7e9,
    )
    return dataclasses.replace(ann, **changes)


def test_round_trip_keeps_every_field():
    ann = make_ann()
    record = encode_announcement(ann)
    assert MSGPackSerializer.loads(MSGPackSerializer.dumps(record)) == record
    assert decode_announcement(MSGPackSerializer.loads(MSGPackSerializer.dumps(record))) == ann


def test_unknown_fields_are_ignored():
    record = encode_announcement(make_ann(public_name=None))
    record["future_field"] = {"anything": [1, 2, 3]}
    assert decode_announcement(record) == make_ann(public_name=None)


@pytest.mark.parametrize(
    "field, bad",
    [
        ("start", 17),
        ("start", 20),
        ("start", -1),
        ("end", MAX_LAYER + 1),
        ("start", 3.0),
        ("end", "17"),
        ("decode_steps_per_s", 120),
        ("decode_steps_per_s", math.nan),
        ("prefill_tokens_per_s", -1.0),
        ("decode_steps_per_s", math.inf),
        ("free_cache_tokens", -5),
        ("sessions_free", 9),
        ("addrs", ["/ip4/1.2.3.4/tcp/1"] * (MAX_ADDRS + 1)),
        ("addrs", ["x" * 300]),
        ("addrs", "notalist"),
        ("peer_id", "0OIl" * 10),
        ("peer_id", b"QmBytesNotStr" * 3),
        ("model_id", "XYZ"),
        ("model_id", "ab"),
        ("version", "v" * 65),
        ("public_name", "n" * 65),
        ("protocol", True),
        ("expires_at", None),
    ],
)
def test_out_of_bounds_or_wrong_type_is_dropped(field, bad):
    record = encode_announcement(make_ann())
    record[field] = bad
    assert decode_announcement(record) is None


@pytest.mark.parametrize("value", [None, [], "span", b"\x00", {"peer_id": PEER_ID}])
def test_non_records_are_dropped(value):
    assert decode_announcement(value) is None


def test_missing_field_is_dropped():
    record = encode_announcement(make_ann())
    del record["end"]
    assert decode_announcement(record) is None


def test_encode_refuses_an_invalid_announcement():
    with pytest.raises(ProtocolError):
        encode_announcement(make_ann(start=5, end=5))


def _signed_record(
    signer_key,
    subkey: bytes,
    value,
    *,
    marker_key=None,
    suffix: bytes = b"",
    expiration: float = 1e9,
    key: bytes | None = None,
) -> DHTRecord:
    """Build the DHTRecord a node with `signer_key` would send under `key` (by default the spans key of
    make_ann's model); the subkey carries `marker_key`'s marker (then `suffix`)."""
    key = key or DHTID.generate(source=announcements_key(make_ann().model_id)).to_bytes()
    marker = RSASignatureValidator(marker_key or signer_key).local_public_key
    packed_subkey = MSGPackSerializer.dumps(subkey + marker + suffix)
    record = DHTRecord(key, packed_subkey, MSGPackSerializer.dumps(value), expiration)
    signer = RSASignatureValidator(signer_key)
    signed_by = signer._private_key.sign(signer._serialize_record(record))
    return dataclasses.replace(record, value=record.value + b"[signature:" + signed_by + b"]")


def chain() -> CompositeValidator:
    return CompositeValidator([RSASignatureValidator(KEY), SwarmRecordValidator()])


def test_validator_accepts_signed_well_formed_records_and_tombstones():
    assert chain().validate(_signed_record(KEY, ANNOUNCE_SUBKEY_TAG, encode_announcement(make_ann())))
    assert chain().validate(_signed_record(KEY, ANNOUNCE_SUBKEY_TAG, None))
    assert chain().validate(_signed_record(KEY, BLOB_SUBKEY_TAG + b"infohash", b"\x01" * 32))


def test_validator_rejects_forged_unsigned_malformed_and_impersonating_records():
    good = encode_announcement(make_ann())
    # signed by another key while the subkey names KEY's owner marker
    assert not chain().validate(_signed_record(OTHER_KEY, ANNOUNCE_SUBKEY_TAG, good, marker_key=KEY))
    # unsigned
    unsigned = _signed_record(KEY, ANNOUNCE_SUBKEY_TAG, good)
    unsigned = dataclasses.replace(unsigned, value=MSGPackSerializer.dumps(good))
    assert not chain().validate(unsigned)
    # schema-malformed, correctly signed
    bad = dict(good, start=30)
    assert not chain().validate(_signed_record(KEY, ANNOUNCE_SUBKEY_TAG, bad))
    # OTHER_KEY signs its own subkey correctly but claims KEY's peer id
    assert not chain().validate(_signed_record(OTHER_KEY, ANNOUNCE_SUBKEY_TAG, good))
    # a "span" subkey without an owner marker
    plain = DHTRecord(b"k" * 20, MSGPackSerializer.dumps(b"span"), MSGPackSerializer.dumps(good), 1e9)
    assert not chain().validate(plain)
    # oversized blob
    assert not chain().validate(_signed_record(KEY, BLOB_SUBKEY_TAG + b"x", b"\x00" * (MAX_BLOB_BYTES + 1)))


NOW = 1.8e9
"""A DHT time for records' expirations."""


def test_validator_refuses_foreign_records():
    """The swarm's DHT holds swarm records only (the validator cannot tell a swarm key from its hash)."""
    plain = DHTRecord(b"k" * 20, MSGPackSerializer.dumps(b"other"), MSGPackSerializer.dumps([1, 2]), 1e9)
    assert not chain().validate(plain)


def test_validator_refuses_a_plain_value_without_subkey():
    """issue 24: one plain value under swarm/<model>/spans replaced every peer's announcement."""
    good = encode_announcement(make_ann())
    for value in (good, b"x", None, {}):
        plain = DHTRecord(b"k" * 20, MSGPackSerializer.dumps(None), MSGPackSerializer.dumps(value), NOW + 60)
        assert not chain().validate(plain)


def test_validator_refuses_unsigned_subkeys():
    """Any subkey without one owner marker ending it: junk, a bare tag, or bytes after the marker."""
    marker = RSASignatureValidator(KEY).local_public_key
    junk = MSGPackSerializer.dumps(b"\0" * 1000)
    trailing = (ANNOUNCE_SUBKEY_TAG + marker + b"x", b"blob:x" + marker + b"y")
    for subkey in (b"junk0001", b"blob:x", b"span", *trailing):
        record = DHTRecord(b"k" * 20, MSGPackSerializer.dumps(subkey), junk, NOW + 60)
        assert not chain().validate(record), subkey
    # appended bytes make another subkey, even when signed by the marker's owner
    assert not chain().validate(_signed_record(KEY, ANNOUNCE_SUBKEY_TAG, None, suffix=b"x"))
    assert not chain().validate(_signed_record(KEY, BLOB_SUBKEY_TAG + b"n", b"v", suffix=b"x"))


def test_validator_passes_any_expiration():
    """The validators do not check expirations (each node's storage does, at store time): on read,
    hivemind drops a whole dictionary when one subkey fails them, and an expiration near the bound
    would pass on the storing node and fail on a reader whose clock is a few seconds slower."""
    good = encode_announcement(make_ann())
    for expiration in (NOW - 1, NOW + MAX_RECORD_TTL_S + 5, NOW + 10 * 365 * 86400):
        assert chain().validate(_signed_record(KEY, ANNOUNCE_SUBKEY_TAG, good, expiration=expiration))


@pytest.mark.parametrize("start, end", [(0, 100_000), (25, MAX_LAYERS + 1), (MAX_LAYERS, MAX_LAYERS + 1)])
def test_validator_refuses_spans_outside_any_model(start, end):
    bad = dict(encode_announcement(make_ann()), start=start, end=end)
    assert not chain().validate(_signed_record(KEY, ANNOUNCE_SUBKEY_TAG, bad, expiration=NOW + 60))
    good = dict(bad, start=0, end=MAX_LAYERS)
    assert chain().validate(_signed_record(KEY, ANNOUNCE_SUBKEY_TAG, good, expiration=NOW + 60))


def test_check_announcement_binds_peer_id_to_subkey_owner():
    marker = RSASignatureValidator(KEY).local_public_key
    other_marker = RSASignatureValidator(OTHER_KEY).local_public_key
    record = encode_announcement(make_ann())
    assert check_announcement(ANNOUNCE_SUBKEY_TAG + marker, record) == make_ann()
    assert check_announcement(ANNOUNCE_SUBKEY_TAG + other_marker, record) is None
    assert check_announcement(ANNOUNCE_SUBKEY_TAG + marker + other_marker, record) is None


def test_reader_bounds_subkeys_per_owner_and_per_key():
    """A reader keeps at most MAX_SUBKEYS_PER_OWNER records of one key owner and MAX_SUBKEYS_PER_KEY
    in all, latest expiring first (the validators already bound each value's size)."""
    flood = [(b"blob:%d[owner:K1]" % i, b"v", 100.0 + i) for i in range(MAX_SUBKEYS_PER_OWNER + 50)]
    honest = (b"span[owner:K2]", {"x": 1}, 50.0)
    kept = bound_entries(flood + [honest])
    assert honest in kept
    assert len(kept) == MAX_SUBKEYS_PER_OWNER + 1
    assert min(e[2] for e in kept if e is not honest) == 100.0 + 50
    many = [(b"span[owner:K%d]" % i, None, 1.0) for i in range(MAX_SUBKEYS_PER_KEY + 10)]
    assert len(bound_entries(many)) == MAX_SUBKEYS_PER_KEY


def test_validator_refuses_an_announcement_under_another_models_key():
    good = encode_announcement(make_ann())
    other_key = DHTID.generate(source=announcements_key("ab" * 16)).to_bytes()
    assert not chain().validate(_signed_record(KEY, ANNOUNCE_SUBKEY_TAG, good, key=other_key))
    assert chain().validate(_signed_record(KEY, ANNOUNCE_SUBKEY_TAG, None, key=other_key))  # a tombstone


def test_limits_per_client_round_trip_and_an_older_record_without_them_still_parses():
    ann = make_ann(client_sessions=4, client_kv_tokens=8192, client_streams=16, client_bytes=128 << 20,
                   max_streams=256, max_buffered_bytes=256 << 20)
    assert decode_announcement(encode_announcement(ann)) == ann
    older = encode_announcement(make_ann())
    for name in ("client_sessions", "client_kv_tokens", "client_streams", "client_bytes", "max_streams",
                 "max_buffered_bytes"):
        del older[name]
    assert decode_announcement(older) == make_ann()
