"""Store-time and read-time checks of swarm's DHT records, plugged into hivemind's validator chain.

hivemind's `SchemaValidator` maps fixed field names to key hashes, so it cannot cover per-model keys
(`swarm/<model_id>/spans` for any model id). Instead `SwarmRecordValidator` recognises swarm records by
their *subkey*, which stays raw in a DHTRecord: `span[owner:...]` is an announcement and must satisfy
`records.AnnouncementSchema` (a pydantic schema) and carry the peer id of the signing key;
`blob:<name>[owner:...]` is a bounded byte string. A tombstone (value None) is allowed for both. It runs
after hivemind's `RSASignatureValidator`, which checks the owner's signature, so honest nodes refuse
unsigned, forged and malformed swarm records at store time; readers run the same checks again.

This module does not store, fetch or decide anything about routes.
"""

from __future__ import annotations

from typing import Any, Optional

from cryptography.exceptions import UnsupportedAlgorithm
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPublicKey

from swarm.dht.records import (
    ANNOUNCE_SUBKEY_TAG,
    BLOB_SUBKEY_TAG,
    MAX_BLOB_BYTES,
    MAX_BLOB_NAME_BYTES,
    Announcement,
    decode_announcement,
)
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


def is_announcement_subkey(subkey: Any) -> bool:
    """True for subkeys of the form `span[owner:...]` (see records.ANNOUNCE_SUBKEY_TAG)."""
    return isinstance(subkey, bytes) and subkey.startswith(ANNOUNCE_SUBKEY_TAG + b"[owner:")


def blob_name(subkey: Any) -> Optional[str]:
    """The caller's name inside a `blob:<name>[owner:...]` subkey, or None if the subkey is not a blob's."""
    if not isinstance(subkey, bytes) or not subkey.startswith(BLOB_SUBKEY_TAG):
        return None
    name, sep, _ = subkey[len(BLOB_SUBKEY_TAG) :].partition(b"[owner:")
    if not sep or len(name) > MAX_BLOB_NAME_BYTES:
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


class SwarmRecordValidator(RecordValidatorBase):
    """hivemind record validator for swarm's announcement and blob records (see module docstring).

    Records whose subkey carries neither tag are left to other validators (returns True).
    """

    def validate(self, record: DHTRecord) -> bool:
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            value = MSGPackSerializer.loads(record.value)
        except Exception:  # msgpack raises several unrelated types on garbage; hivemind writes msgpack only
            return False
        if isinstance(subkey, bytes) and subkey.startswith(ANNOUNCE_SUBKEY_TAG):
            if not is_announcement_subkey(subkey):
                return False
            return value is None or check_announcement(subkey, value) is not None
        if isinstance(subkey, bytes) and subkey.startswith(BLOB_SUBKEY_TAG):
            if blob_name(subkey) is None or owner_public_key(subkey) is None:
                return False
            return value is None or (isinstance(value, bytes) and len(value) <= MAX_BLOB_BYTES)
        return True

    @property
    def priority(self) -> int:
        return 0  # below RSASignatureValidator (10): runs after the signature is checked and stripped

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, SwarmRecordValidator)
