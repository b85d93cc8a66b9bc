"""Model bytes through the swarm's own DHT: publish a GGUF, find and fetch just what a peer needs.

Under keys derived from the model_id, publishers and seeders store signed DHT blobs:

- `swarm/<model_id>/manifest`: the manifest record, zstd-compressed and cut into blobs
  `part<i>of<n>` (a DHT blob is at most 64 KiB; large models have large manifests). A fetcher
  joins the parts of one owner and accepts them only if the manifest hashes to the model_id.
- `swarm/<model_id>/seeders`: one seeder record per peer (v1 info-hash and BitTorrent addresses);
  the torrent itself comes from the seeders by info-hash (BitTorrent metadata exchange).

No tracker and no central host: everything is found from the model_id. The libtorrent session
is synchronous and not thread-safe; its calls run one at a time in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import zstandard

from swarm.artifacts.plan import ByteRange, merge_ranges, span_byte_ranges
from swarm.artifacts.records import (
    MAX_MANIFEST_RECORD_BYTES,
    MAX_SEEDER_ADDRS,
    SeederRecord,
    decode_manifest,
    decode_seeder,
    encode_manifest,
    encode_seeder,
)
from swarm.artifacts.session import ArtifactSession
from swarm.artifacts.torrent import Torrent, make_torrent
from swarm.dht.node import SwarmDHT
from swarm.errors import ArtifactError, ProtocolError
from swarm.manifest import Manifest

logger = logging.getLogger(__name__)

RECORD_TTL_S = 300.0
"""Lifetime of manifest and seeder records; publishers refresh them every third of it."""
_PART_BYTES = 60_000
_MAX_PARTS = 48
"""One publisher's parts must fit under one key: 48 x 60,000 B plus record overheads stays under
limits.MAX_KEY_BYTES (3 MiB)."""


def manifest_key(model_id: str) -> str:
    """DHT key of the manifest record blobs."""
    return f"swarm/{model_id}/manifest"


def seeders_key(model_id: str) -> str:
    """DHT key of the seeder records."""
    return f"swarm/{model_id}/seeders"


def manifest_parts(manifest: Manifest) -> list[bytes]:
    """The manifest record, zstd-compressed, cut into blob-sized parts."""
    packed = zstandard.ZstdCompressor(level=19).compress(encode_manifest(manifest))
    parts = [packed[i : i + _PART_BYTES] for i in range(0, len(packed), _PART_BYTES)]
    if len(parts) > _MAX_PARTS:
        raise ArtifactError(
            f"manifest of {len(packed)} compressed bytes needs more than {_MAX_PARTS} DHT blobs"
        )
    return parts


def join_manifest(parts: list[bytes], model_id: str) -> Manifest:
    """Inverse of `manifest_parts`, checking the manifest hashes to `model_id`.

    Bounds: never allocates more than MAX_MANIFEST_RECORD_BYTES for the decompressed record: a
    frame that declares a larger content size is refused before decompressing (zstandard would
    otherwise allocate whatever the header declares, ignoring `max_output_size`).

    Raises:
        ProtocolError: parts that are not bytes or do not decompress, an oversized result, or
            another model's manifest.
    """
    if not isinstance(parts, list) or not all(isinstance(p, bytes) for p in parts):
        raise ProtocolError("manifest parts must be a list of bytes")
    data = b"".join(parts)
    try:
        declared = zstandard.frame_content_size(data)  # -1: not declared
        if declared > MAX_MANIFEST_RECORD_BYTES:
            raise ProtocolError(f"manifest record declares {declared} B, over {MAX_MANIFEST_RECORD_BYTES}")
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_MANIFEST_RECORD_BYTES)
    except zstandard.ZstdError as e:
        raise ProtocolError(f"manifest record does not decompress: {e}") from e
    return decode_manifest(raw, model_id)


@dataclass
class Publication:
    """What a peer publishes for one model: the manifest, and itself as a seeder of `infohash`.

    Attributes:
        addresses: the BitTorrent `(host, port)` pairs other peers reach this seeder at
            (`ArtifactSession.addresses`), at most `records.MAX_SEEDER_ADDRS`.
    """

    manifest: Manifest
    infohash: str
    addresses: tuple[tuple[str, int], ...]

    async def store(self, dht: SwarmDHT) -> None:
        """Store (or refresh) the records.

        Raises:
            DHTError: no DHT node accepted them.
            ProtocolError: an address cannot go in a seeder record (see `records.encode_seeder`).
        """
        parts = manifest_parts(self.manifest)
        for i, part in enumerate(parts):
            await dht.store_blob(
                manifest_key(self.manifest.model_id), f"part{i}of{len(parts)}", part, RECORD_TTL_S
            )
        (host, port), *more = self.addresses[:MAX_SEEDER_ADDRS]
        record = encode_seeder(SeederRecord(infohash=self.infohash, host=host, port=port, more=tuple(more)))
        await dht.store_blob(seeders_key(self.manifest.model_id), "seeder", record, RECORD_TTL_S)

    async def refresh_forever(self, dht: SwarmDHT) -> None:
        """Re-store every third of the record lifetime until cancelled; failures are logged."""
        while True:
            await asyncio.sleep(RECORD_TTL_S / 3)
            try:
                await self.store(dht)
            except Exception as e:  # noqa: BLE001 - one failed refresh must not stop seeding
                logger.warning("refreshing the artifact records failed: %s", e)


async def publish(dht: SwarmDHT, artifacts: ArtifactSession, path: Path, manifest: Manifest) -> Publication:
    """Seed the whole file at `path` and publish its manifest and this seeder.

    Raises:
        ArtifactError: the file does not match the manifest or cannot be seeded.
        DHTError: no DHT node accepted the records.
    """
    torrent: Torrent = await asyncio.to_thread(make_torrent, path, manifest)
    await asyncio.to_thread(artifacts.seed, path, torrent.data)
    pub = Publication(manifest, torrent.infohash, artifacts.addresses)
    await pub.store(dht)
    return pub


async def find_manifest(dht: SwarmDHT, model_id: str) -> Manifest:
    """The verified manifest of `model_id` from the DHT.

    Raises:
        ArtifactError: no peer publishes a manifest for it, or none that hashes to it.
    """
    blobs = await dht.get_blob(manifest_key(model_id))
    by_owner: dict[str, dict[str, bytes]] = {}
    for b in blobs:
        by_owner.setdefault(b.owner_peer_id, {})[b.name] = b.value
    problems = []
    for owner, named in by_owner.items():
        try:
            n = _part_count(named)
            return join_manifest([named[f"part{i}of{n}"] for i in range(n)], model_id)
        except (ProtocolError, KeyError) as e:
            problems.append(f"{owner[:12]}…: {e}")
            logger.warning("ignoring the manifest record of %s: %s", owner, e)
    if problems:
        raise ArtifactError(f"no valid manifest for model {model_id[:16]}… ({'; '.join(problems)[:300]})")
    raise ArtifactError(f"unknown model {model_id[:16]}…: no peer publishes its manifest")


async def find_seeders(dht: SwarmDHT, model_id: str) -> list[SeederRecord]:
    """Valid seeder records of `model_id` (malformed ones are logged and skipped)."""
    found = []
    for b in await dht.get_blob(seeders_key(model_id)):
        try:
            found.append(decode_seeder(b.value, model_id))
        except ProtocolError as e:
            logger.warning("ignoring the seeder record of %s: %s", b.owner_peer_id, e)
    return found


def span_ranges(manifest: Manifest, start: int, end: int) -> list[ByteRange]:
    """Bytes a peer serving [start, end) needs: header, the span's blocks, and the head on the last span
    (with the multi-token-prediction head where its row serves one: `Manifest.mtp_head_tensors`).

    `output_norm` is fetched on every span: the span builder copies it (2-4 KB) into each span file.
    """
    last = end == manifest.n_layers
    ranges = span_byte_ranges(manifest, start, end, need_embd=False, need_head=last, need_mtp=last)
    norm = manifest.tensor("output_norm.weight")
    return merge_ranges([*ranges, (norm.offset, norm.nbytes)])


def client_ranges(manifest: Manifest) -> list[ByteRange]:
    """Bytes a client needs: the header (tokenizer, chat template) and `token_embd` (it embeds tokens)."""
    embd = manifest.tensor("token_embd.weight")
    return merge_ranges([(0, manifest.data_offset), (embd.offset, embd.nbytes)])


async def acquire(
    dht: SwarmDHT, artifacts: ArtifactSession, model_id: str, dest: Path, ranges_of, progress: bool = True
) -> tuple[Path, Manifest, Publication]:
    """Fetch from the swarm the bytes of `model_id` that `ranges_of(manifest)` names, verified.

    Args:
        dest: where the sparse GGUF goes (resumes an earlier partial fetch there).
        ranges_of: manifest → byte ranges (`span_ranges` or `client_ranges`).
    Returns:
        (path of the verified sparse file, the manifest, this peer's seeder publication — call
        `store` on it to seed what it holds).
    Raises:
        ArtifactError: unknown model_id, no seeders, download failure, or a hash mismatch. No file
            appears at `dest` unless every needed tensor verified.
    """
    manifest = await find_manifest(dht, model_id)
    seeders = await find_seeders(dht, model_id)
    if not seeders:
        raise ArtifactError(f"no seeders for model {model_id[:16]}…")
    own = set(artifacts.addresses)
    peers = list(dict.fromkeys(a for s in seeders for a in s.addresses if a not in own))
    infohash = seeders[0].infohash
    torrent = await asyncio.to_thread(artifacts.fetch_metadata, infohash, manifest, peers)
    result = await asyncio.to_thread(
        artifacts.fetch, torrent, manifest, dest, ranges_of(manifest), peers, progress=progress
    )
    logger.info(
        "fetched %d bytes of %s in %.1f s from %d peer(s)",
        result.downloaded_bytes,
        model_id[:16],
        result.elapsed_s,
        len(result.bytes_by_peer),
    )
    return result.path, manifest, Publication(manifest, infohash, artifacts.addresses)


def _part_count(named: dict[str, bytes]) -> int:
    counts = {name.rsplit("of", 1)[-1] for name in named if name.startswith("part") and "of" in name}
    if len(counts) != 1 or not next(iter(counts)).isdigit():
        raise ProtocolError("manifest parts disagree on their count")
    n = int(next(iter(counts)))
    if not 1 <= n <= _MAX_PARTS:
        raise ProtocolError(f"manifest claims {n} parts")
    return n
