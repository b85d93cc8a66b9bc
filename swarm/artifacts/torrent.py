"""Make and parse the torrent of one GGUF file, named by its `model_id`.

The torrent is hybrid (BitTorrent v1 SHA-1 pieces + v2 SHA-256 merkle tree) and holds exactly one
file whose name is the model's `model_id`, so a torrent is content-named: a fetcher checks that
the name and length match the manifest it already verified. Piece size is chosen so that the
overfetch of a span (at most one partial piece at each end of each byte range) stays small.

This module does not seed, fetch or touch the network.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import libtorrent as lt

from swarm.errors import ArtifactError
from swarm.manifest import Manifest

MIN_PIECE_BYTES = 256 << 10
MAX_PIECE_BYTES = 4 << 20
TARGET_PIECES = 4096
"""Piece size grows (by powers of two, from MIN to MAX) until the file has at most this many pieces."""
MAX_TORRENT_BYTES = 4 << 20
"""Bound on torrent bytes received from a peer (a 30 GB file at 4 MiB pieces is ~0.4 MB)."""

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Torrent:
    """A parsed, checked single-file torrent.

    Attributes:
        data: the bencoded torrent file.
        info: libtorrent's parsed `torrent_info`.
        name: the file name inside the torrent (a model_id, 64 hex chars).
        file_size: bytes.
        piece_size: bytes per piece (the last one may be shorter).
        infohash: hex of the v1 info-hash (SHA-1 of the info dict; 40 chars), enough to find the
            torrent's peers and fetch its metadata from them.
    """

    data: bytes
    info: lt.torrent_info
    name: str
    file_size: int
    piece_size: int
    infohash: str


def choose_piece_size(file_size: int) -> int:
    """Smallest power of two in [256 KiB, 4 MiB] giving at most `TARGET_PIECES` pieces.

    Args:
        file_size: bytes, >= 0.
    Returns:
        piece size in bytes.
    """
    size = MIN_PIECE_BYTES
    while size < MAX_PIECE_BYTES and file_size > size * TARGET_PIECES:
        size *= 2
    return size


def make_torrent(path: str | Path, manifest: Manifest, *, piece_size: int | None = None) -> Torrent:
    """Hash a local GGUF into a hybrid v1+v2 torrent whose single file is named `manifest.model_id`.

    Args:
        path: the GGUF the manifest was built from (its size must equal `manifest.file_size`).
        manifest: that file's manifest.
        piece_size: bytes per piece (a power of two >= 16 KiB); default `choose_piece_size`.
    Returns:
        the parsed Torrent.
    Raises:
        ArtifactError: the file is missing or its size differs from the manifest.
    """
    path = Path(path).resolve()
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ArtifactError(f"cannot read {path}: {e}") from e
    if size != manifest.file_size:
        raise ArtifactError(f"{path} has {size} bytes; its manifest says {manifest.file_size}")
    piece_size = piece_size or choose_piece_size(size)
    ct = lt.create_torrent([lt.create_file_entry(manifest.model_id, size)], piece_size)
    ct.set_creator("swarm")
    # libtorrent hashes `<dir>/<name>`: a symlink gives the file its content name without a copy.
    with tempfile.TemporaryDirectory(prefix="swarm-torrent-") as tmp:
        os.symlink(path, os.path.join(tmp, manifest.model_id))
        try:
            lt.set_piece_hashes(ct, tmp)
        except RuntimeError as e:
            raise ArtifactError(f"cannot hash {path} into a torrent: {e}") from e
    return parse_torrent(lt.bencode(ct.generate()), manifest)


def parse_torrent(data: bytes, manifest: Manifest | None = None) -> Torrent:
    """Parse torrent bytes from anywhere and check that they describe one content-named file.

    Args:
        data: bencoded torrent, at most `MAX_TORRENT_BYTES`.
        manifest: when given, the file's name must be `manifest.model_id` and its length
            `manifest.file_size`.
    Returns:
        the parsed Torrent.
    Raises:
        ArtifactError: oversized, not a torrent, not exactly one file, a name that is not a
            model_id, or a mismatch with `manifest`.
    """
    if not isinstance(data, bytes) or not data:
        raise ArtifactError("torrent is empty or not bytes")
    if len(data) > MAX_TORRENT_BYTES:
        raise ArtifactError(f"torrent of {len(data)} bytes exceeds {MAX_TORRENT_BYTES}")
    try:
        info = lt.torrent_info(data)
    except RuntimeError as e:
        raise ArtifactError(f"not a valid torrent: {e}") from e
    files = info.layout()
    if files.num_files() != 1:
        raise ArtifactError(f"torrent holds {files.num_files()} files; expected one GGUF")
    if not info.info_hashes().has_v1():
        raise ArtifactError("torrent has no v1 info-hash (swarm torrents are hybrid v1+v2)")
    name = files.file_path(0)
    if not _HEX64.match(name):
        raise ArtifactError(f"torrent file name {name[:80]!r} is not a model_id")
    if manifest is not None:
        if name != manifest.model_id:
            raise ArtifactError(f"torrent is for model {name[:16]}..., not {manifest.model_id[:16]}...")
        if info.total_size() != manifest.file_size:
            raise ArtifactError(
                f"torrent file has {info.total_size()} bytes; manifest says {manifest.file_size}"
            )
    return Torrent(
        data=data,
        info=info,
        name=name,
        file_size=info.total_size(),
        piece_size=info.piece_length(),
        infohash=str(info.info_hashes().v1),
    )


def torrent_from_info(info_dict: bytes, manifest: Manifest) -> Torrent:
    """Wrap a bencoded info dict (metadata fetched from a peer) as torrent bytes and check it.

    The result lacks the v2 piece layers; libtorrent then verifies pieces with the v1 SHA-1
    hashes in the info dict and asks peers for the v2 hashes it needs.

    Raises:
        ArtifactError: as `parse_torrent`.
    """
    return parse_torrent(b"d4:info" + info_dict + b"e", manifest)
