"""Copy a GGUF's metadata arrays and tensors as raw bytes into a `gguf.GGUFWriter`.

`gguf.GGUFReader` materialises a numpy view per array element before anything can be copied:
13-25 s for the 151k-token vocabulary of Qwen2.5 or the 262k of Gemma-3 on this machine kind,
paid by every peer for every new span. With the bounded header scan of `gguf_header` the same copy
reads each array's bytes once (`RawArray`) and maps each tensor's bytes (`tensor_bytes`).

`RawArrayWriter` is a `GGUFWriter` that writes a `RawArray` as the bytes it was read from. It does so
by overriding the writer's value packer; `RawArray` is also an ordinary sequence of its elements, so
should a later `gguf` release rename that packer, the writer packs the elements one by one: slower,
the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.quants import quant_shape_to_byte_shape

from swarm.errors import ModelError
from swarm.ggml_bridge.gguf_header import GGUFHeader, TensorEntry

_ELEMENT_FMT = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}


class RawArray(Sequence):
    """A GGUF array value as stored: element type (uint32), length (uint64), elements.

    Args:
        raw: those bytes, as `GGUFHeader.array_spans` delimits them in the source file.
    Raises:
        ValueError: fewer than 12 bytes.
    """

    def __init__(self, raw: bytes):
        if len(raw) < 12:
            raise ValueError(f"a GGUF array value has at least 12 bytes, got {len(raw)}")
        self.raw = raw
        self.sub_type, self.length = struct.unpack_from("<IQ", raw, 0)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        return self._elements[i]

    @cached_property
    def _elements(self) -> list:
        """The elements decoded (strings as UTF-8 bytes, which GGUFWriter packs unchanged); only the
        fallback path and slicing of per-layer arrays read them."""
        if self.sub_type == GGUFValueType.STRING:
            out, pos = [], 12
            for _ in range(self.length):
                (n,) = struct.unpack_from("<Q", self.raw, pos)
                out.append(self.raw[pos + 8:pos + 8 + n])
                pos += 8 + n
            return out
        return list(struct.unpack_from(f"<{self.length}{_ELEMENT_FMT[self.sub_type]}", self.raw, 12))


def read_array(path: Path, header: GGUFHeader, key: str) -> RawArray:
    """The array value of `key` in the GGUF at `path`, as its raw bytes.

    Raises:
        KeyError: `key` is not an array of `header`.
        ModelError: the file cannot be read or is shorter than `header` says.
    """
    start, end = header.array_spans[key]
    try:
        with open(path, "rb") as f:
            f.seek(start)
            raw = f.read(end - start)
    except OSError as e:
        raise ModelError(f"cannot read {key} from {path}: {e}") from e
    if len(raw) != end - start:
        raise ModelError(f"{path} ends inside the value of {key}")
    return RawArray(raw)


def tensor_nbytes(entry: TensorEntry) -> int:
    """Bytes of a tensor's data: elements / block size * block bytes (gguf.GGML_QUANT_SIZES).

    Raises:
        ModelError: an unknown ggml type, or a row length that is not a whole number of blocks.
    """
    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(entry.ggml_type)]
    except (ValueError, KeyError) as e:
        raise ModelError(f"unknown ggml type {entry.ggml_type}") from e
    if not entry.dims or entry.dims[0] % block:
        raise ModelError(f"tensor of shape {entry.dims} is not made of {block}-element blocks")
    return int(np.prod(entry.dims, dtype=np.int64)) // block * block_bytes


def tensor_bytes(data: np.memmap, entry: TensorEntry) -> np.ndarray:
    """A tensor's bytes in `data` (the whole file mapped as uint8), shaped as
    `GGUFWriter.add_tensor(..., raw_dtype=type)` takes them: [ne[n-1], ..., ne[1], row bytes].

    Raises:
        ModelError: as `tensor_nbytes`, or data past the end of the file.
    """
    n = tensor_nbytes(entry)
    if entry.offset + n > data.shape[0]:
        raise ModelError(f"tensor data [{entry.offset}, {entry.offset + n}) runs past the file's "
                         f"{data.shape[0]} bytes")
    shape = quant_shape_to_byte_shape(tuple(reversed(entry.dims)), GGMLQuantizationType(entry.ggml_type))
    return data[entry.offset:entry.offset + n].reshape(shape)


def add_raw_tensor(writer: GGUFWriter, name: str, data: np.memmap, entry: TensorEntry) -> None:
    """Add a tensor to `writer` as its unchanged bytes (read from the map only when written)."""
    writer.add_tensor(name, tensor_bytes(data, entry), raw_dtype=GGMLQuantizationType(entry.ggml_type))


class RawArrayWriter(GGUFWriter):
    """A `gguf.GGUFWriter` that writes `RawArray` values as their bytes (see the module's note)."""

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool,
                  sub_type: GGUFValueType | None = None) -> bytes:
        if isinstance(val, RawArray) and vtype == GGUFValueType.ARRAY:
            return (struct.pack("<I", vtype) if add_vtype else b"") + val.raw
        return super()._pack_val(val, vtype, add_vtype, sub_type)
