"""Check a local (possibly sparse) GGUF against its manifest: header and tensors, by sha256.

Piece hashes bind bytes to the torrent; these checks bind them to the manifest (whose hash is the
model_id), tensor by tensor, since a piece can span several tensors. Reads local files only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO

from swarm.artifacts.plan import ByteRange
from swarm.errors import ArtifactError
from swarm.manifest import Manifest

_HASH_CHUNK = 1 << 20


def verify_file(path: Path, manifest: Manifest, ranges: list[ByteRange]) -> None:
    """Hash the header and every tensor lying inside `ranges`; compare with the manifest.

    Args:
        path: the local GGUF (may be sparse outside `ranges`).
        manifest: its manifest, already verified against the model_id.
        ranges: merged (offset, length) byte ranges that were fetched; a tensor (or the header
            [0, data_offset)) is checked when it lies wholly inside one of them.
    Raises:
        ArtifactError: the file cannot be read, or a mismatch, naming the header or tensor.
    """

    def inside(off: int, n: int) -> bool:
        return any(o <= off and off + n <= o + length for o, length in ranges)

    try:
        f = open(path, "rb")
    except OSError as e:
        raise ArtifactError(f"cannot read {path} to verify it: {e}") from e
    with f:
        if inside(0, manifest.data_offset) and _sha256(f, 0, manifest.data_offset) != manifest.header_sha256:
            raise ArtifactError(f"{path}: GGUF header does not match the manifest")
        for t in manifest.tensors:
            if t.nbytes and inside(t.offset, t.nbytes) and _sha256(f, t.offset, t.nbytes) != t.sha256:
                raise ArtifactError(f"{path}: tensor {t.name} does not match the manifest's sha256")


def _sha256(f: BinaryIO, offset: int, length: int) -> str:
    h = hashlib.sha256()
    f.seek(offset)
    while length > 0:
        chunk = f.read(min(_HASH_CHUNK, length))
        if not chunk:
            break
        h.update(chunk)
        length -= len(chunk)
    return h.hexdigest()
