"""Fast read-only scan of a GGUF header: scalar metadata and the tensor table.

`gguf.GGUFReader` builds a numpy view of every array element (seconds for a 262k-token vocabulary);
peers and clients only need a few scalars and tensor locations, so this scanner skips arrays
without materialising them. Only the header is read: it works on sparse, partially downloaded files.

Bounds (a malformed or hostile file is refused, never followed): at most MAX_GGUF_KV keys,
MAX_GGUF_TENSORS tensors of at most MAX_GGUF_TENSOR_DIMS dims, MAX_GGUF_ARRAY_LEN elements per
array (swarm.limits); every length is checked against the file's end before it is used; the
alignment is a power of two. Memory is linear in the number of keys and tensors; time is linear in
the header's size.

This module does not read tensor data and does not validate tensor contents.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from swarm.errors import ModelError
from swarm.limits import MAX_GGUF_ARRAY_LEN, MAX_GGUF_KV, MAX_GGUF_TENSOR_DIMS, MAX_GGUF_TENSORS

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


SMALL_ARRAY_LEN = 4096
"""Numeric arrays up to this many elements are read (per-layer hparams); longer ones (tokenizer
scores and types) are only measured."""


@dataclass(frozen=True)
class GGUFHeader:
    """Scalars (ints, floats, bools, strings) by key; every array's length, and the values of the
    numeric ones of at most SMALL_ARRAY_LEN elements (`small_arrays`, as lists); `array_spans`: the
    file's bytes [start, end) of every array's value (element type, length and elements: two arrays
    are equal exactly when these bytes are); `value_types`: every key's GGUF value type (a
    gguf.GGUFValueType number), in the file's order, and `array_types` every array's element type."""

    scalars: dict[str, object]
    array_lengths: dict[str, int]
    tensors: dict[str, TensorEntry]
    small_arrays: dict[str, list] = field(default_factory=dict)
    array_spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    value_types: dict[str, int] = field(default_factory=dict)
    array_types: dict[str, int] = field(default_factory=dict)


def scan(path: Path) -> GGUFHeader:
    """Read the header of the GGUF at `path`.

    Raises:
        ModelError: unreadable or empty, not GGUF v2/v3, a truncated header, text that is not
            UTF-8, an unknown value type, or a count, length or alignment out of bounds. Nothing
            else escapes.
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ModelError(f"cannot read GGUF header of {path}: {e}") from e
    try:
        with f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _parse(m)
    except OSError as e:
        raise ModelError(f"cannot read GGUF header of {path}: {e}") from e
    except (struct.error, ValueError, IndexError, OverflowError) as e:  # UnicodeDecodeError is a ValueError
        raise ModelError(f"malformed GGUF header in {path}: {str(e)[:200]}") from e


def _parse(m: mmap.mmap) -> GGUFHeader:
    if m[:4] != b"GGUF":
        raise ValueError("bad magic")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    if n_kv > MAX_GGUF_KV or n_tensors > MAX_GGUF_TENSORS:
        raise ValueError(f"{n_kv} keys / {n_tensors} tensors: over {MAX_GGUF_KV} / {MAX_GGUF_TENSORS}")
    pos = 24
    scalars: dict[str, object] = {}
    arrays: dict[str, int] = {}
    small: dict[str, list] = {}
    spans: dict[str, tuple[int, int]] = {}
    vtypes: dict[str, int] = {}
    subtypes: dict[str, int] = {}
    for _ in range(n_kv):
        key, pos = _string(m, pos)
        (vtype,), pos = struct.unpack_from("<I", m, pos), pos + 4
        vtypes.pop(key, None)  # a duplicate key: the last value counts, at its own place
        vtypes[key] = vtype
        if vtype == _ARRAY:
            start = pos
            (sub, length), pos = struct.unpack_from("<IQ", m, pos), pos + 12
            subtypes[key] = sub
            if length > MAX_GGUF_ARRAY_LEN:
                raise ValueError(f"array {key[:64]!r} of {length} elements: over {MAX_GGUF_ARRAY_LEN}")
            arrays[key] = length
            if sub in _SCALAR_FMT and length <= SMALL_ARRAY_LEN:
                fmt = f"<{length}{_SCALAR_FMT[sub]}"
                small[key] = list(struct.unpack_from(fmt, m, pos))
            pos = _skip_array(m, pos, sub, length)
            spans[key] = (start, pos)
        else:
            scalars[key], pos = _value(m, pos, vtype)
    tensors: dict[str, TensorEntry] = {}
    raw = []
    for _ in range(n_tensors):
        name, pos = _string(m, pos)
        (n_dims,), pos = struct.unpack_from("<I", m, pos), pos + 4
        if n_dims > MAX_GGUF_TENSOR_DIMS:
            raise ValueError(f"tensor {name[:64]!r} has {n_dims} dims: over {MAX_GGUF_TENSOR_DIMS}")
        dims = struct.unpack_from(f"<{n_dims}Q", m, pos)
        pos += 8 * n_dims
        ggml_type, offset = struct.unpack_from("<IQ", m, pos)
        pos += 12
        raw.append((name, ggml_type, dims, offset))
    align = scalars.get(_ALIGNMENT_KEY, 32)
    if not isinstance(align, int) or isinstance(align, bool) or align < 1 or align & (align - 1):
        raise ValueError(f"{_ALIGNMENT_KEY} must be a power of two, got {align!r:.40}")
    data_start = (pos + align - 1) // align * align
    for name, ggml_type, dims, offset in raw:
        tensors[name] = TensorEntry(ggml_type=ggml_type, dims=tuple(dims), offset=data_start + offset)
    return GGUFHeader(scalars=scalars, array_lengths=arrays, tensors=tensors, small_arrays=small,
                      array_spans=spans, value_types=vtypes, array_types=subtypes)


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
            (n,) = struct.unpack_from("<Q", m, pos)  # struct.error once pos is past the end
            pos += 8 + n
        return _within(m, pos)
    fmt = _SCALAR_FMT.get(sub)
    if fmt is None:
        raise ValueError(f"unsupported GGUF array element type {sub}")
    return _within(m, pos + length * struct.calcsize(fmt))


def _within(m: mmap.mmap, pos: int) -> int:
    if pos > len(m):
        raise IndexError("array runs past the end of the file")
    return pos
