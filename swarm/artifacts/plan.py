"""Pure byte arithmetic for fetching a layer span of a GGUF over BitTorrent.

Maps a span [start, end) of a manifest to the byte ranges a peer needs (header + tensors), those
ranges to torrent piece indices, and pieces back to the tensors they cover (for verification and
for naming the tensors behind a piece that failed its hash). Ranges are `(offset, length)` in
bytes, absolute in the GGUF file.

This module does no I/O and does not import libtorrent.
"""

from __future__ import annotations

from collections.abc import Iterable

from swarm.errors import ArtifactError
from swarm.manifest import Manifest, TensorInfo

TOKEN_EMBD = "token_embd.weight"
OUTPUT_NORM = "output_norm.weight"
OUTPUT = "output.weight"
OUTPUT_BIAS = "output.bias"
_NOT_GLOBAL = frozenset({TOKEN_EMBD, OUTPUT, OUTPUT_BIAS})

ByteRange = tuple[int, int]
"""(offset, length) in bytes, absolute in the file; length > 0."""


def span_tensors(
    manifest: Manifest, start: int, end: int, *, need_embd: bool, need_head: bool, need_mtp: bool = False
) -> tuple[TensorInfo, ...]:
    """Tensors a peer serving blocks [start, end) needs, in file order.

    Every span file carries the model's global tensors (those of no block, such as `output_norm`
    and `rope_freqs`, wherever they lie in the file) besides its blocks, so they are always
    fetched and verified: the span builder copies every one of them.

    Args:
        manifest: the model's manifest.
        start, end: global layer indices, half-open; 0 <= start < end <= n_layers.
        need_embd: include `token_embd` (the span embeds token ids itself).
        need_head: include `output_norm` and `output` (and `output.bias` if any), or `token_embd` for
            a tied head.
        need_mtp: include `Manifest.mtp_head_tensors` (the final span of a model whose MTP head is
            served).
    Returns:
        the tensors, deduplicated, sorted by offset.
    Raises:
        ArtifactError: bad span, or a needed tensor the manifest does not list.
    """
    if not 0 <= start < end <= manifest.n_layers:
        raise ArtifactError(f"span [{start}, {end}) is not inside the model's {manifest.n_layers} layers")
    names = set()
    if need_embd:
        names.add(TOKEN_EMBD)
    if need_head:
        names.add(OUTPUT_NORM)
        names.add(OUTPUT if manifest.has_tensor(OUTPUT) else TOKEN_EMBD)
        if manifest.has_tensor(OUTPUT_BIAS):
            names.add(OUTPUT_BIAS)
    names.update(t.name for t in manifest.tensors if t.layer is None and t.name not in _NOT_GLOBAL)
    missing = sorted(n for n in names if not manifest.has_tensor(n))
    if missing:
        raise ArtifactError(f"model {manifest.model_id[:16]}... has no tensor(s) {', '.join(missing)}")
    chosen = {t.name: t for t in manifest.layer_tensors(start, end)}
    chosen.update({n: manifest.tensor(n) for n in names})
    if need_mtp:
        chosen.update({t.name: t for t in manifest.mtp_head_tensors()})
    if not any(t.layer is not None for t in chosen.values()):
        raise ArtifactError(f"model {manifest.model_id[:16]}... lists no tensors for layers [{start}, {end})")
    return tuple(sorted(chosen.values(), key=lambda t: t.offset))


def span_byte_ranges(
    manifest: Manifest, start: int, end: int, *, need_embd: bool, need_head: bool, need_mtp: bool = False
) -> list[ByteRange]:
    """Byte ranges of the header [0, data_offset) plus the span's tensors, merged where adjacent.

    Args/Raises: as `span_tensors`.
    Returns:
        sorted, non-overlapping (offset, length) ranges.
    """
    tensors = span_tensors(manifest, start, end, need_embd=need_embd, need_head=need_head, need_mtp=need_mtp)
    ranges = [(0, manifest.data_offset)] + [(t.offset, t.nbytes) for t in tensors if t.nbytes > 0]
    return merge_ranges(ranges)


def merge_ranges(ranges: Iterable[ByteRange]) -> list[ByteRange]:
    """Sort ranges and merge the ones that overlap or touch; zero-length ranges are dropped.

    Raises:
        ArtifactError: a negative offset or length.
    """
    merged: list[list[int]] = []
    for off, length in sorted(ranges):
        if off < 0 or length < 0:
            raise ArtifactError(f"bad byte range ({off}, {length})")
        if length == 0:
            continue
        if merged and off <= merged[-1][0] + merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], off + length - merged[-1][0])
        else:
            merged.append([off, length])
    return [(o, n) for o, n in merged]


def pieces_for_ranges(ranges: Iterable[ByteRange], piece_size: int, file_size: int) -> list[int]:
    """Indices of the pieces that hold any byte of `ranges`.

    Args:
        ranges: (offset, length) byte ranges.
        piece_size: torrent piece length in bytes (> 0).
        file_size: file length in bytes; the last piece may be shorter.
    Returns:
        sorted unique piece indices.
    Raises:
        ArtifactError: a range reaching past `file_size`, or a non-positive piece size.
    """
    if piece_size <= 0:
        raise ArtifactError(f"bad piece size {piece_size}")
    pieces: set[int] = set()
    for off, length in merge_ranges(ranges):
        if off + length > file_size:
            raise ArtifactError(f"byte range ({off}, {length}) reaches past the file's {file_size} bytes")
        pieces.update(range(off // piece_size, (off + length - 1) // piece_size + 1))
    return sorted(pieces)


def pieces_bytes(pieces: Iterable[int], piece_size: int, file_size: int) -> int:
    """Total bytes of the given pieces (the last piece of the file may be shorter)."""
    return sum(min(piece_size, file_size - p * piece_size) for p in set(pieces))


def tensors_in_pieces(manifest: Manifest, pieces: Iterable[int], piece_size: int) -> list[TensorInfo]:
    """Tensors whose every byte lies in the given pieces (complete once those pieces are).

    Returns:
        tensors in file order; zero-length tensors count as complete.
    """
    have = set(pieces)
    return [
        t
        for t in manifest.tensors
        if all(p in have for p in pieces_for_ranges([(t.offset, t.nbytes)], piece_size, manifest.file_size))
    ]


def tensors_touching_piece(manifest: Manifest, piece: int, piece_size: int) -> list[str]:
    """Names of the tensors with at least one byte in `piece`; `<header>` for header bytes.

    Used to name what a piece that failed its hash check would have corrupted.
    """
    lo, hi = piece * piece_size, (piece + 1) * piece_size
    names = ["<header>"] if lo < manifest.data_offset else []
    names += [t.name for t in manifest.tensors if t.offset < hi and t.offset + t.nbytes > lo]
    return names
