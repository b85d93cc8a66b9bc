"""Token ids -> rows of `token_embd`, exactly as llama.cpp's CPU `get_rows` computes them.

The client embeds tokens itself so every span (the first one included) takes hidden states alike.
Rows are read from the memory-mapped GGUF and dequantized with ggml's own `to_float` (through
libswarm_span), then scaled as the architecture's graph scales token embeddings (gemma3:
`ggml_scale(x, sqrtf(n_embd))`), so the result is bit-identical to what the whole model feeds
its first block. Where the residual stream is wider than one embedding (deepseek4's
`hyper_connection.count` streams: `ArchRow.boundary_width`), each row is repeated that many times,
as llama.cpp's `ggml_repeat_4d` builds the first block's input.

This module does not tokenize text and does not run any layer.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from swarm.arch import arch_row
from swarm.errors import ExecutorError, ModelError
from swarm.ggml_bridge import _lib
from swarm.ggml_bridge.gguf_header import scan

_EMBD_TENSOR = "token_embd.weight"
_INT32_P = ctypes.POINTER(ctypes.c_int32)
_FLOAT_P = ctypes.POINTER(ctypes.c_float)


class TokenEmbedder:
    """Exact token embeddings of one GGUF model (whole model or a final span file)."""

    def __init__(self, model_path: Path):
        """Memory-map `model_path` and locate its `token_embd.weight`.

        Raises:
            ModelError: not a readable GGUF, no token_embd tensor, or the file is too short.
            UnsupportedArchitecture: the architecture has no row in `swarm.arch`.
            ExecutorError: libswarm_span is not built.
        """
        header = scan(model_path)
        arch = header.scalars.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelError(f"{model_path}: no general.architecture")
        row = arch_row(arch)
        tensor = header.tensors.get(_EMBD_TENSOR)
        if tensor is None or len(tensor.dims) != 2:
            raise ModelError(f"{model_path}: no 2-D {_EMBD_TENSOR}")
        self._so = _lib.lib()
        self._type = tensor.ggml_type
        self._n_embd, self._n_vocab = tensor.dims
        block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.ggml_type)]
        self._row_bytes = self._n_embd // block * type_bytes
        try:
            self._data = np.memmap(model_path, dtype=np.uint8, mode="r", offset=tensor.offset,
                                   shape=(self._n_vocab * self._row_bytes,))
        except (OSError, ValueError) as e:
            raise ModelError(f"{model_path}: cannot map {_EMBD_TENSOR}: {e}") from e
        self._data_ptr = ctypes.c_void_p(self._data.ctypes.data)  # the map lives as long as self
        self._scale = np.float32(np.sqrt(np.float32(self._n_embd))) if row.embedding_scale == "sqrt_hidden" \
            else None
        self._streams = row.boundary_width

    @property
    def n_embd(self) -> int:
        """Width of each returned row: the model's hidden size times its residual streams."""
        return self._n_embd * self._streams

    @property
    def n_vocab(self) -> int:
        """Number of rows; valid ids are 0..n_vocab-1."""
        return self._n_vocab

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """Embedding rows for `ids`.

        Args:
            ids: token ids, each in [0, n_vocab); at least one.
        Returns:
            [len(ids), n_embd] float32 (`n_embd` is this object's: hidden size x residual streams),
            scaled as the architecture's graph scales token inputs.
        Raises:
            ExecutorError: empty ids, an id out of range or not an integer, or an unsupported type.
        """
        arr = np.asarray(ids)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise ExecutorError(f"ids must be a non-empty sequence of ints, "
                                f"got {arr.dtype} shape {arr.shape}")
        lo, hi = (int(arr[0]), int(arr[0])) if arr.size == 1 else (int(arr.min()), int(arr.max()))
        if lo < 0 or hi >= self._n_vocab:  # a decode step's one id costs no array pass (per token)
            bad = arr[(arr < 0) | (arr >= self._n_vocab)]
            raise ExecutorError(f"token id {int(bad[0])} is outside the vocabulary [0, {self._n_vocab})")
        ids32 = np.ascontiguousarray(arr, dtype=np.int32)
        out = np.empty((ids32.size, self._n_embd), dtype=np.float32)
        rc = self._so.swarm_dequantize_rows(
            self._type, self._data_ptr, self._row_bytes, self._n_vocab, self._n_embd,
            ids32.ctypes.data_as(_INT32_P), ids32.size, out.ctypes.data_as(_FLOAT_P),
        )
        if rc != _lib.SWARM_OK:
            raise ExecutorError(f"cannot dequantize token_embd: {self._so.swarm_status_str(rc).decode()}")
        if self._scale is not None:
            out *= self._scale
        return np.tile(out, (1, self._streams)) if self._streams > 1 else out
