"""Prefix KV snapshots: what names one, its versioned format, and its signed, bounded payload.

A snapshot holds one span's KV cache for the first `n_tokens` tokens of a prompt, as llama.cpp's
sequence state bytes (`SpanExecutor.export_seq`). It is named by `SnapshotKey`: (model_id, span
start and end, `h(n_tokens)` of swarm/kv/prefix.py) and can only be used by an executor of the
same `SnapshotFormat`: swarm's payload version, llama.cpp's build and sequence-state version, the
KV dtype, flash attention, the prefill ubatch (the batch grid decides the exact numbers; see
swarm/kv/prefix.py) and the executor's KV stream count (llama.cpp's sequence state lists every
stream, so it imports only where the count is the same: peers with the same --max-sessions). Any
mismatch is refused with its reason (`SnapshotRejected`).

It also indexes `blocks`: (k·B, h(k·B)) for the block boundaries of the prompt, so a snapshot of a
1,000-token prompt serves every shared block prefix (import, then truncate to k·B).

Payload sent between peers (all lengths bounded before anything is allocated):

    b"SWKV" [header_len: u16 BE] [msgpack header] [sig_len: u16 BE] [signature] [KV bytes]

The header carries the key, the format, the block index, `kv_bytes` and `kv_sha256` of the KV
bytes, and the holder's RSA public key; the signature (the holder's identity key, see
swarm/dht/identity.py) covers magic + header, so the KV bytes are bound through their sha256 and a
snapshot relayed later stays verifiable. The receiver also checks that the key is the holder's
peer id (libp2p authenticates the stream's remote peer id).

Exactness (measured, Qwen 0.5B span [0, 8), 64-row ubatches): a restore is bit-exact when the
restored cells sit where a full prefill would put them; in a KV cache shared by all sequences,
cells shifted by another sequence's differed by up to 0.08 in hidden states (0.5 in logits). Each
sequence now has a KV stream of its own and its cells start at cell 0 of it, restored or not, so a
restored session equals a full prefill whatever other sessions the peer holds.

This module is pure: no I/O.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import msgpack

from swarm.errors import ProtocolError
from swarm.limits import MAX_PREFIX_OFFERS, PREFIX_HASH_BYTES as HASH_BYTES

SNAPSHOT_FORMAT_VERSION = 1
"""Version of the payload layout and header fields below."""
MAGIC = b"SWKV"
MAX_HEADER_BYTES = 16 * 1024
MAX_SIGNATURE_BYTES = 1024
MAX_SNAPSHOT_KV_BYTES = 2 << 30
"""Hard cap on a snapshot's KV bytes; receivers pass their own, smaller bound."""
_U16 = struct.Struct(">H")


class SnapshotRejected(ProtocolError):
    """A snapshot's bytes, key, format or signature is not acceptable; `str()` says why."""


@dataclass(frozen=True)
class SnapshotFormat:
    """What an executor must match to import a snapshot's bytes.

    Attributes:
        version: SNAPSHOT_FORMAT_VERSION of the writer.
        llama_cpp: llama-cpp-python version vendoring the llama.cpp that wrote the state.
        state_version: llama.cpp's LLAMA_STATE_SEQ_VERSION.
        kv_dtype: KV cache element type ("f16").
        flash_attn: flash attention on the writer's executor.
        ubatch_tokens: the writer's prefill ubatch (the exactness grid).
        kv_streams: KV streams of the writer's context (one per sequence: its n_seq_max).
    """

    version: int
    llama_cpp: str
    state_version: int
    kv_dtype: str
    flash_attn: bool
    ubatch_tokens: int
    kv_streams: int = 1

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "llama_cpp": self.llama_cpp,
            "state_version": self.state_version,
            "kv_dtype": self.kv_dtype,
            "flash_attn": self.flash_attn,
            "ubatch_tokens": self.ubatch_tokens,
            "kv_streams": self.kv_streams,
        }


def local_format(flash_attn: bool, ubatch_tokens: int, kv_streams: int = 1) -> SnapshotFormat:
    """The format this process's llama.cpp writes, for an executor of `kv_streams` sequences."""
    import llama_cpp

    return SnapshotFormat(
        SNAPSHOT_FORMAT_VERSION,
        str(llama_cpp.__version__),
        int(getattr(llama_cpp, "LLAMA_STATE_SEQ_VERSION", 0)),
        "f16",
        bool(flash_attn),
        int(ubatch_tokens),
        int(kv_streams),
    )


@dataclass(frozen=True)
class SnapshotKey:
    """Name of one span's KV for one token prefix (without the format, checked separately)."""

    model_id: str
    start: int
    end: int
    prefix_hash: bytes


@dataclass(frozen=True)
class Snapshot:
    """A span's KV for the first `n_tokens` tokens of a prompt.

    Attributes:
        key: model, span and h(n_tokens).
        n_tokens: positions [0, n_tokens) held.
        blocks: (k·B, h(k·B)) pairs the snapshot also serves, ascending, each k·B <= n_tokens.
        format: the writer's format.
        kv: llama.cpp sequence state bytes.
    """

    key: SnapshotKey
    n_tokens: int
    blocks: tuple[tuple[int, bytes], ...]
    format: SnapshotFormat
    kv: bytes

    @property
    def nbytes(self) -> int:
        return len(self.kv)

    def covers(self) -> dict[bytes, int]:
        """Every prefix hash this snapshot can restore to, with its length."""
        return {h: n for n, h in self.blocks}


def _header(snap: Snapshot, holder_public_key: bytes) -> dict:
    return {
        "model_id": snap.key.model_id,
        "start": snap.key.start,
        "end": snap.key.end,
        "prefix_hash": snap.key.prefix_hash,
        "n_tokens": snap.n_tokens,
        "blocks": [[n, h] for n, h in snap.blocks],
        "format": snap.format.to_dict(),
        "kv_bytes": len(snap.kv),
        "kv_sha256": hashlib.sha256(snap.kv).digest(),
        "holder": holder_public_key,
    }


def encode_snapshot(snap: Snapshot, private_key) -> bytes:
    """The signed payload of `snap`.

    Args:
        snap: the snapshot.
        private_key: the holder's hivemind RSAPrivateKey (sign, get_public_key).
    """
    header = msgpack.packb(_header(snap, private_key.get_public_key().to_bytes()), use_bin_type=True)
    signature = private_key.sign(MAGIC + header)
    return b"".join((MAGIC, _U16.pack(len(header)), header, _U16.pack(len(signature)), signature, snap.kv))


def _field(h: dict, name: str, kind: type, lo: int | None = None, hi: int | None = None):
    v = h.get(name)
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise SnapshotRejected(f"header field {name!r} is missing or not {kind.__name__}")
    if lo is not None and not lo <= v <= hi:
        raise SnapshotRejected(f"header field {name!r} = {v} is outside [{lo}, {hi}]")
    return v


def decode_snapshot(
    payload: bytes, expect: SnapshotKey, fmt: SnapshotFormat, holder_peer_id: str, max_kv_bytes: int
) -> Snapshot:
    """Check a received payload completely and return its snapshot.

    Args:
        payload: the bytes from the holder.
        expect: the key asked for: model and span must match, and the snapshot must be named by or
            index `expect.prefix_hash`.
        fmt: this peer's format; every field must match.
        holder_peer_id: the stream's authenticated remote peer id; the signing key must be its key.
        max_kv_bytes: refuse larger KV.
    Raises:
        SnapshotRejected: truncated or oversized, bad magic, malformed header, key or format
            mismatch, KV length or sha256 mismatch, or a bad signature; the message says which.
    """
    from hivemind.utils.crypto import RSAPublicKey

    from swarm.peerid import peer_id_of_public_key

    view = memoryview(payload)
    if len(view) < len(MAGIC) + 2 or bytes(view[:4]) != MAGIC:
        raise SnapshotRejected("not a snapshot payload (bad magic or too short)")
    (hlen,) = _U16.unpack_from(view, 4)
    if hlen > MAX_HEADER_BYTES or 6 + hlen + 2 > len(view):
        raise SnapshotRejected(f"header length {hlen} is over the bound or past the end (truncated?)")
    header_bytes = bytes(view[6 : 6 + hlen])
    (slen,) = _U16.unpack_from(view, 6 + hlen)
    sig_at = 8 + hlen
    if slen > MAX_SIGNATURE_BYTES or sig_at + slen > len(view):
        raise SnapshotRejected(f"signature length {slen} is over the bound or past the end (truncated?)")
    signature = bytes(view[sig_at : sig_at + slen])
    kv = view[sig_at + slen :]
    try:
        h = msgpack.unpackb(header_bytes, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises many types
        raise SnapshotRejected(f"malformed header: {type(e).__name__}") from None
    if not isinstance(h, dict):
        raise SnapshotRejected("header is not a map")
    got_fmt = _field(h, "format", dict)
    want_fmt = fmt.to_dict()
    if got_fmt != want_fmt:
        diff = sorted(k for k in set(want_fmt) | set(got_fmt) if got_fmt.get(k) != want_fmt.get(k))
        raise SnapshotRejected(
            "format mismatch: "
            + ", ".join(f"{k} {got_fmt.get(k)!r} != ours {want_fmt.get(k)!r}" for k in diff)
        )
    got_key = SnapshotKey(
        _field(h, "model_id", str),
        _field(h, "start", int, 0, 1 << 20),
        _field(h, "end", int, 0, 1 << 20),
        _field(h, "prefix_hash", bytes),
    )
    if (got_key.model_id, got_key.start, got_key.end) != (expect.model_id, expect.start, expect.end):
        raise SnapshotRejected(
            f"key mismatch: got {got_key.model_id[:12]} [{got_key.start}, {got_key.end}) "
            f"{got_key.prefix_hash.hex()[:12]}, asked {expect.model_id[:12]} [{expect.start}, {expect.end}) "
            f"{expect.prefix_hash.hex()[:12]}"
        )
    n_tokens = _field(h, "n_tokens", int, 1, 1 << 24)
    blocks_raw = _field(h, "blocks", list)
    if len(blocks_raw) > MAX_PREFIX_OFFERS:
        raise SnapshotRejected(f"{len(blocks_raw)} blocks, over {MAX_PREFIX_OFFERS}")
    blocks: list[tuple[int, bytes]] = []
    for b in blocks_raw:
        if (
            not isinstance(b, list)
            or len(b) != 2
            or not isinstance(b[0], int)
            or not isinstance(b[1], bytes)
            or len(b[1]) != HASH_BYTES
            or not 0 < b[0] <= n_tokens
            or (blocks and b[0] <= blocks[-1][0])
        ):
            raise SnapshotRejected("malformed block index")
        blocks.append((b[0], b[1]))
    if expect.prefix_hash != got_key.prefix_hash and expect.prefix_hash not in {bh for _, bh in blocks}:
        raise SnapshotRejected(f"snapshot does not cover the asked prefix {expect.prefix_hash.hex()[:12]}")
    kv_bytes = _field(h, "kv_bytes", int, 1, min(max_kv_bytes, MAX_SNAPSHOT_KV_BYTES))
    if kv_bytes != len(kv):
        raise SnapshotRejected(f"KV is {len(kv)} B, header says {kv_bytes} B (truncated?)")
    if hashlib.sha256(kv).digest() != _field(h, "kv_sha256", bytes):
        raise SnapshotRejected("KV bytes do not match kv_sha256 (corrupted)")
    holder = _field(h, "holder", bytes)
    try:
        public_key = RSAPublicKey.from_bytes(holder)
        ok = public_key.verify(MAGIC + header_bytes, signature)
        owner = peer_id_of_public_key(public_key)
    except Exception as e:  # malformed key bytes: cryptography raises ValueError and others
        raise SnapshotRejected(f"bad holder key: {type(e).__name__}") from None
    if not ok:
        raise SnapshotRejected("bad signature")
    if owner != holder_peer_id:
        raise SnapshotRejected(f"signed by {owner[:12]}…, not by the holder {holder_peer_id[:12]}…")
    return Snapshot(got_key, n_tokens, tuple(blocks), fmt, bytes(kv))
