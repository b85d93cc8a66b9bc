"""Every frame of the peer stream protocol: encode to bytes, decode with full validation.

A frame body (the transport adds its own length framing around it) is:

    [generation: u8][header_len: u16 big-endian][msgpack header: map][tensor bytes]

The generation byte comes first and is checked before anything else, so a peer of another
protocol generation is refused with a clear `ProtocolError` whatever its header looks like (fail
closed). The header is a msgpack map with `"k"` (the frame kind) and the kind's fields, no more and
no fewer (any change to a frame bumps `PROTOCOL_GENERATION`). Frames that carry a tensor give its
`"dtype"` ("f32" or "f16", little-endian) and `"shape"` [rows, cols] in the header; the bytes
after the header are exactly rows * cols * itemsize of row-major data.

Size line: a decode step moves one `Forward` (client → peer) or `Hidden` (peer → client) frame of
4·n_embd tensor bytes + about 70-100 B of prefix and header (measured: Forward 110-118 B, Hidden 68 B):
for SmolLM2 (n_embd 576) 2304 B + ~95 B; for Qwen2.5 0.5B (n_embd 896) 3584 B + ~95 B; at
n_embd 2048, 8 KiB + ~95 B per token per hop. The last span answers with a `Token` frame of
about 85 B + 15 B per top log-prob. Encode + decode of a [1, 896] f32 Forward: ~8.5 µs.

Decoding never raises anything but `swarm.errors.ProtocolError`: garbage, truncated or oversized
bytes, unknown kinds, missing, extra or mistyped fields, out-of-range values and tensor sizes that
do not match their shape are all refused. Decoded tensors are read-only `np.frombuffer` views of
the input bytes (no copy).

This module does not: frame messages on a socket, do I/O, or define DHT records (see swarm/dht/).
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Union

import msgpack
import numpy as np

from swarm.errors import ProtocolError, RequestError
from swarm.limits import (
    MAX_ADDR_CHARS,
    MAX_CONTEXT_TOKENS,
    MAX_FRAME_BYTES,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_PREFIX_OFFERS,
    MAX_VOCAB,
    PREFIX_HASH_BYTES,
)
from swarm.sampling import MAX_TOP_LOGPROBS, SamplingParams

PROTOCOL_GENERATION = 4
"""Version of every frame below; a peer refuses frames of any other generation.

2: prefix KV snapshots (`Open.prefixes`, `OpenOk.restorable` / `fetched_from`, `Forward.restore`).
3: server push (`Chain`, `Attach`, `Forward.push` / `rewind`, `Hidden.pushed`); `Token.logprob` only
   when asked (`SamplingParams.logprobs`).
4: `Forward.steps`: one frame replays many recorded steps, each computed as it was first sent."""

MAX_HEADER_BYTES = 4096
"""Largest msgpack header accepted."""

MAX_ID_CHARS = 128
"""Longest peer id / model id string."""

MAX_MESSAGE_CHARS = 1000
"""Error messages are cut to this many characters."""

SESSION_ID_BYTES = 16

MAX_FORWARD_STEPS = 1024
"""Most steps one `Forward` may carry (`Forward.steps`); keeps the header under MAX_HEADER_BYTES."""

MAX_CHAIN_ADDRS = 16
"""Most multiaddrs of each kind a `Chain` frame may name for the next hop."""

_PREFIX = struct.Struct(">BH")
_DTYPES = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2")}
_DTYPE_NAMES = {np.dtype("float32"): "f32", np.dtype("float16"): "f16"}
_U64 = 2**64 - 1
_I32 = 2**31 - 1


class ErrorCode(str, enum.Enum):
    """Why a peer refused a request; sent in an `Error` frame."""

    BUSY = "busy"
    BAD_REQUEST = "bad_request"
    NOT_FOUND = "not_found"
    FORBIDDEN = "forbidden"
    INTERNAL = "internal"
    SHUTTING_DOWN = "shutting_down"
    PROTOCOL = "protocol"


# ---- field checks: each raises ProtocolError naming the field ------------------------------------


def _int(name: str, v: Any, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ProtocolError(f"field {name!r} must be an integer in [{lo}, {hi}], got {v!r:.80}")
    return v


def _float(name: str, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or not lo <= v <= hi:
        raise ProtocolError(f"field {name!r} must be a number in [{lo}, {hi}], got {v!r:.80}")
    return float(v)


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ProtocolError(f"field {name!r} must be a boolean, got {v!r:.80}")
    return v


def _str(name: str, v: Any, max_chars: int) -> str:
    if not isinstance(v, str) or len(v) > max_chars:
        raise ProtocolError(f"field {name!r} must be a string of at most {max_chars} chars")
    return v


def _tensor(name: str, v: Any, max_cols: int) -> np.ndarray:
    """Check a `[rows, cols]` f32/f16 array; rows >= 1, 1 <= cols <= max_cols."""
    if not isinstance(v, np.ndarray) or v.ndim != 2 or v.dtype not in _DTYPE_NAMES:
        raise ProtocolError(f"field {name!r} must be a 2-D float32 or float16 array")
    if v.shape[0] < 1 or not 1 <= v.shape[1] <= max_cols:
        raise ProtocolError(f"field {name!r} has bad shape {v.shape} (rows >= 1, 1 <= cols <= {max_cols})")
    return v


# ---- frames ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Open:
    """Client → peer, first frame of a stream: open a session on the peer's span.

    Attributes:
        session_id: 16 random bytes chosen by the client.
        client_id: the client's peer id (owner of the session).
        model_id: hex digest naming the model (see swarm/manifest.py).
        start, end: global layer span the client expects this peer to run, half-open.
        max_tokens: session length (prompt + generated) to reserve, 1..MAX_CONTEXT_TOKENS.
        sampling: sampling parameters, used only by the last span.
        prefixes: up to MAX_PREFIX_OFFERS (n_tokens, sha256 chain hash) pairs naming prefixes of
            the prompt, n_tokens strictly ascending; the last is the whole prompt (swarm/kv/prefix.py).
    """

    session_id: bytes
    client_id: str
    model_id: str
    start: int
    end: int
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prefixes: tuple[tuple[int, bytes], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, bytes) or len(self.session_id) != SESSION_ID_BYTES:
            raise ProtocolError(f"field 'session_id' must be {SESSION_ID_BYTES} bytes")
        _str("client_id", self.client_id, MAX_ID_CHARS)
        _str("model_id", self.model_id, MAX_ID_CHARS)
        if not self.model_id or any(c not in "0123456789abcdef" for c in self.model_id):
            raise ProtocolError("field 'model_id' must be a non-empty lowercase hex string")
        _int("start", self.start, 0, MAX_LAYERS - 1)
        _int("end", self.end, self.start + 1, MAX_LAYERS)
        _int("max_tokens", self.max_tokens, 1, MAX_CONTEXT_TOKENS)
        if not isinstance(self.sampling, SamplingParams):
            raise ProtocolError("field 'sampling' must be SamplingParams")
        if not isinstance(self.prefixes, tuple) or len(self.prefixes) > MAX_PREFIX_OFFERS:
            raise ProtocolError(f"field 'prefixes' must be a tuple of at most {MAX_PREFIX_OFFERS} pairs")
        last = 0
        for pair in self.prefixes:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ProtocolError("field 'prefixes' must hold (n_tokens, hash) pairs")
            last = _int("prefixes.n_tokens", pair[0], last + 1, MAX_CONTEXT_TOKENS)
            if not isinstance(pair[1], bytes) or len(pair[1]) != PREFIX_HASH_BYTES:
                raise ProtocolError(f"field 'prefixes.hash' must be {PREFIX_HASH_BYTES} bytes")


@dataclass(frozen=True)
class OpenOk:
    """Peer → client: the session is open with `reserved_tokens` of KV cache.

    Attributes:
        reserved_tokens: KV tokens reserved.
        restorable: offered prefix lengths this peer can restore (held, or fetched from another
            peer during Open), ascending, at most MAX_PREFIX_OFFERS.
        fetched_from: peer id of the holder the peer fetched a snapshot from for this Open ("": none).
    """

    reserved_tokens: int
    restorable: tuple[int, ...] = ()
    fetched_from: str = ""

    def __post_init__(self) -> None:
        _int("reserved_tokens", self.reserved_tokens, 1, MAX_CONTEXT_TOKENS)
        if not isinstance(self.restorable, tuple) or len(self.restorable) > MAX_PREFIX_OFFERS:
            raise ProtocolError(f"field 'restorable' must be a tuple of at most {MAX_PREFIX_OFFERS} lengths")
        last = 0
        for n in self.restorable:
            last = _int("restorable[]", n, last + 1, MAX_CONTEXT_TOKENS)
        _str("fetched_from", self.fetched_from, MAX_ID_CHARS)


@dataclass(frozen=True)
class Error:
    """Peer → client: the request failed; `message` is cut to MAX_MESSAGE_CHARS on construction."""

    code: ErrorCode
    message: str

    def __post_init__(self) -> None:
        if not isinstance(self.code, ErrorCode):
            raise ProtocolError(f"field 'code' must be an ErrorCode, got {self.code!r:.80}")
        if not isinstance(self.message, str):
            raise ProtocolError("field 'message' must be a string")
        object.__setattr__(self, "message", self.message[:MAX_MESSAGE_CHARS])


@dataclass(frozen=True)
class Forward:
    """Client → peer: run the span on hidden states for positions [pos0, pos0 + n_tokens).

    Attributes:
        step: client step counter (echoed in the reply), 0..2**64-1.
        pos0: position of the first row in the session.
        hidden: `[n_tokens, n_embd]` float32 or float16 hidden states (residual stream).
        sample: last span only: sample the last row's logits and reply with `Token`.
        want_logits: last span only: also return the last row's logits in `Token.logits`.
        all_logits: with want_logits, return the logits of every row instead of only the last.
        restore: 0, or (only on a session's first Forward, with pos0 == restore) a prefix length the
            peer said in `OpenOk.restorable` it can restore: it loads that prefix's KV first.
        push: also send the output, as a Forward with the same step, to the hop this session is
            chained to (`Chain`), and answer the client with a copy (`Hidden.pushed`).
        rewind: pos0 may lie before the session's position: roll the session back to pos0 first (a
            client finishing a step by relay after a failure, when the hop may already hold it).
        steps: () for one step, or the row counts of the steps the rows are made of, in order
            (summing to n_tokens): the peer computes each as its own step, exactly as if each had
            come in a frame of its own. A client replaying a failed hop's recorded steps sends them
            so: llama.cpp rounds a matmul over many rows differently from one over a few (ggml-cpu
            picks its kernel by row count), so regrouped rows would give other KV and outputs.
    """

    step: int
    pos0: int
    hidden: np.ndarray
    sample: bool = False
    want_logits: bool = False
    all_logits: bool = False
    restore: int = 0
    push: bool = False
    rewind: bool = False
    steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _int("step", self.step, 0, _U64)
        _tensor("hidden", self.hidden, MAX_HIDDEN)
        if not isinstance(self.steps, tuple) or len(self.steps) > MAX_FORWARD_STEPS:
            raise ProtocolError(f"field 'steps' must be a tuple of at most {MAX_FORWARD_STEPS} row counts")
        for n in self.steps:
            _int("steps[]", n, 1, self.hidden.shape[0])
        if self.steps and sum(self.steps) != self.hidden.shape[0]:
            raise ProtocolError(f"field 'steps' sums to {sum(self.steps)} rows, the frame has "
                                f"{self.hidden.shape[0]}")
        _int("pos0", self.pos0, 0, MAX_CONTEXT_TOKENS - self.hidden.shape[0])
        _bool("sample", self.sample)
        _bool("want_logits", self.want_logits)
        if _bool("all_logits", self.all_logits) and not self.want_logits:
            raise ProtocolError("field 'all_logits' needs 'want_logits'")
        if _int("restore", self.restore, 0, MAX_CONTEXT_TOKENS) and self.restore != self.pos0:
            raise ProtocolError("field 'restore' must equal 'pos0' when set")
        _bool("push", self.push)
        if _bool("rewind", self.rewind) and self.restore:
            raise ProtocolError("fields 'rewind' and 'restore' exclude each other")

    @property
    def n_tokens(self) -> int:
        """Number of rows (tokens) in `hidden`."""
        return int(self.hidden.shape[0])


@dataclass(frozen=True)
class Hidden:
    """Peer → client: `[n_tokens, n_embd]` hidden states after the span, and compute time in ms.

    `pushed`: the peer also pushed them to the next hop (Forward.push), so the client need not
    relay them; this copy is what the client keeps for failover."""

    step: int
    hidden: np.ndarray
    compute_ms: float
    pushed: bool = False

    def __post_init__(self) -> None:
        _int("step", self.step, 0, _U64)
        _tensor("hidden", self.hidden, MAX_HIDDEN)
        _float("compute_ms", self.compute_ms, 0.0, 1e9)
        _bool("pushed", self.pushed)


@dataclass(frozen=True)
class Token:
    """Last peer → client: the sampled token of a step.

    Attributes:
        step: the step of the `Forward` this answers.
        token: sampled token id.
        logprob: its natural-log probability (<= 0, may be -inf); None unless the session's sampling
            asked for log-probs (`SamplingParams.logprobs` or `n_top_logprobs`).
        top: up to MAX_TOP_LOGPROBS (token id, logprob) pairs.
        compute_ms: span compute time in ms.
        logits: `[rows, n_vocab]` float32 when the client asked (want_logits), else None.
    """

    step: int
    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]
    compute_ms: float
    logits: np.ndarray | None = None

    def __post_init__(self) -> None:
        _int("step", self.step, 0, _U64)
        _int("token", self.token, 0, MAX_VOCAB - 1)
        if self.logprob is not None:
            _float("logprob", self.logprob, -math.inf, 0.0)
        if not isinstance(self.top, tuple) or len(self.top) > MAX_TOP_LOGPROBS:
            raise ProtocolError(f"field 'top' must be a tuple of at most {MAX_TOP_LOGPROBS} pairs")
        for pair in self.top:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ProtocolError("field 'top' must hold (token id, logprob) pairs")
            _int("top.id", pair[0], 0, MAX_VOCAB - 1)
            _float("top.logprob", pair[1], -math.inf, 0.0)
        _float("compute_ms", self.compute_ms, 0.0, 1e9)
        if self.logits is not None:
            _tensor("logits", self.logits, MAX_VOCAB)


@dataclass(frozen=True)
class Truncate:
    """Client → peer: roll the session back so that its next position is `pos`."""

    pos: int

    def __post_init__(self) -> None:
        _int("pos", self.pos, 0, MAX_CONTEXT_TOKENS)


def _addrs(name: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, tuple) or len(v) > MAX_CHAIN_ADDRS:
        raise ProtocolError(f"field {name!r} must be a tuple of at most {MAX_CHAIN_ADDRS} multiaddrs")
    for a in v:
        _str(name, a, MAX_ADDR_CHARS)
    return v


@dataclass(frozen=True)
class Chain:
    """Client → peer: where this session's pushed outputs go, and whose pushes it accepts.

    Answered with `OpenOk` (an acknowledgement). A later Chain replaces the earlier one.

    Attributes:
        next_peer: peer id of the next hop ("": push to no one).
        next_session: that hop's session id (16 bytes; b"" with no next_peer).
        next_addrs: the next hop's libp2p multiaddrs.
        next_direct: the next hop's direct-stream endpoints (swarm/direct.py), tried first.
        prev_peer: the only peer id whose pushed frames this session accepts ("": none).
    """

    next_peer: str = ""
    next_session: bytes = b""
    next_addrs: tuple[str, ...] = ()
    next_direct: tuple[str, ...] = ()
    prev_peer: str = ""

    def __post_init__(self) -> None:
        _str("next_peer", self.next_peer, MAX_ID_CHARS)
        _str("prev_peer", self.prev_peer, MAX_ID_CHARS)
        if not isinstance(self.next_session, bytes) or len(self.next_session) != (
            SESSION_ID_BYTES if self.next_peer else 0
        ):
            raise ProtocolError(
                f"field 'next_session' must be {SESSION_ID_BYTES} bytes with a next_peer, else empty"
            )
        _addrs("next_addrs", self.next_addrs)
        _addrs("next_direct", self.next_direct)


@dataclass(frozen=True)
class Attach:
    """Peer → next peer, first frame of a push stream: the pushed Forwards are for this session.

    Answered with `OpenOk` when the session exists and names the sender as `Chain.prev_peer`."""

    session_id: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, bytes) or len(self.session_id) != SESSION_ID_BYTES:
            raise ProtocolError(f"field 'session_id' must be {SESSION_ID_BYTES} bytes")


@dataclass(frozen=True)
class Close:
    """Client → peer: release the session; the stream ends."""


Frame = Union[Open, OpenOk, Error, Forward, Hidden, Token, Truncate, Chain, Attach, Close]

_KINDS: dict[type, str] = {
    Open: "open",
    OpenOk: "open_ok",
    Error: "error",
    Forward: "forward",
    Hidden: "hidden",
    Token: "token",
    Truncate: "truncate",
    Chain: "chain",
    Attach: "attach",
    Close: "close",
}
_FIELDS: dict[str, frozenset[str]] = {
    "open": frozenset(
        {"session_id", "client_id", "model_id", "start", "end", "max_tokens", "sampling", "prefixes"}
    ),
    "open_ok": frozenset({"reserved_tokens", "restorable", "fetched_from"}),
    "error": frozenset({"code", "message"}),
    "forward": frozenset(
        {"step", "pos0", "sample", "want_logits", "all_logits", "restore", "push", "rewind", "steps", "dtype",
         "shape"}
    ),
    "hidden": frozenset({"step", "compute_ms", "pushed", "dtype", "shape"}),
    "token": frozenset({"step", "token", "logprob", "top", "compute_ms", "dtype", "shape"}),
    "truncate": frozenset({"pos"}),
    "chain": frozenset({"next_peer", "next_session", "next_addrs", "next_direct", "prev_peer"}),
    "attach": frozenset({"session_id"}),
    "close": frozenset(),
}
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "n_top_logprobs", "logprobs")


# ---- encode ---------------------------------------------------------------------------------------


def _header(frame: Frame) -> tuple[dict[str, Any], np.ndarray | None]:
    """The header map (without "k") and the tensor, if any, of a frame."""
    if isinstance(frame, Open):
        s = frame.sampling
        return {
            "session_id": frame.session_id,
            "client_id": frame.client_id,
            "model_id": frame.model_id,
            "start": frame.start,
            "end": frame.end,
            "max_tokens": frame.max_tokens,
            "sampling": {name: getattr(s, name) for name in _SAMPLING_FIELDS},
            "prefixes": [[n, h] for n, h in frame.prefixes],
        }, None
    if isinstance(frame, OpenOk):
        return {
            "reserved_tokens": frame.reserved_tokens,
            "restorable": list(frame.restorable),
            "fetched_from": frame.fetched_from,
        }, None
    if isinstance(frame, Error):
        return {"code": frame.code.value, "message": frame.message}, None
    if isinstance(frame, Forward):
        return {
            "step": frame.step,
            "pos0": frame.pos0,
            "sample": frame.sample,
            "want_logits": frame.want_logits,
            "all_logits": frame.all_logits,
            "restore": frame.restore,
            "push": frame.push,
            "rewind": frame.rewind,
            "steps": list(frame.steps),
        }, frame.hidden
    if isinstance(frame, Hidden):
        return {"step": frame.step, "compute_ms": frame.compute_ms, "pushed": frame.pushed}, frame.hidden
    if isinstance(frame, Token):
        return {
            "step": frame.step,
            "token": frame.token,
            "logprob": frame.logprob,
            "top": [list(p) for p in frame.top],
            "compute_ms": frame.compute_ms,
        }, frame.logits
    if isinstance(frame, Truncate):
        return {"pos": frame.pos}, None
    if isinstance(frame, Chain):
        return {
            "next_peer": frame.next_peer,
            "next_session": frame.next_session,
            "next_addrs": list(frame.next_addrs),
            "next_direct": list(frame.next_direct),
            "prev_peer": frame.prev_peer,
        }, None
    if isinstance(frame, Attach):
        return {"session_id": frame.session_id}, None
    return {}, None


def encode_frame(frame: Frame) -> bytes:
    """Serialize one frame to a body: generation byte, header length, msgpack header, tensor bytes.

    Args:
        frame: any frame dataclass of this module (already validated on construction).
    Returns:
        bytes: the frame body, at most MAX_FRAME_BYTES.
    Raises:
        ProtocolError: not a frame, or the header or whole body exceeds its size bound.
    """
    kind = _KINDS.get(type(frame))
    if kind is None:
        raise ProtocolError(f"not a frame: {type(frame).__name__}")
    header, tensor = _header(frame)
    header["k"] = kind
    payload = b""
    if tensor is not None:
        header["dtype"] = _DTYPE_NAMES[tensor.dtype]
        header["shape"] = [int(tensor.shape[0]), int(tensor.shape[1])]
        payload = np.ascontiguousarray(tensor, dtype=_DTYPES[header["dtype"]]).tobytes()
    elif kind == "token":
        header["dtype"] = None
        header["shape"] = None
    packed = msgpack.packb(header, use_bin_type=True)
    if len(packed) > MAX_HEADER_BYTES:
        raise ProtocolError(f"{kind} header is {len(packed)} B, over MAX_HEADER_BYTES {MAX_HEADER_BYTES}")
    size = _PREFIX.size + len(packed) + len(payload)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"{kind} frame is {size} B, over MAX_FRAME_BYTES {MAX_FRAME_BYTES}")
    return b"".join((_PREFIX.pack(PROTOCOL_GENERATION, len(packed)), packed, payload))


# ---- decode ---------------------------------------------------------------------------------------


def _decode_tensor(h: dict[str, Any], payload: memoryview, max_cols: int) -> np.ndarray:
    dtype = _DTYPES.get(h["dtype"]) if isinstance(h["dtype"], str) else None
    if dtype is None:
        raise ProtocolError(f"field 'dtype' must be one of {sorted(_DTYPES)}, got {h['dtype']!r:.40}")
    shape = h["shape"]
    if not isinstance(shape, list) or len(shape) != 2:
        raise ProtocolError("field 'shape' must be [rows, cols]")
    rows = _int("shape[0]", shape[0], 1, MAX_FRAME_BYTES)
    cols = _int("shape[1]", shape[1], 1, max_cols)
    if rows * cols * dtype.itemsize != len(payload):
        raise ProtocolError(
            f"tensor of shape [{rows}, {cols}] {h['dtype']} needs {rows * cols * dtype.itemsize} B, "
            f"frame carries {len(payload)} B"
        )
    return np.frombuffer(payload, dtype=dtype).reshape(rows, cols)


def _no_payload(kind: str, payload: memoryview) -> None:
    if len(payload):
        raise ProtocolError(f"{kind} frame carries {len(payload)} unexpected tensor bytes")


def _decode_sampling(v: Any) -> SamplingParams:
    if not isinstance(v, dict) or set(v) != set(_SAMPLING_FIELDS):
        raise ProtocolError(f"field 'sampling' must be a map with exactly {list(_SAMPLING_FIELDS)}")
    try:
        return SamplingParams(**v)
    except RequestError as err:
        raise ProtocolError(f"field 'sampling': {err}") from None


def _decode_pairs(name: str, v: Any) -> tuple:
    if not isinstance(v, list) or not all(isinstance(p, list) for p in v):
        raise ProtocolError(f"field {name!r} must be a list of pairs")
    return tuple(tuple(p) for p in v)


def _decode_ints(name: str, v: Any) -> tuple:
    if not isinstance(v, list) or len(v) > MAX_FORWARD_STEPS:
        raise ProtocolError(f"field {name!r} must be a list of at most {MAX_FORWARD_STEPS} integers")
    return tuple(v)


def _decode_strs(name: str, v: Any) -> tuple:
    if not isinstance(v, list):
        raise ProtocolError(f"field {name!r} must be a list")
    return tuple(v)


def _build(kind: str, h: dict[str, Any], payload: memoryview) -> Frame:
    if kind == "forward":
        return Forward(
            step=h["step"],
            pos0=h["pos0"],
            hidden=_decode_tensor(h, payload, MAX_HIDDEN),
            sample=h["sample"],
            want_logits=h["want_logits"],
            all_logits=h["all_logits"],
            restore=h["restore"],
            push=h["push"],
            rewind=h["rewind"],
            steps=_decode_ints("steps", h["steps"]),
        )
    if kind == "hidden":
        hidden = _decode_tensor(h, payload, MAX_HIDDEN)
        return Hidden(step=h["step"], hidden=hidden, compute_ms=h["compute_ms"], pushed=h["pushed"])
    if kind == "token":
        logits = None
        if h["dtype"] is not None or h["shape"] is not None:
            logits = _decode_tensor(h, payload, MAX_VOCAB)
        else:
            _no_payload(kind, payload)
        top = h["top"]
        if not isinstance(top, list) or not all(isinstance(p, list) for p in top):
            raise ProtocolError("field 'top' must be a list of [token id, logprob] pairs")
        return Token(
            step=h["step"],
            token=h["token"],
            logprob=h["logprob"],
            top=tuple(tuple(p) for p in top),
            compute_ms=h["compute_ms"],
            logits=logits,
        )
    _no_payload(kind, payload)
    if kind == "open":
        return Open(
            session_id=h["session_id"],
            client_id=h["client_id"],
            model_id=h["model_id"],
            start=h["start"],
            end=h["end"],
            max_tokens=h["max_tokens"],
            sampling=_decode_sampling(h["sampling"]),
            prefixes=_decode_pairs("prefixes", h["prefixes"]),
        )
    if kind == "open_ok":
        restorable = h["restorable"]
        if not isinstance(restorable, list):
            raise ProtocolError("field 'restorable' must be a list")
        return OpenOk(
            reserved_tokens=h["reserved_tokens"], restorable=tuple(restorable), fetched_from=h["fetched_from"]
        )
    if kind == "error":
        try:
            code = ErrorCode(h["code"])
        except (ValueError, TypeError):
            raise ProtocolError(f"unknown error code {h['code']!r:.40}") from None
        return Error(code=code, message=_str("message", h["message"], MAX_MESSAGE_CHARS))
    if kind == "truncate":
        return Truncate(pos=h["pos"])
    if kind == "chain":
        return Chain(
            next_peer=h["next_peer"],
            next_session=h["next_session"],
            next_addrs=_decode_strs("next_addrs", h["next_addrs"]),
            next_direct=_decode_strs("next_direct", h["next_direct"]),
            prev_peer=h["prev_peer"],
        )
    if kind == "attach":
        return Attach(session_id=h["session_id"])
    return Close()


def decode_frame(data: bytes | bytearray | memoryview) -> Frame:
    """Parse and validate one frame body.

    Args:
        data: a whole frame body as produced by `encode_frame`.
    Returns:
        Frame: the frame dataclass; tensors are views into `data` (read-only when data is bytes).
    Raises:
        ProtocolError: wrong generation, oversized, truncated, malformed msgpack, unknown kind,
            missing/extra/mistyped/out-of-range fields, or tensor bytes not matching the shape.
            No other exception type escapes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"frame must be bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B")
    if len(view) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(view)} B is over MAX_FRAME_BYTES {MAX_FRAME_BYTES}")
    if len(view) < _PREFIX.size:
        raise ProtocolError(f"frame of {len(view)} B is too short")
    generation, header_len = _PREFIX.unpack_from(view)
    if generation != PROTOCOL_GENERATION:
        raise ProtocolError(
            f"peer speaks protocol generation {generation}, this one speaks {PROTOCOL_GENERATION}"
        )
    if header_len > MAX_HEADER_BYTES or _PREFIX.size + header_len > len(view):
        raise ProtocolError(f"header length {header_len} is over the bound or past the end of the frame")
    try:
        h = msgpack.unpackb(view[_PREFIX.size : _PREFIX.size + header_len], raw=False, strict_map_key=True)
    except Exception as err:  # msgpack raises many types (ValueError, ExtraData, StackError, ...)
        raise ProtocolError(f"malformed frame header: {type(err).__name__}") from None
    if not isinstance(h, dict):
        raise ProtocolError("frame header must be a map")
    kind = h.pop("k", None)
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise ProtocolError(f"unknown frame kind {kind!r:.40}")
    if set(h) != _FIELDS[kind]:
        raise ProtocolError(f"{kind} frame fields {sorted(map(str, h))} != {sorted(_FIELDS[kind])}")
    return _build(kind, h, view[_PREFIX.size + header_len :])
