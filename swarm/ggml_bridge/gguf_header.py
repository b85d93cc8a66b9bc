"""Fast read-only scan of a GGUF header: scalar metadata and the tensor table.

`gguf.GGUFReader` builds a numpy view of every array element (seconds for a 262k-token vocabulary);
peers and clients only need a few scalars and tensor locations, so this scanner skips arrays
without materialising them. Only the header is read: it works on sparse, partially downloaded files.

This module does not read tensor data and does not validate tensor contents.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from swarm.errors import ModelError

_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_ALIGNMENT_KEY = "general.alignment"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the table.

    Attributes:
        ggml_type: ggml type id (as gguf.GGMLQuantizationType).
        dims: ne[0], ne[1], ... (ne[0] is the row length).
        offset: absolute byte offset of the data in the file.
    """

    ggml_type: int
    dims: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class GGUFHeader:
    """Scalars (ints, floats, bools, strings) by key; arrays are reported by length only."""

    scalars: dict[str, object]
    array_lengths: dict[str, int]
    tensors: dict[str, TensorEntry]


def scan(path: Path) -> GGUFHeader:
    """Read the header of the GGUF at `path`.

    Raises:
        ModelError: unreadable, not GGUF v2/v3, or a truncated/malformed header.
    """
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _parse(m)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read GGUF header of {path}: {e}") from e
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise ModelError(f"malformed GGUF header in {path}: {e}") from e


def _parse(m: mmap.mmap) -> GGUFHeader:
    if m[:4] != b"GGUF":
        raise ValueError("bad magic")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    pos = 24
    scalars: dict[str, object] = {}
    arrays: dict[str, int] = {}
    for _ in range(n_kv):
        key, pos = _string(m, pos)
        (vtype,), pos = struct.unpack_from("<I", m, pos), pos + 4
        if vtype == _ARRAY:
            (sub, length), pos = struct.unpack_from("<IQ", m, pos), pos + 12
            arrays[key] = length
            pos = _skip_array(m, pos, sub, length)
        else:
            scalars[key], pos = _value(m, pos, vtype)
    tensors: dict[str, TensorEntry] = {}
    raw = []
    for _ in range(n_tensors):
        name, pos = _string(m, pos)
        (n_dims,), pos = struct.unpack_from("<I", m, pos), pos + 4
        dims = struct.unpack_from(f"<{n_dims}Q", m, pos)
        pos += 8 * n_dims
        ggml_type, offset = struct.unpack_from("<IQ", m, pos)
        pos += 12
        raw.append((name, ggml_type, dims, offset))
    align = int(scalars.get(_ALIGNMENT_KEY, 32))
    data_start = (pos + align - 1) // align * align
    for name, ggml_type, dims, offset in raw:
        tensors[name] = TensorEntry(ggml_type=ggml_type, dims=tuple(dims), offset=data_start + offset)
    return GGUFHeader(scalars=scalars, array_lengths=arrays, tensors=tensors)


def _string(m: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", m, pos)
    end = pos + 8 + n
    if end > len(m):
        raise IndexError("string runs past the end of the file")
    return m[pos + 8:end].decode("utf-8"), end


def _value(m: mmap.mmap, pos: int, vtype: int) -> tuple[object, int]:
    if vtype == _STRING:
        return _string(m, pos)
    fmt = _SCALAR_FMT.get(vtype)
    if fmt is None:
        raise ValueError(f"unknown GGUF value type {vtype}")
    return struct.unpack_from("<" + fmt, m, pos)[0], pos + struct.calcsize(fmt)


def _skip_array(m: mmap.mmap, pos: int, sub: int, length: int) -> int:
    if sub == _STRING:
        for _ in range(length):
            (n,) = struct.unpack_from("<Q", m, pos)
            pos += 8 + n
        return pos
    fmt = _SCALAR_FMT.get(sub)
    if fmt is None:
        raise ValueError(f"unsupported GGUF array element type {sub}")
    return pos + length * struct.calcsize(fmt)
