"""Every frame of the peer stream protocol: one field table per frame, from which construction-time
validation, encoding to bytes and decoding with full validation all follow.

A frame body (the transport adds its own length framing around it) is:

    [generation: u8][header_len: u16 big-endian][msgpack header: map][tensor bytes]

The generation byte comes first and is checked before anything else, so a peer of another
protocol generation is refused with a clear `ProtocolError` whatever its header looks like (fail
closed). The header is a msgpack map with `"k"` (the frame kind) and the kind's fields, no more and
no fewer (any change to a frame bumps `PROTOCOL_GENERATION`). Frames that carry a tensor give its
`"dtype"` ("f32" or "f16", little-endian) and `"shape"` [rows, cols] in the header; the bytes
after the header are exactly rows * cols * itemsize of row-major data, then a frame's trailer if it
has one (`Forward.token_ids`: its header value is the count n, and 4 * n bytes of little-endian int32
follow the tensor).

Each frame is a frozen dataclass whose fields name their wire kind (`_Int`, `_Seq`, `_Tensor`, ...
declared with `_wire`): the kind checks a value on construction, writes it to the header and reads
it back, so a field is described once. Rules that tie two fields together (`Forward.restore` equals
`pos0` when set, ...) are the frame's `_relate`. Header keys follow the field order, then "k", then
"dtype" and "shape".

Size line: a decode step moves one `Forward` (client → peer) or `Hidden` (peer → client) frame of
4·n_embd tensor bytes + about 75-135 B of prefix and header (measured: Forward 121-133 B, Hidden
78-86 B, growing with the step and position counters): for SmolLM2 (n_embd 576) 2304 B + ~100 B;
for Qwen2.5 0.5B (n_embd 896) 3584 B + ~100 B; at n_embd 2048, 8 KiB + ~100 B per token per hop. A
model whose residual stream is wider than n_embd sends `ArchRow.boundary_width` times the tensor
bytes (deepseek4: 4·4·n_embd), and one whose layers read token ids 4 B more per row in each Forward
(`Forward.token_ids`). The last span answers with a `Token` frame of about 85 B + 15 B per top
log-prob. Encode + decode of a [1, 896] f32 Forward: ~11 µs.

Decoding never raises anything but `swarm.errors.ProtocolError`: garbage, truncated or oversized
bytes, unknown kinds, missing, extra or mistyped fields, out-of-range values and tensor sizes that
do not match their shape are all refused. Decoded tensors are read-only `np.frombuffer` views of
the input bytes (no copy).

Bounds only the protocol uses live here; those other checks share (MAX_FRAME_BYTES, MAX_LAYERS,
MAX_HIDDEN, MAX_VOCAB, MAX_ADDR_CHARS, MAX_PREFIX_OFFERS, PREFIX_HASH_BYTES) and the stream
protocol ids live in swarm/limits.py.

This module does not: frame messages on a socket, do I/O, or define DHT records (see swarm/dht/).
It is one concern, the stream protocol, and stays one file past the house's ~400 lines: the field
kinds exist only to describe these frames, and the fuzz targets are exactly its decoder.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar, Union, dataclass_transform

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
    MAX_VERIFY_ROWS,
    MAX_VOCAB,
    PREFIX_HASH_BYTES,
)
from swarm.sampling import MAX_TOP_LOGPROBS, SamplingParams

PROTOCOL_GENERATION = 11
"""Version of every frame below; a peer refuses frames of any other generation.

2: prefix KV snapshots (`Open.prefixes`, `OpenOk.restorable` / `fetched_from`, `Forward.restore`).
3: server push (`Chain`, `Attach`, `Forward.push` / `rewind`, `Hidden.pushed`); `Token.logprob` only
   when asked (`SamplingParams.logprobs`).
4: `Forward.steps`: one frame replays many recorded steps, each computed as it was first sent.
5: `Forward.sample` dropped: no peer read it (the last span always samples).
6: `Chain.next_relay`, the next hop's relay addresses (a peer behind a NAT: swarm/relay); and
   receipts: `Hidden.receipt` and `Token.receipt`, the digest of the input rows the peer computed
   (`receipt`), so a client can check a push chain end to end; and speculative decoding:
   `Forward.verify` (the last span samples every row), `Token.tokens`, `OpenOk.verify_rows`.
7: `Forward.token_ids`, the rows' token ids after the tensor bytes (deepseek4's hash-routed layers
   pick experts by token id: the arch row's `token_ids` sideband); empty for other models.
8: `Forward.want_draft` and `Token.draft`: the last span's multi-token-prediction head's draft.
9: no frame changed; a span whose cache cannot truncate (recurrent or compressed state) rolls back
   the rows of a verify pass from the state it exported before it (swarm/peer/checkpoints.py), so
   clients speculate on those models too. A generation-8 peer refused those rewinds.
10: `Token.draft` answering a verify pass drafts after the token that follows the pass's accepted
   rows (`swarm.spec.verify.accepted` of its `token_ids` and `Token.tokens`), not after `token`:
   a rejected guess still brings the next one.
11: `Forward.want_draft` is a count (was a flag) and `Token.draft` holds up to that many guesses: the
   head's drafts chained as llama.cpp chains one MTP head, so one pass can verify several."""

RECEIPT_BYTES = 16
"""Size of a step's receipt (BLAKE2b-128 of its input rows)."""


def receipt(rows: np.ndarray, token_ids: np.ndarray | None = None) -> bytes:
    """The receipt of a step: BLAKE2b-128 of its input rows as little-endian float32 bytes, then of
    its token ids (`Forward.token_ids`) as little-endian int32 bytes when it carries any.

    A peer answers every step with the receipt of the rows it computed (`Hidden.receipt`,
    `Token.receipt`); the client compares it with the receipt of the rows it sent or of the copy
    the previous hop returned of what it pushed, so rows (or token ids) altered between pushing
    peers are found at the step they were altered (swarm/client/session.py).

    Args:
        rows: `[n, hidden]` float32 or float16 (hashed as float32).
        token_ids: `[n]` integers, or None / empty: none (the receipt of the rows alone).
    Returns:
        RECEIPT_BYTES bytes.
    """
    h = hashlib.blake2b(np.ascontiguousarray(rows, dtype="<f4").tobytes(), digest_size=RECEIPT_BYTES)
    if token_ids is not None and len(token_ids):
        h.update(np.ascontiguousarray(token_ids, dtype=_IDS).tobytes())
    return h.digest()

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
_IDS = np.dtype("<i4")
_U64 = 2**64 - 1
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "n_top_logprobs", "logprobs")


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


def _str(name: str, v: Any, max_chars: int) -> str:
    if not isinstance(v, str) or len(v) > max_chars:
        raise ProtocolError(f"field {name!r} must be a string of at most {max_chars} chars")
    return v


# ---- field kinds: how one field is checked, written to the header and read back -------------------


class _Kind:
    """How one frame field is checked on construction, encoded into the header and decoded from it.

    `check(name, v)` returns the value to store (only `_Text` changes it) or raises ProtocolError
    naming the field; `encode(v)` gives the msgpack value; `decode(name, raw)` turns a msgpack value
    into the constructor argument, refusing only what would not even reach `check` (a list where a
    tuple is stored): the constructor runs `check` on it next."""

    def check(self, name: str, v: Any) -> Any:
        raise NotImplementedError

    def encode(self, v: Any) -> Any:
        return v

    def decode(self, name: str, raw: Any) -> Any:
        return raw


@dataclass(frozen=True)
class _Int(_Kind):
    """An integer in [lo, hi] (bool refused)."""

    lo: int
    hi: int

    def check(self, name: str, v: Any) -> Any:
        return _int(name, v, self.lo, self.hi)


@dataclass(frozen=True)
class _Float(_Kind):
    """A number in [lo, hi] (NaN and bool refused); `optional`: None allowed too."""

    lo: float
    hi: float
    optional: bool = False

    def check(self, name: str, v: Any) -> Any:
        if v is None and self.optional:
            return v
        lo, hi = self.lo, self.hi
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or not lo <= v <= hi:
            raise ProtocolError(f"field {name!r} must be a number in [{lo}, {hi}], got {v!r:.80}")
        return v


class _Bool(_Kind):
    def check(self, name: str, v: Any) -> Any:
        if not isinstance(v, bool):
            raise ProtocolError(f"field {name!r} must be a boolean, got {v!r:.80}")
        return v


@dataclass(frozen=True)
class _Str(_Kind):
    """A string of at most max_chars; `hex`: also non-empty lowercase hex."""

    max_chars: int
    hex: bool = False

    def check(self, name: str, v: Any) -> Any:
        _str(name, v, self.max_chars)
        if self.hex and (not v or any(c not in "0123456789abcdef" for c in v)):
            raise ProtocolError(f"field {name!r} must be a non-empty lowercase hex string")
        return v


@dataclass(frozen=True)
class _Text(_Kind):
    """A string cut to max_chars on construction; a decoded one over max_chars is refused."""

    max_chars: int

    def check(self, name: str, v: Any) -> Any:
        if not isinstance(v, str):
            raise ProtocolError(f"field {name!r} must be a string")
        return v[: self.max_chars]

    def decode(self, name: str, raw: Any) -> Any:
        return _str(name, raw, self.max_chars)


@dataclass(frozen=True)
class _Bytes(_Kind):
    """Exactly n bytes; `or_empty`: b"" allowed too."""

    n: int
    or_empty: bool = False

    def check(self, name: str, v: Any) -> Any:
        if not isinstance(v, bytes) or not (len(v) == self.n or (self.or_empty and not v)):
            or_empty = " or empty" if self.or_empty else ""
            raise ProtocolError(f"field {name!r} must be {self.n} bytes{or_empty}")
        return v


@dataclass(frozen=True)
class _Choice(_Kind):
    """A member of a str enum, sent as its value; `what` names it in the decode error."""

    enum: type[enum.Enum]
    what: str

    def check(self, name: str, v: Any) -> Any:
        if not isinstance(v, self.enum):
            raise ProtocolError(f"field {name!r} must be an {self.enum.__name__}, got {v!r:.80}")
        return v

    def encode(self, v: Any) -> Any:
        return v.value

    def decode(self, name: str, raw: Any) -> Any:
        try:
            return self.enum(raw)
        except (ValueError, TypeError):
            raise ProtocolError(f"unknown {self.what} {raw!r:.40}") from None


class _Sampling(_Kind):
    """`SamplingParams`, sent as a map with exactly `_SAMPLING_FIELDS`."""

    def check(self, name: str, v: Any) -> Any:
        if not isinstance(v, SamplingParams):
            raise ProtocolError(f"field {name!r} must be SamplingParams")
        return v

    def encode(self, v: Any) -> Any:
        return {f: getattr(v, f) for f in _SAMPLING_FIELDS}

    def decode(self, name: str, raw: Any) -> Any:
        if not isinstance(raw, dict) or set(raw) != set(_SAMPLING_FIELDS):
            raise ProtocolError(f"field {name!r} must be a map with exactly {list(_SAMPLING_FIELDS)}")
        try:
            return SamplingParams(**raw)
        except RequestError as err:
            raise ProtocolError(f"field {name!r}: {err}") from None


@dataclass(frozen=True)
class _Pair(_Kind):
    """A (first, second) tuple, sent as a 2-list; the parts are checked as `<field>.<part name>`."""

    first: tuple[str, _Kind]
    second: tuple[str, _Kind]

    def _refuse(self, name: str) -> ProtocolError:
        return ProtocolError(f"field {name!r} must hold ({self.first[0]}, {self.second[0]}) pairs")

    def check(self, name: str, v: Any) -> Any:
        if not isinstance(v, tuple) or len(v) != 2:
            raise self._refuse(name)
        for (part, kind), x in zip((self.first, self.second), v):
            kind.check(f"{name}.{part}", x)
        return v

    def encode(self, v: Any) -> Any:
        return [self.first[1].encode(v[0]), self.second[1].encode(v[1])]

    def decode(self, name: str, raw: Any) -> Any:
        if not isinstance(raw, list):
            raise self._refuse(name)
        return tuple(raw)


@dataclass(frozen=True)
class _Seq(_Kind):
    """A tuple of at most max_len items of one kind (`noun` names them), sent as a list.

    `ascending`: the items (or the pairs' first parts) are strictly ascending integers."""

    item: _Kind
    max_len: int
    noun: str
    ascending: bool = False

    def check(self, name: str, v: Any) -> Any:
        if not isinstance(v, tuple) or len(v) > self.max_len:
            raise ProtocolError(f"field {name!r} must be a tuple of at most {self.max_len} {self.noun}")
        for x in v:
            self.item.check(name, x)
        if self.ascending:
            keys = [x[0] if isinstance(self.item, _Pair) else x for x in v]
            if any(b <= a for a, b in zip(keys, keys[1:])):
                raise ProtocolError(f"field {name!r} must be strictly ascending")
        return v

    def encode(self, v: Any) -> Any:
        return [self.item.encode(x) for x in v]

    def decode(self, name: str, raw: Any) -> Any:
        if not isinstance(raw, list) or len(raw) > self.max_len:
            raise ProtocolError(f"field {name!r} must be a list of at most {self.max_len} {self.noun}")
        return tuple(self.item.decode(name, x) for x in raw)


@dataclass(frozen=True)
class _Tensor(_Kind):
    """A `[rows, cols]` f32/f16 array, rows >= 1, 1 <= cols <= max_cols, carried after the header
    (its "dtype" and "shape" in the header); `optional`: None allowed too (both then None)."""

    max_cols: int
    optional: bool = False

    def check(self, name: str, v: Any) -> Any:
        if v is None and self.optional:
            return v
        if not isinstance(v, np.ndarray) or v.ndim != 2 or v.dtype not in _DTYPE_NAMES:
            raise ProtocolError(f"field {name!r} must be a 2-D float32 or float16 array")
        if v.shape[0] < 1 or not 1 <= v.shape[1] <= self.max_cols:
            raise ProtocolError(
                f"field {name!r} has bad shape {v.shape} (rows >= 1, 1 <= cols <= {self.max_cols})"
            )
        return v


@dataclass(frozen=True)
class _Ids(_Kind):
    """A 1-D array of int32 ids in [0, max_id], stored as a contiguous little-endian int32 array
    (a constructor may give any integer dtype); carried as the frame's trailer, after the tensor
    bytes: its header value is the count, the ids follow the tensor as 4 * count bytes."""

    max_id: int

    def check(self, name: str, v: Any) -> Any:
        if not isinstance(v, np.ndarray) or v.ndim != 1 or v.dtype.kind not in "iu":
            raise ProtocolError(f"field {name!r} must be a 1-D integer array")
        lo, hi = (int(v[0]), int(v[0])) if v.size == 1 else (int(v.min()), int(v.max())) if v.size else (0, 0)
        if lo < 0 or hi > self.max_id:  # a decode step's one id: no array pass (twice per hop and token)
            raise ProtocolError(f"field {name!r} must hold ids in [0, {self.max_id}]")
        return v if v.dtype == _IDS else np.ascontiguousarray(v, dtype=_IDS)

    def encode(self, v: Any) -> Any:
        return int(v.shape[0])


def _wire(kind: _Kind, *, default: Any = dataclasses.MISSING,
          default_factory: Any = dataclasses.MISSING) -> Any:
    """Declare a frame field of this wire kind (with an optional default)."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"wire": kind})


# ---- frames ---------------------------------------------------------------------------------------


class _Frame:
    """Base of every frame: validates the fields by their kinds on construction, then `_relate`."""

    KIND: ClassVar[str]
    """The header's "k"."""
    _spec: ClassVar[tuple[tuple[str, _Kind], ...]]
    _tensor: ClassVar[str | None]
    """Name of the field carried as tensor bytes after the header, if any."""
    _trailer: ClassVar[str | None]
    """Name of the field carried after the tensor bytes (an `_Ids`), if any."""

    def __post_init__(self) -> None:
        for name, kind in self._spec:
            v = getattr(self, name)
            checked = kind.check(name, v)
            if checked is not v:
                object.__setattr__(self, name, checked)
        self._relate()

    def _relate(self) -> None:
        """Check the rules that tie fields together (each field alone is already valid)."""


_F = TypeVar("_F", bound=type)
_BY_KIND: dict[str, type[_Frame]] = {}


@dataclass_transform(frozen_default=True, field_specifiers=(_wire,))
def _frame(kind: str) -> Callable[[_F], _F]:
    """Make a class a frozen dataclass frame of header kind `kind`; every field is a `_wire`."""

    def make(cls: _F) -> _F:
        cls = dataclass(frozen=True)(cls)
        spec = tuple((f.name, f.metadata["wire"]) for f in dataclasses.fields(cls))
        cls.KIND, cls._spec = kind, spec
        cls._tensor = next((name for name, k in spec if isinstance(k, _Tensor)), None)
        cls._trailer = next((name for name, k in spec if isinstance(k, _Ids)), None)
        _BY_KIND[kind] = cls
        return cls

    return make


@_frame("open")
class Open(_Frame):
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

    session_id: bytes = _wire(_Bytes(SESSION_ID_BYTES))
    client_id: str = _wire(_Str(MAX_ID_CHARS))
    model_id: str = _wire(_Str(MAX_ID_CHARS, hex=True))
    start: int = _wire(_Int(0, MAX_LAYERS - 1))
    end: int = _wire(_Int(1, MAX_LAYERS))
    max_tokens: int = _wire(_Int(1, MAX_CONTEXT_TOKENS))
    sampling: SamplingParams = _wire(_Sampling(), default_factory=SamplingParams)
    prefixes: tuple[tuple[int, bytes], ...] = _wire(
        _Seq(_Pair(("n_tokens", _Int(1, MAX_CONTEXT_TOKENS)), ("hash", _Bytes(PREFIX_HASH_BYTES))),
             MAX_PREFIX_OFFERS, "pairs", ascending=True),
        default=(),
    )

    def _relate(self) -> None:
        _int("end", self.end, self.start + 1, MAX_LAYERS)


@_frame("open_ok")
class OpenOk(_Frame):
    """Peer → client: the session is open with `reserved_tokens` of KV cache.

    Attributes:
        reserved_tokens: KV tokens reserved.
        restorable: offered prefix lengths this peer can restore (held, or fetched from another
            peer during Open), ascending, at most MAX_PREFIX_OFFERS.
        fetched_from: peer id of the holder the peer fetched a snapshot from for this Open ("": none).
        verify_rows: rows of one session's step the span computes exactly as one-row steps (probed at
            load, swarm/peer/exact_rows.py): the largest group a verify pass may be computed in.
    """

    reserved_tokens: int = _wire(_Int(1, MAX_CONTEXT_TOKENS))
    restorable: tuple[int, ...] = _wire(
        _Seq(_Int(1, MAX_CONTEXT_TOKENS), MAX_PREFIX_OFFERS, "lengths", ascending=True), default=()
    )
    fetched_from: str = _wire(_Str(MAX_ID_CHARS), default="")
    verify_rows: int = _wire(_Int(1, MAX_VERIFY_ROWS), default=1)


@_frame("error")
class Error(_Frame):
    """Peer → client: the request failed; `message` is cut to MAX_MESSAGE_CHARS on construction."""

    code: ErrorCode = _wire(_Choice(ErrorCode, "error code"))
    message: str = _wire(_Text(MAX_MESSAGE_CHARS))


@_frame("forward")
class Forward(_Frame):
    """Client → peer: run the span on hidden states for positions [pos0, pos0 + n_tokens).

    The last span always samples the last row and answers with `Token`; other spans answer `Hidden`.

    Attributes:
        step: client step counter (echoed in the reply), 0..2**64-1.
        pos0: position of the first row in the session.
        hidden: `[n_tokens, n_embd]` float32 or float16 hidden states (residual stream).
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
        verify: a verify pass of speculative decoding (swarm/spec/verify.py), at most
            MAX_VERIFY_ROWS rows: the last span samples every row, row i as the token at position
            pos0 + i + 1, and answers them all in `Token.tokens`; other spans pass it on as it came.
        token_ids: `[n_tokens]` int32, the token id of each row (the token at its position), each
            in [0, MAX_VOCAB); or empty. Sent for a model whose arch row has a `token_ids` sideband
            (deepseek4: hash-routed layers pick experts by token id), empty for the others; a span
            that reads token ids refuses a Forward without them (swarm/peer/span.py), the others
            ignore them. A pushed Forward carries the ids it was sent with. Carried after the tensor
            bytes (4 B per row), so a long prefill's ids do not count against MAX_HEADER_BYTES.
        want_draft: last span only: where the span runs the model's multi-token-prediction head
            (`SpanExecutor.has_mtp`), also answer up to this many of the head's chained drafts of
            the tokens after the sampled one (`Token.draft`; a peer drafts at most
            `swarm.ggml_bridge.executor.MTP_MAX_DRAFTS`); 0, or a span without a head: no draft.
    """

    step: int = _wire(_Int(0, _U64))
    pos0: int = _wire(_Int(0, MAX_CONTEXT_TOKENS))
    hidden: np.ndarray = _wire(_Tensor(MAX_HIDDEN))
    want_logits: bool = _wire(_Bool(), default=False)
    all_logits: bool = _wire(_Bool(), default=False)
    restore: int = _wire(_Int(0, MAX_CONTEXT_TOKENS), default=0)
    push: bool = _wire(_Bool(), default=False)
    rewind: bool = _wire(_Bool(), default=False)
    steps: tuple[int, ...] = _wire(
        _Seq(_Int(1, MAX_CONTEXT_TOKENS), MAX_FORWARD_STEPS, "row counts"), default=()
    )
    verify: bool = _wire(_Bool(), default=False)
    token_ids: np.ndarray = _wire(_Ids(MAX_VOCAB - 1), default_factory=lambda: np.zeros(0, _IDS))
    want_draft: int = _wire(_Int(0, MAX_VERIFY_ROWS - 1), default=0)

    def _relate(self) -> None:
        rows = self.hidden.shape[0]
        if self.token_ids.shape[0] not in (0, rows):
            n = self.token_ids.shape[0]
            raise ProtocolError(f"field 'token_ids' holds {n} ids, the frame has {rows} rows")
        if self.verify and rows > MAX_VERIFY_ROWS:
            raise ProtocolError(f"a verify pass carries at most {MAX_VERIFY_ROWS} rows, got {rows}")
        if self.steps and sum(self.steps) != rows:
            raise ProtocolError(f"field 'steps' sums to {sum(self.steps)} rows, the frame has {rows}")
        _int("pos0", self.pos0, 0, MAX_CONTEXT_TOKENS - rows)
        if self.all_logits and not self.want_logits:
            raise ProtocolError("field 'all_logits' needs 'want_logits'")
        if self.restore and self.restore != self.pos0:
            raise ProtocolError("field 'restore' must equal 'pos0' when set")
        if self.rewind and self.restore:
            raise ProtocolError("fields 'rewind' and 'restore' exclude each other")

    @property
    def n_tokens(self) -> int:
        """Number of rows (tokens) in `hidden`."""
        return int(self.hidden.shape[0])


@_frame("hidden")
class Hidden(_Frame):
    """Peer → client: `[n_tokens, n_embd]` hidden states after the span, and compute time in ms.

    `pushed`: the peer also pushed them to the next hop (Forward.push), so the client need not
    relay them; this copy is what the client keeps for failover. `receipt`: `receipt` of the input
    rows the peer computed (b"": none given)."""

    step: int = _wire(_Int(0, _U64))
    hidden: np.ndarray = _wire(_Tensor(MAX_HIDDEN))
    compute_ms: float = _wire(_Float(0.0, 1e9))
    pushed: bool = _wire(_Bool(), default=False)
    receipt: bytes = _wire(_Bytes(RECEIPT_BYTES, or_empty=True), default=b"")


@_frame("token")
class Token(_Frame):
    """Last peer → client: the sampled token of a step.

    Attributes:
        step: the step of the `Forward` this answers.
        token: sampled token id.
        logprob: its natural-log probability (<= 0, may be -inf); None unless the session's sampling
            asked for log-probs (`SamplingParams.logprobs` or `n_top_logprobs`).
        top: up to MAX_TOP_LOGPROBS (token id, logprob) pairs.
        compute_ms: span compute time in ms.
        logits: `[rows, n_vocab]` float32 when the client asked (want_logits), else None.
        receipt: `receipt` of the input rows the peer computed (b"": none given).
        tokens: answering a verify pass (`Forward.verify`): the token sampled after each of its rows,
            the last one equal to `token`; else ().
        draft: answering `Forward.want_draft` on a span with a multi-token-prediction head: the
            head's greedy drafts (argmax) of the tokens after `token`, each chained on the one
            before (`SpanExecutor.mtp_drafts`), at most `want_draft`; for a verify pass, after the
            token sampled after its accepted rows (`swarm.spec.verify.accepted` of the pass's
            `token_ids` and `tokens`), and () where the head no longer holds that position; else ().
    """

    step: int = _wire(_Int(0, _U64))
    token: int = _wire(_Int(0, MAX_VOCAB - 1))
    logprob: float | None = _wire(_Float(-math.inf, 0.0, optional=True))
    top: tuple[tuple[int, float], ...] = _wire(
        _Seq(_Pair(("id", _Int(0, MAX_VOCAB - 1)), ("logprob", _Float(-math.inf, 0.0))),
             MAX_TOP_LOGPROBS, "pairs")
    )
    compute_ms: float = _wire(_Float(0.0, 1e9))
    logits: np.ndarray | None = _wire(_Tensor(MAX_VOCAB, optional=True), default=None)
    receipt: bytes = _wire(_Bytes(RECEIPT_BYTES, or_empty=True), default=b"")
    tokens: tuple[int, ...] = _wire(_Seq(_Int(0, MAX_VOCAB - 1), MAX_VERIFY_ROWS, "token ids"), default=())
    draft: tuple[int, ...] = _wire(_Seq(_Int(0, MAX_VOCAB - 1), MAX_VERIFY_ROWS, "token ids"), default=())

    def _relate(self) -> None:
        if self.tokens and self.tokens[-1] != self.token:
            raise ProtocolError("field 'tokens' must end with 'token'")


@_frame("truncate")
class Truncate(_Frame):
    """Client → peer: roll the session back so that its next position is `pos`."""

    pos: int = _wire(_Int(0, MAX_CONTEXT_TOKENS))


_ADDRS = _Seq(_Str(MAX_ADDR_CHARS), MAX_CHAIN_ADDRS, "multiaddrs")


@_frame("chain")
class Chain(_Frame):
    """Client → peer: where this session's pushed outputs go, and whose pushes it accepts.

    Answered with `OpenOk` (an acknowledgement). A later Chain replaces the earlier one.

    Attributes:
        next_peer: peer id of the next hop ("": push to no one).
        next_session: that hop's session id (16 bytes; b"" with no next_peer).
        next_addrs: the next hop's libp2p multiaddrs.
        next_direct: the next hop's direct-stream endpoints (swarm/direct.py), tried first.
        next_relay: the next hop's relay addresses (swarm/relay), used when it announces any.
        prev_peer: the only peer id whose pushed frames this session accepts ("": none).
    """

    next_peer: str = _wire(_Str(MAX_ID_CHARS), default="")
    next_session: bytes = _wire(_Bytes(SESSION_ID_BYTES, or_empty=True), default=b"")
    next_addrs: tuple[str, ...] = _wire(_ADDRS, default=())
    next_direct: tuple[str, ...] = _wire(_ADDRS, default=())
    next_relay: tuple[str, ...] = _wire(_ADDRS, default=())
    prev_peer: str = _wire(_Str(MAX_ID_CHARS), default="")

    def _relate(self) -> None:
        if bool(self.next_session) != bool(self.next_peer):
            raise ProtocolError(
                f"field 'next_session' must be {SESSION_ID_BYTES} bytes with a next_peer, else empty"
            )


@_frame("attach")
class Attach(_Frame):
    """Peer → next peer, first frame of a push stream: the pushed Forwards are for this session.

    Answered with `OpenOk` when the session exists and names the sender as `Chain.prev_peer`."""

    session_id: bytes = _wire(_Bytes(SESSION_ID_BYTES))


@_frame("close")
class Close(_Frame):
    """Client → peer: release the session; the stream ends."""


Frame = Union[Open, OpenOk, Error, Forward, Hidden, Token, Truncate, Chain, Attach, Close]

_FIELDS: dict[str, frozenset[str]] = {
    kind: frozenset(name for name, _ in cls._spec if name != cls._tensor)
    | (frozenset({"dtype", "shape"}) if cls._tensor else frozenset())
    for kind, cls in _BY_KIND.items()
}
"""Header keys (besides "k") of each frame kind."""


# ---- encode ---------------------------------------------------------------------------------------


def encode_frame(frame: Frame) -> bytes:
    """Serialize one frame to a body: generation byte, header length, msgpack header, tensor bytes.

    Args:
        frame: any frame dataclass of this module (already validated on construction).
    Returns:
        bytes: the frame body, at most MAX_FRAME_BYTES.
    Raises:
        ProtocolError: not a frame, or the header or whole body exceeds its size bound.
    """
    cls = type(frame)
    if _BY_KIND.get(getattr(cls, "KIND", None)) is not cls:
        raise ProtocolError(f"not a frame: {cls.__name__}")
    header = {name: kind.encode(getattr(frame, name)) for name, kind in cls._spec if name != cls._tensor}
    header["k"] = cls.KIND
    payload = b""
    if cls._tensor is not None:
        tensor = getattr(frame, cls._tensor)
        header["dtype"] = header["shape"] = None
        if tensor is not None:
            header["dtype"] = _DTYPE_NAMES[tensor.dtype]
            header["shape"] = [int(tensor.shape[0]), int(tensor.shape[1])]
            payload = np.ascontiguousarray(tensor, dtype=_DTYPES[header["dtype"]]).tobytes()
    if cls._trailer is not None:
        payload += getattr(frame, cls._trailer).tobytes()  # contiguous "<i4" (`_Ids.check`)
    packed = msgpack.packb(header, use_bin_type=True)
    if len(packed) > MAX_HEADER_BYTES:
        raise ProtocolError(f"{cls.KIND} header is {len(packed)} B, over MAX_HEADER_BYTES {MAX_HEADER_BYTES}")
    size = _PREFIX.size + len(packed) + len(payload)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"{cls.KIND} frame is {size} B, over MAX_FRAME_BYTES {MAX_FRAME_BYTES}")
    return b"".join((_PREFIX.pack(PROTOCOL_GENERATION, len(packed)), packed, payload))


# ---- decode ---------------------------------------------------------------------------------------


def _decode_tensor(kind: str, h: dict[str, Any], payload: memoryview, spec: _Tensor) -> np.ndarray | None:
    if spec.optional and h["dtype"] is None and h["shape"] is None:
        _no_payload(kind, payload)
        return None
    dtype = _DTYPES.get(h["dtype"]) if isinstance(h["dtype"], str) else None
    if dtype is None:
        raise ProtocolError(f"field 'dtype' must be one of {sorted(_DTYPES)}, got {h['dtype']!r:.40}")
    shape = h["shape"]
    if not isinstance(shape, list) or len(shape) != 2:
        raise ProtocolError("field 'shape' must be [rows, cols]")
    rows = _int("shape[0]", shape[0], 1, MAX_FRAME_BYTES)
    cols = _int("shape[1]", shape[1], 1, spec.max_cols)
    if rows * cols * dtype.itemsize != len(payload):
        raise ProtocolError(
            f"tensor of shape [{rows}, {cols}] {h['dtype']} needs {rows * cols * dtype.itemsize} B, "
            f"frame carries {len(payload)} B"
        )
    return np.frombuffer(payload, dtype=dtype).reshape(rows, cols)


def _no_payload(kind: str, payload: memoryview) -> None:
    if len(payload):
        raise ProtocolError(f"{kind} frame carries {len(payload)} unexpected tensor bytes")


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
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown frame kind {kind!r:.40}")
    if set(h) != _FIELDS[kind]:
        raise ProtocolError(f"{kind} frame fields {sorted(map(str, h))} != {sorted(_FIELDS[kind])}")
    payload = view[_PREFIX.size + header_len :]
    trailer = None
    if cls._trailer is not None:
        payload, trailer = _split_trailer(cls._trailer, h[cls._trailer], payload)
    if cls._tensor is None:
        _no_payload(kind, payload)
    args = {
        name: _decode_tensor(kind, h, payload, spec) if name == cls._tensor
        else trailer if name == cls._trailer else spec.decode(name, h[name])
        for name, spec in cls._spec
    }
    return cls(**args)


def _split_trailer(name: str, count: Any, payload: memoryview) -> tuple[memoryview, np.ndarray]:
    """(the bytes before the trailer, the trailer's ids: a read-only view) of a payload whose
    trailer field's header value is `count`."""
    n = _int(name, count, 0, MAX_FRAME_BYTES // _IDS.itemsize)
    cut = len(payload) - n * _IDS.itemsize
    if cut < 0:
        raise ProtocolError(f"field {name!r} counts {n} ids ({n * _IDS.itemsize} B), "
                            f"the frame carries {len(payload)} B after its header")
    return payload[:cut], np.frombuffer(payload[cut:], dtype=_IDS)
