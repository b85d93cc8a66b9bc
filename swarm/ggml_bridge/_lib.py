"""ctypes declarations for csrc/swarm_span.h (libswarm_span.so). Declarations only: no policy.

The library is built by `scripts/build_csrc.sh` into this package's directory. ctypes releases the
GIL for the duration of each call.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_float, c_int32, c_int64, c_size_t, c_uint8, c_uint32, c_void_p
from pathlib import Path

from swarm.errors import ExecutorError

LIB_PATH = Path(__file__).with_name("libswarm_span.so")

SWARM_OK = 0
SWARM_ERR_ARG = -1
SWARM_ERR_LOAD = -2
SWARM_ERR_CONTEXT = -3
SWARM_ERR_SEQ = -4
SWARM_ERR_POS = -5
SWARM_ERR_KV_FULL = -6
SWARM_ERR_DECODE = -7
SWARM_ERR_CAPTURE = -8
SWARM_ERR_BUF = -9
SWARM_ERR_STATE = -10
SWARM_ERR_TYPE = -11
SWARM_ERR_NOT_EMPTY = -12
SWARM_ERR_INTERRUPTED = -13


class SpanParams(ctypes.Structure):
    """`struct swarm_span_params`."""

    _fields_ = [
        ("model_path", c_char_p),
        ("n_ctx", c_uint32),
        ("n_seq_max", c_uint32),
        ("n_threads", c_int32),
        ("n_batch", c_uint32),
        ("n_ubatch", c_uint32),
        ("flash_attn", c_int32),
        ("capture_name", c_char_p),
        ("capture_layer", c_int32),
        ("is_last", c_int32),
        ("require_token_ids", c_int32),
        ("mtp", c_int32),
        ("mtp_truncate", c_int32),
    ]


class SpanStep(ctypes.Structure):
    """`struct swarm_span_step`."""

    _fields_ = [
        ("seq_id", c_int32),
        ("pos0", c_int32),
        ("n_tokens", c_int32),
        ("embd", POINTER(c_float)),
        ("out", POINTER(c_float)),
        ("out_cap", c_size_t),
        ("all_logits", c_int32),
        ("token_ids", POINTER(c_int32)),
    ]


SpanHandle = c_void_p

_lib: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    """The loaded library with argtypes/restype declared.

    Raises:
        ExecutorError: the library is missing (run scripts/build_csrc.sh) or fails to load.
    """
    global _lib
    if _lib is not None:
        return _lib
    if not LIB_PATH.exists():
        raise ExecutorError(f"{LIB_PATH} is missing: build it with scripts/build_csrc.sh")
    import llama_cpp  # noqa: F401  (load llama.cpp first, so both share one copy of ggml)

    try:
        so = ctypes.CDLL(str(LIB_PATH))
    except OSError as e:
        raise ExecutorError(f"cannot load {LIB_PATH}: {e}") from e
    _declare(so)
    _lib = so
    return so


def _declare(so: ctypes.CDLL) -> None:
    h = SpanHandle
    sigs = {
        "swarm_span_open": (c_int32, [POINTER(SpanParams), POINTER(c_void_p)]),
        "swarm_span_close": (None, [h]),
        "swarm_span_n_embd": (c_int32, [h]),
        "swarm_span_n_vocab": (c_int32, [h]),
        "swarm_span_n_ctx": (c_int32, [h]),
        "swarm_span_n_ctx_seq": (c_int32, [h]),
        "swarm_span_execute": (c_int32, [h, POINTER(SpanStep)]),
        "swarm_span_interrupt": (None, [h, c_int32]),
        "swarm_span_execute_batch": (c_int32, [h, POINTER(SpanStep), c_int32]),
        "swarm_span_mtp_draft_at": (c_int32, [h, c_int32, c_int32, c_int32, c_int32, POINTER(c_float),
                                              c_size_t, POINTER(c_int32)]),
        "swarm_span_truncate": (c_int32, [h, c_int32, c_int32]),
        "swarm_span_clear": (c_int32, [h, c_int32]),
        "swarm_span_seq_pos_max": (c_int32, [h, c_int32]),
        "swarm_span_state_size": (c_size_t, [h, c_int32]),
        "swarm_span_state_get": (c_int32, [h, c_int32, POINTER(c_uint8), c_size_t, POINTER(c_size_t)]),
        "swarm_span_state_set": (c_int32, [h, c_int32, POINTER(c_uint8), c_size_t]),
        "swarm_dequantize_rows": (
            c_int32,
            [c_int32, c_void_p, c_size_t, c_int64, c_int64, POINTER(c_int32), c_int32, POINTER(c_float)],
        ),
        "swarm_status_str": (c_char_p, [c_int32]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(so, name)
        fn.restype = restype
        fn.argtypes = argtypes
