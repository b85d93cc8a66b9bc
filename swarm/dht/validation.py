"""Store-time and read-time checks of swarm's DHT records, plugged into hivemind's validator chain.

hivemind's `SchemaValidator` maps fixed field names to key hashes, so it cannot cover per-model keys
(`swarm/<model_id>/spans` for any model id). Instead `SwarmRecordValidator` recognises swarm records by
their *subkey*, which stays raw in a DHTRecord: `span[owner:...]` is an announcement and must satisfy
`records.AnnouncementSchema` (a pydantic schema) and carry the peer id of the signing key;
`blob:<name>[owner:...]` is a bounded byte string. A tombstone (value None) is allowed for both. It runs
after hivemind's `RSASignatureValidator`, which checks the owner's signature, so honest nodes refuse
unsigned, forged and malformed swarm records at store time; readers run the same checks again.

The DHT of a swarm holds swarm records only: every record must be one of those two kinds, signed. A plain
value (no subkey) or any other subkey is refused, because the validator sees only the hash of a key and
so cannot tell a swarm key from another; a plain value under `swarm/<model_id>/spans` would otherwise
replace every peer's announcement at once. An announcement's span must satisfy
0 <= start < end <= limits.MAX_LAYERS (the model's own layer count is checked by readers, which know
it), an announcement lies under the spans key of the model it names, and a subkey ends with its one
owner marker (so one signing key owns one announcement subkey per DHT key).

The checks depend on nothing but the record: hivemind refuses a whole dictionary on read when one of
its subkeys fails them, so a check that could pass on the storing node and fail on a reader (an
expiration bound against each one's clock) would let one record hide a key's every peer. Expirations
and sizes are bounded at store time by each node's storage (swarm.dht.storage).

`bound_entries` is the reader's bound on how many records of one key it accepts.

This module does not store, fetch or decide anything about routes.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from cryptography.exceptions import UnsupportedAlgorithm
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPublicKey

from swarm.dht.records import (
    ANNOUNCE_SUBKEY_TAG,
    BLOB_SUBKEY_TAG,
    MAX_BLOB_BYTES,
    MAX_BLOB_NAME_BYTES,
    Announcement,
    announcements_key,
    decode_announcement,
)
from swarm.limits import MAX_SUBKEYS_PER_KEY, MAX_SUBKEYS_PER_OWNER
from swarm.peerid import peer_id_of_public_key


def owner_public_key(subkey: Any) -> Optional[RSAPublicKey]:
    """The RSA key in a subkey's single `[owner:...]` marker, or None if absent, repeated or unparsable."""
    if not isinstance(subkey, bytes):
        return None
    found = RSASignatureValidator._PUBLIC_KEY_RE.findall(subkey)
    if len(found) != 1:
        return None
    try:
        return RSAPublicKey.from_bytes(found[0])
    except (ValueError, TypeError, UnsupportedAlgorithm):  # e.g. "ssh-foo AAAA": an unknown key type
        return None


_MARKER_RE = re.compile(RSASignatureValidator.PUBLIC_KEY_REGEX)


def _ends_in_one_marker(rest: bytes) -> bool:
    """True when `rest` is exactly one `[owner:...]` marker: nothing may follow it, so one key cannot
    make endless distinct subkeys (tombstones included) by appending bytes."""
    return _MARKER_RE.fullmatch(rest) is not None and len(_MARKER_RE.findall(rest)) == 1


def is_announcement_subkey(subkey: Any) -> bool:
    """True for subkeys of the form `span[owner:...]` (see records.ANNOUNCE_SUBKEY_TAG), nothing after."""
    return (
        isinstance(subkey, bytes)
        and subkey.startswith(ANNOUNCE_SUBKEY_TAG + b"[owner:")
        and _ends_in_one_marker(subkey[len(ANNOUNCE_SUBKEY_TAG) :])
    )


def blob_name(subkey: Any) -> Optional[str]:
    """The caller's name inside a `blob:<name>[owner:...]` subkey (nothing after the marker), or None if
    the subkey is not a blob's."""
    if not isinstance(subkey, bytes) or not subkey.startswith(BLOB_SUBKEY_TAG):
        return None
    name, sep, rest = subkey[len(BLOB_SUBKEY_TAG) :].partition(b"[owner:")
    if not sep or len(name) > MAX_BLOB_NAME_BYTES or not _ends_in_one_marker(sep + rest):
        return None
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        return None


def check_announcement(subkey: bytes, value: Any) -> Optional[Announcement]:
    """Decode an announcement stored under `subkey`; None unless it is well formed and its peer_id is
    the peer id of the subkey's owner key (so nobody can announce on behalf of another peer id)."""
    owner = owner_public_key(subkey)
    ann = decode_announcement(value)
    if owner is None or ann is None or ann.peer_id != peer_id_of_public_key(owner):
        return None
    return ann


def record_is_valid(key: bytes, subkey: Any, value: Any) -> bool:
    """The swarm's check of one decoded, signature-checked record (see module docstring); pure.

    Args:
        key: the DHT key's id as hivemind hashes it (DHTID bytes); an announcement must sit under the
            spans key of the model it names.
        subkey: the decoded subkey (None for a plain value).
        value: the decoded value (None for a tombstone).
    Returns:
        True for a well-formed announcement or blob record (or its tombstone) that owns an owner marker;
        False for anything else.
    """
    if is_announcement_subkey(subkey):
        if value is None:
            return True
        ann = check_announcement(subkey, value)
        return ann is not None and DHTID.generate(source=announcements_key(ann.model_id)).to_bytes() == key
    if blob_name(subkey) is not None and owner_public_key(subkey) is not None:
        return value is None or (isinstance(value, bytes) and len(value) <= MAX_BLOB_BYTES)
    return False


def bound_entries(entries: list[tuple[bytes, object, float]]) -> list[tuple[bytes, object, float]]:
    """The (subkey, value, expiration) entries a reader accepts from one key: latest expiring first, at
    most MAX_SUBKEYS_PER_OWNER per owner marker and MAX_SUBKEYS_PER_KEY in all; pure."""
    per_owner: dict[bytes, int] = {}
    kept = []
    for entry in sorted(entries, key=lambda e: -e[2]):
        owner = entry[0].partition(b"[owner:")[2]
        if per_owner.get(owner, 0) >= MAX_SUBKEYS_PER_OWNER:
            continue
        per_owner[owner] = per_owner.get(owner, 0) + 1
        kept.append(entry)
        if len(kept) == MAX_SUBKEYS_PER_KEY:
            break
    return kept


class SwarmRecordValidator(RecordValidatorBase):
    """hivemind record validator for swarm's announcement and blob records (see module docstring).

    Every other record (a plain value, an unknown or unsigned subkey) is refused.
    """

    def validate(self, record: DHTRecord) -> bool:
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            value = MSGPackSerializer.loads(record.value)
        except Exception:  # msgpack raises several unrelated types on garbage; hivemind writes msgpack only
            return False
        return record_is_valid(record.key, subkey, value)

    @property
    def priority(self) -> int:
        return 0  # below RSASignatureValidator (10): runs after the signature is checked and stripped

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, SwarmRecordValidator)
