"""DHT records that let a peer find a model's bytes: the manifest record and the seeder record.

Both are msgpack maps with a version field `v`; decoders bound every size, check every type,
ignore unknown fields (forward compatibility) and raise `ProtocolError` on anything else.

- manifest record: `{v, manifest: bytes}`; decoding checks that the bytes hash to the model_id
  the record was stored under (`Manifest.from_bytes(..., expected_model_id=model_id)`).
- seeder record: `{v, infohash: str, host: str, port: int[, torrent: bytes]}`; the torrent is
  optional (a fetcher can get the metadata from the seeder by info-hash,
  `ArtifactSession.fetch_metadata`); when present, decoding parses it and checks that its
  info-hash matches and that its single file is named by the model_id.

This module does not talk to the DHT (the caller stores/gets the bytes under the model_id).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

import msgpack

from swarm.artifacts.torrent import MAX_TORRENT_BYTES, parse_torrent
from swarm.errors import ArtifactError, ProtocolError
from swarm.manifest import MAX_MANIFEST_BYTES, Manifest

RECORD_VERSION = 1
MAX_SEEDER_RECORD_BYTES = MAX_TORRENT_BYTES + 1024
MAX_MANIFEST_RECORD_BYTES = MAX_MANIFEST_BYTES + 1024
_MAX_HOST_CHARS = 64
_INFOHASH = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class SeederRecord:
    """One peer that seeds (part of) a model's GGUF.

    Attributes:
        infohash: hex of the torrent's v1 info-hash (`Torrent.infohash`, 40 chars).
        host: IP address literal the peer accepts BitTorrent connections on.
        port: TCP port, 1..65535.
        torrent: bencoded torrent (at most `MAX_TORRENT_BYTES`), or None when fetchers should get
            the metadata from the seeder (keeps the record small: a DHT blob is bounded).
    """

    infohash: str
    host: str
    port: int
    torrent: bytes | None = None


def encode_seeder(record: SeederRecord) -> bytes:
    """msgpack bytes of a seeder record (at most `MAX_SEEDER_RECORD_BYTES`).

    Raises:
        ProtocolError: the record would not decode (bad info-hash, host, port, oversized torrent).
    """
    _check_address(record.host, record.port)
    _check_infohash(record.infohash)
    body = {"v": RECORD_VERSION, "infohash": record.infohash, "host": record.host, "port": record.port}
    if record.torrent is not None:
        if len(record.torrent) > MAX_TORRENT_BYTES:
            raise ProtocolError(f"torrent of {len(record.torrent)} bytes exceeds {MAX_TORRENT_BYTES}")
        body["torrent"] = record.torrent
    return msgpack.packb(body, use_bin_type=True)


def decode_seeder(data: bytes, model_id: str) -> SeederRecord:
    """Parse and check a seeder record stored under `model_id`.

    Args:
        data: record bytes from the DHT.
        model_id: the key it was found under; the torrent's file must be named by it.
    Returns:
        the record.
    Raises:
        ProtocolError: oversized, malformed, other version, bad info-hash or address, or a torrent
            that does not parse, whose info-hash differs from the record's, or names another model.
    """
    body = _unpack(data, MAX_SEEDER_RECORD_BYTES, "seeder")
    infohash, torrent, host, port = (body.get(k) for k in ("infohash", "torrent", "host", "port"))
    if not (
        isinstance(infohash, str)
        and isinstance(host, str)
        and isinstance(port, int)
        and not isinstance(port, bool)
        and (torrent is None or isinstance(torrent, bytes))
    ):
        raise ProtocolError("seeder record: infohash/host/port missing, or a field of the wrong type")
    _check_address(host, port)
    _check_infohash(infohash)
    if torrent is None:
        return SeederRecord(infohash=infohash, host=host, port=port)
    try:
        parsed = parse_torrent(torrent)
    except ArtifactError as e:
        raise ProtocolError(f"seeder record: {e}") from e
    if parsed.infohash != infohash:
        raise ProtocolError(f"seeder record: torrent infohash {parsed.infohash} is not {infohash[:40]!r}")
    if parsed.name != model_id:
        raise ProtocolError(
            f"seeder record: torrent is for model {parsed.name[:16]}..., not {model_id[:16]}..."
        )
    return SeederRecord(infohash=infohash, host=host, port=port, torrent=torrent)


def encode_manifest(manifest: Manifest) -> bytes:
    """msgpack bytes of a manifest record (its canonical bytes inside)."""
    return msgpack.packb({"v": RECORD_VERSION, "manifest": manifest.to_bytes()}, use_bin_type=True)


def decode_manifest(data: bytes, model_id: str) -> Manifest:
    """Parse a manifest record stored under `model_id` and check the manifest hashes to it.

    Raises:
        ProtocolError: oversized, malformed, other version, or a manifest that is not the model's.
    """
    body = _unpack(data, MAX_MANIFEST_RECORD_BYTES, "manifest")
    raw = body.get("manifest")
    if not isinstance(raw, bytes):
        raise ProtocolError("manifest record: `manifest` missing or not bytes")
    return Manifest.from_bytes(raw, expected_model_id=model_id)


def _unpack(data: bytes, max_bytes: int, kind: str) -> dict:
    if not isinstance(data, bytes):
        raise ProtocolError(f"{kind} record is not bytes")
    if len(data) > max_bytes:
        raise ProtocolError(f"{kind} record of {len(data)} bytes exceeds {max_bytes}")
    try:
        body = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=max_bytes,
            max_array_len=64,
            max_map_len=64,
        )
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise ProtocolError(f"{kind} record is not valid msgpack: {e}") from e
    if not isinstance(body, dict):
        raise ProtocolError(f"{kind} record is not a map")
    if body.get("v") != RECORD_VERSION:
        raise ProtocolError(f"{kind} record has version {body.get('v')!r}, expected {RECORD_VERSION}")
    return body


def _check_infohash(infohash: str) -> None:
    if not _INFOHASH.fullmatch(infohash):
        raise ProtocolError(f"seeder infohash {infohash[:48]!r} is not 40 lowercase hex chars")


def _check_address(host: str, port: int) -> None:
    if len(host) > _MAX_HOST_CHARS:
        raise ProtocolError("seeder host is too long")
    try:
        ipaddress.ip_address(host)
    except ValueError as e:
        raise ProtocolError(f"seeder host {host!r} is not an IP address") from e
    if not 1 <= port <= 65535:
        raise ProtocolError(f"seeder port {port} is out of range")
