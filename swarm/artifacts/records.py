"""DHT records that let a peer find a model's bytes: the manifest record and the seeder record.

Both are msgpack maps with a version field `v`; decoders bound every size, check every type,
ignore unknown fields (forward compatibility) and raise `ProtocolError` on anything else.

- manifest record: `{v, manifest: bytes}`; decoding checks that the bytes hash to the model_id
  the record was stored under (`Manifest.from_bytes(..., expected_model_id=model_id)`).
- seeder record: `{v, infohash: str, host: str, port: int[, more: [[host, port], ...]][, torrent: bytes]}`;
  `host`/`port` is the seeder's first BitTorrent address and `more` its others (a peer listening on
  every interface has one per interface address; at most `MAX_SEEDER_ADDRS` in all); every host is
  an IP literal other peers can dial (not a wildcard, multicast or scoped address). The torrent is
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
MAX_SEEDER_ADDRS = 16
"""Most BitTorrent addresses one seeder record carries (`host`/`port` plus `more`)."""
_MAX_HOST_CHARS = 64
_INFOHASH = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class SeederRecord:
    """One peer that seeds (part of) a model's GGUF.

    Attributes:
        infohash: hex of the torrent's v1 info-hash (`Torrent.infohash`, 40 chars).
        host: IP address literal the peer accepts BitTorrent connections on (IPv4 or IPv6; not a
            wildcard, multicast or scoped address).
        port: TCP port, 1..65535.
        torrent: bencoded torrent (at most `MAX_TORRENT_BYTES`), or None when fetchers should get
            the metadata from the seeder (keeps the record small: a DHT blob is bounded).
        more: the peer's other `(host, port)` addresses, at most MAX_SEEDER_ADDRS - 1.
    """

    infohash: str
    host: str
    port: int
    torrent: bytes | None = None
    more: tuple[tuple[str, int], ...] = ()

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """Every `(host, port)` of the seeder, the first one first."""
        return ((self.host, self.port), *self.more)


def encode_seeder(record: SeederRecord) -> bytes:
    """msgpack bytes of a seeder record (at most `MAX_SEEDER_RECORD_BYTES`).

    Raises:
        ProtocolError: the record would not decode (bad info-hash, host, port, too many addresses,
            oversized torrent).
    """
    _check_addresses(record.addresses)
    _check_infohash(record.infohash)
    body = {"v": RECORD_VERSION, "infohash": record.infohash, "host": record.host, "port": record.port}
    if record.more:
        body["more"] = [[h, p] for h, p in record.more]
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
    more = body.get("more", [])
    if not (
        isinstance(infohash, str)
        and (torrent is None or isinstance(torrent, bytes))
        and isinstance(more, list)
        and all(isinstance(a, list) and len(a) == 2 for a in more)
    ):
        raise ProtocolError("seeder record: infohash/host/port missing, or a field of the wrong type")
    addresses = ((host, port), *((a[0], a[1]) for a in more))
    _check_addresses(addresses)
    _check_infohash(infohash)
    if torrent is None:
        return SeederRecord(infohash=infohash, host=host, port=port, more=addresses[1:])
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
    return SeederRecord(infohash=infohash, host=host, port=port, torrent=torrent, more=addresses[1:])


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


def _check_addresses(addresses: tuple) -> None:
    if not 1 <= len(addresses) <= MAX_SEEDER_ADDRS:
        raise ProtocolError(f"seeder record has {len(addresses)} addresses; at most {MAX_SEEDER_ADDRS}")
    for host, port in addresses:
        _check_address(host, port)


def _check_address(host: object, port: object) -> None:
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
        raise ProtocolError("seeder address must be a (host string, port integer) pair")
    if len(host) > _MAX_HOST_CHARS:
        raise ProtocolError("seeder host is too long")
    try:
        ip = ipaddress.ip_address(host)  # a scoped IPv6 "fe80::1%eth0" parses, but means nothing elsewhere
    except ValueError:
        raise ProtocolError(f"seeder host {host[:_MAX_HOST_CHARS]!r} is not an IP address") from None
    if ip.is_unspecified or ip.is_multicast or "%" in host:
        raise ProtocolError(f"seeder host {host!r} is not an address other peers can connect to")
    if not 1 <= port <= 65535:
        raise ProtocolError(f"seeder port {port} is out of range")
