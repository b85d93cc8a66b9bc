"""Property-based fuzzing of every parser that takes bytes (or decoded values) from outside.

Targets: stream frames (swarm.wire), DHT announcement records and the DHT record validator
(swarm.dht), relay offers, relay hello messages and relay addresses (swarm.relay.records), seeder and manifest records and their zstd parts (swarm.artifacts), torrents,
manifests (Manifest.from_bytes), GGUF headers as `swarm serve --model PATH` reads them (the
header scanner and the manifest builder), multiaddrs and hosts, and sampling parameters. Each must
decode to a valid object or raise the project's own error type: never another exception, and never
allocate more than its stated bound (checked with tracemalloc: a few times the input plus a
constant). A hang fails the run through pytest-timeout; no timing threshold is asserted.

Each target runs a bounded number of derandomized examples here (the module takes ~10 s on 2
cores); `scripts/fuzz.py --examples N` runs the same targets longer with fresh randomness. An input
that once crashed a parser stays as an explicit `example` of its target.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import os
import shutil
import struct
import tempfile
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libtorrent as lt
import msgpack
import numpy as np
import zstandard
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from hivemind.utils.crypto import RSAPrivateKey

from swarm.dht.prefix_records import decode_holdings, encode_holdings
from swarm.kv.prefix import PREFIX_BLOCK_TOKENS, prefix_offers
from swarm.kv.snapshot import Snapshot, SnapshotFormat, SnapshotKey, decode_snapshot, encode_snapshot
from swarm.artifacts.distribute import join_manifest
from swarm.artifacts.records import (
    MAX_MANIFEST_RECORD_BYTES,
    SeederRecord,
    decode_manifest,
    decode_seeder,
    encode_manifest,
    encode_seeder,
)
from swarm.artifacts.torrent import make_torrent, parse_torrent, torrent_from_info
from swarm.dht.records import Announcement, decode_announcement, encode_announcement
from swarm.relay.records import RelayOffer, decode_message, decode_offer, encode_message, encode_offer, parse_relay_addr
from swarm.dht.validation import SwarmRecordValidator, check_announcement
from swarm.errors import AddressError, ArtifactError, ModelError, ProtocolError, RequestError
from swarm.ggml_bridge.gguf_header import scan
from swarm.manifest import Manifest, TensorInfo, check_manifest, read_manifest
from swarm.netaddr import maddr_host_port, parse_host
from swarm.p2p import _parse_maddr
from swarm.peerid import peer_id_of_public_key
from swarm.sampling import SamplingParams, sample
from swarm.wire import (
    _FIELDS,
    PROTOCOL_GENERATION,
    Close,
    Error,
    ErrorCode,
    Forward,
    Hidden,
    Open,
    OpenOk,
    Token,
    Truncate,
    decode_frame,
    encode_frame,
)

logging.getLogger("hivemind.utils.serializer").setLevel(logging.ERROR)  # "Unknown ExtType" per example

SUITE_EXAMPLES = 300
"""Examples per target in the suite; scripts/fuzz.py takes --examples."""
_TMP = Path(tempfile.mkdtemp(prefix="swarm-fuzz-"))
atexit.register(shutil.rmtree, _TMP, True)


@dataclass(frozen=True)
class Target:
    """One parser under fuzz.

    Attributes:
        name: short name (`scripts/fuzz.py --target NAME`).
        strategy: hypothesis strategy of inputs.
        check: asserts the parser's contract for one input (raises AssertionError otherwise).
        examples: inputs that once broke the contract, replayed on every run.
    """

    name: str
    strategy: st.SearchStrategy
    check: Callable[[Any], None]
    examples: tuple = ()


def build_test(target: Target, max_examples: int, derandomize: bool) -> Callable[[], None]:
    """A runnable hypothesis test of `target` (used by this module and by scripts/fuzz.py)."""

    def run(value):
        target.check(value)

    test = given(target.strategy)(run)
    for ex in target.examples:
        test = example(ex)(test)
    return settings(
        max_examples=max_examples,
        derandomize=derandomize,
        deadline=None,  # no timing thresholds: a hang is caught by pytest-timeout / the script's caller
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )(test)


def _bounded(fn: Callable[[], Any], limit_bytes: int) -> Any:
    """Run fn() and check its peak Python/numpy allocation stays under limit_bytes.

    The parsers are pure, so fn runs once unmeasured first (the first use of a code path may import
    a module or fill a cache: cryptography's key loaders do), then up to twice measured: tracemalloc
    counts every thread and the garbage collector, so one noisy run does not fail the input, but an
    input that makes the parser allocate past the bound does so every time.
    """
    try:
        fn()
    except Exception:  # noqa: BLE001 - the measured runs below raise it again
        pass
    for _ in range(2):
        tracemalloc.start()
        try:
            result, error = fn(), None
        except Exception as e:  # noqa: BLE001 - re-raised below, after the bound is checked
            result, error = None, e
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        if peak <= limit_bytes:
            break
    assert peak <= limit_bytes, f"peak allocation {peak} B over the bound {limit_bytes} B"
    if error is not None:
        raise error
    return result


def _outcome(fn: Callable[[], Any], allowed: type[Exception] | tuple, limit_bytes: int) -> Any:
    """fn()'s result, or None when it raised one of `allowed` (anything else fails the test)."""
    try:
        result = _bounded(fn, limit_bytes)
    except allowed as e:
        event(
            f"refused: {type(e).__name__} {str(e).rsplit('.gguf', 1)[-1][:40]}"
        )  # --hypothesis-show-statistics
        return None
    event("accepted")
    return result


MiB = 1 << 20

# ---- generic values ---------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(),
    st.text(max_size=24),
    st.binary(max_size=24),
)
msgpack_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=16),
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=10,
)


@st.composite
def mutated(draw, bases: list[bytes], max_ops: int = 6) -> bytes:
    """One of `bases` with a few byte flips, deletions, insertions or a truncation."""
    body = bytearray(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.integers(0, 3))
        pos = draw(st.integers(0, max(0, len(body) - 1)))
        if op == 0 and body:
            body[pos] = draw(st.integers(0, 255))
        elif op == 1:
            del body[pos : pos + draw(st.integers(1, 16))]
        elif op == 2:
            body[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:
            del body[pos:]
    return bytes(body)


# ---- swarm.wire frames ------------------------------------------------------------------------------

_H = (np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 7).astype(np.float32)
_VALID_FRAMES = [
    encode_frame(f)
    for f in (
        Open(bytes(16), "12D3KooWclient", "ab" * 32, 0, 10, 64, SamplingParams(0.7, 0.9, 40, 2**63, 3)),
        OpenOk(reserved_tokens=64),
        Error(ErrorCode.BUSY, "no free session slot"),
        Forward(step=3, pos0=5, hidden=_H, want_logits=True, all_logits=False),
        Hidden(step=3, hidden=_H[:1].astype(np.float16), compute_ms=1.5),
        Token(step=3, token=7, logprob=-0.5, top=((7, -0.5), (1, -2.0)), compute_ms=0.25, logits=_H[:2]),
        Truncate(pos=4),
        Close(),
    )
]


def _frame_bodies_from_header():
    kinds = {kind: sorted(fields) for kind, fields in _FIELDS.items()}  # the real field sets
    plausible = st.one_of(
        msgpack_values,
        st.sampled_from(["f32", "f16", "busy", "ab" * 32, bytes(16), [1, 16], [2, 8], [[1, -0.5]]]),
        st.builds(
            dict,
            temperature=st.floats(),
            top_p=st.floats(),
            top_k=st.integers(-5, 2**40),
            seed=st.integers(-1, 2**64 - 1),
            n_top_logprobs=st.integers(-1, 30),
        ),
        st.integers(0, 100),
    )

    @st.composite
    def body(draw) -> bytes:
        kind = draw(st.sampled_from(sorted(kinds)))
        header = {"k": kind}
        for name in kinds[kind]:
            if draw(st.integers(0, 9)):  # mostly present
                header[name] = draw(plausible)
        if draw(st.booleans()):
            header[draw(st.text(max_size=8))] = draw(msgpack_values)
        packed = msgpack.packb(header, use_bin_type=True)
        shape = header.get("shape")
        if (
            isinstance(shape, list)
            and len(shape) == 2
            and all(isinstance(v, int) and 0 <= v < 64 for v in shape)
        ):
            payload = bytes(shape[0] * shape[1] * draw(st.sampled_from([2, 4])))
        else:
            payload = draw(st.binary(max_size=64))
        prefix = struct.pack(
            ">BH", draw(st.sampled_from([PROTOCOL_GENERATION] * 5 + [0, 2])), len(packed) % 65536
        )
        return prefix + packed + payload

    return body()


def check_frame(data: bytes) -> None:
    frame = _outcome(lambda: decode_frame(data), ProtocolError, 2 * len(data) + MiB)
    if frame is not None:  # whatever decodes re-encodes to a canonical body that decodes the same
        again = encode_frame(frame)
        assert encode_frame(decode_frame(again)) == again


WIRE = Target(
    "wire",
    st.one_of(st.binary(max_size=256), mutated(_VALID_FRAMES), _frame_bodies_from_header()),
    check_frame,
    examples=(b"", b"\x01\xff\xff", b"\x01\x00\x01\xc1", b"\x01\x00\x03\x81\xa1k\xc0"),
)

# ---- DHT announcement records and the record validator ----------------------------------------------

_ANN = Announcement(
    peer_id="QmTHEZ7jif1CF3N29tAbR4eW4NvG4qAnHvchyyacfMeRj2",
    addrs=("/ip6/::1/tcp/34445/p2p/QmTHEZ7jif1CF3N29tAbR4eW4NvG4qAnHvchyyacfMeRj2",),
    model_id="ab" * 32,
    start=0,
    end=10,
    decode_steps_per_s=100.0,
    prefill_tokens_per_s=1000.0,
    free_cache_tokens=4096,
    max_sessions=8,
    sessions_free=8,
    version="0.1.0",
    protocol=1,
    public_name=None,
    expires_at=1e9,
    started_at=1.0,
)
_ANN_RECORD = encode_announcement(_ANN)


@st.composite
def announcement_records(draw) -> Any:
    record = dict(_ANN_RECORD)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(sorted(record) + ["extra"]))
        if draw(st.integers(0, 5)) == 0:
            record.pop(key, None)
        else:
            record[key] = draw(msgpack_values)
    return record


def check_announcement_record(record: Any) -> None:
    ann = _bounded(lambda: decode_announcement(record), MiB)  # None = dropped; never raises
    assert ann is None or isinstance(ann, Announcement)
    if ann is not None:
        assert decode_announcement(encode_announcement(ann)) == ann


ANNOUNCEMENT = Target(
    "announcement",
    st.one_of(msgpack_values, announcement_records()),
    check_announcement_record,
    examples=({**_ANN_RECORD, "addrs": ["x"] * 17}, {**_ANN_RECORD, "start": True}),
)

_OWNER = b"[owner:ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC]"


@st.composite
def dht_records(draw) -> DHTRecord:
    tag = draw(st.sampled_from([b"span", b"blob:name", b"span[owner:", b"other"]))
    owner = draw(st.sampled_from([_OWNER, b"[owner:ssh-ed25519 AAAA]", b"[owner:x]", b"", _OWNER * 2]))
    subkey = draw(st.one_of(st.just(tag + owner), st.binary(max_size=40)))
    raw_subkey = draw(st.one_of(st.just(MSGPackSerializer.dumps(subkey)), st.binary(max_size=40)))
    value = draw(st.one_of(msgpack_values, announcement_records()))
    raw_value = draw(st.one_of(st.just(MSGPackSerializer.dumps(value)), st.binary(max_size=40)))
    return DHTRecord(key=b"k", subkey=raw_subkey, value=raw_value, expiration_time=1e9)


def check_dht_record(record: DHTRecord) -> None:
    ok = _bounded(lambda: SwarmRecordValidator().validate(record), MiB)
    assert isinstance(ok, bool)
    subkey = _outcome(lambda: MSGPackSerializer.loads(record.subkey), Exception, MiB)
    value = _outcome(lambda: MSGPackSerializer.loads(record.value), Exception, MiB)
    assert check_announcement(subkey, value) is None or ok


DHT_RECORD = Target(
    "dht_record",
    dht_records(),
    check_dht_record,
    examples=(
        DHTRecord(
            b"k", MSGPackSerializer.dumps(b"span[owner:ssh-foo AAAA]"), MSGPackSerializer.dumps({}), 1e9
        ),
        DHTRecord(b"k", MSGPackSerializer.dumps(b"span[owner:ssh-dss AAAAB3NzaC1kc3M=]"), b"\xc0", 1e9),
    ),
)

# ---- manifests ---------------------------------------------------------------------------------------

_DIGEST = "cd" * 32
_MANIFEST = Manifest(
    arch="llama",
    n_layers=2,
    n_embd=8,
    n_vocab=3,
    hparams={"llama.context_length": 64, "general.alignment": 32, "llama.rope.freq_base": 10000.0},
    tokenizer_sha256=_DIGEST,
    header_sha256=_DIGEST,
    file_size=1024,
    data_offset=512,
    tensors=(
        TensorInfo("token_embd.weight", 0, (8, 3), 512, 96, _DIGEST, None),
        TensorInfo("blk.0.attn_q.weight", 0, (8, 8), 608, 256, _DIGEST, 0),
        TensorInfo("blk.1.attn_q.weight", 1, (8, 8), 864, 128, _DIGEST, 1),
        TensorInfo("output_norm.weight", 0, (8,), 992, 32, _DIGEST, None),
    ),
)
_MANIFEST_BYTES = _MANIFEST.to_bytes()
_MANIFEST_BODY = json.loads(_MANIFEST_BYTES)


@st.composite
def manifest_docs(draw) -> bytes:
    """Canonical JSON of a manifest with a few fields replaced: reaches the type and bound checks."""
    body = json.loads(_MANIFEST_BYTES)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "tensor", "hparam"]))
        if where == "top":
            body[draw(st.sampled_from(sorted(body) + ["extra"]))] = draw(json_values)
        elif where == "tensor" and isinstance(body.get("tensors"), list) and body["tensors"]:
            t = body["tensors"][draw(st.integers(0, len(body["tensors"]) - 1))]
            if isinstance(t, dict):
                t[draw(st.sampled_from(sorted(t) + ["extra"]))] = draw(json_values)
        elif isinstance(body.get("hparams"), dict):
            body["hparams"][draw(st.sampled_from(["llama.context_length", "x"]))] = draw(json_values)
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def check_manifest_bytes(data: bytes) -> None:
    m = _outcome(lambda: Manifest.from_bytes(data), ProtocolError, 64 * len(data) + MiB)
    if m is not None:
        check_manifest(m)
        assert m.to_bytes() == data


MANIFEST = Target(
    "manifest",
    st.one_of(st.binary(max_size=256), mutated([_MANIFEST_BYTES]), manifest_docs()),
    check_manifest_bytes,
    examples=(
        b"[" * 100_000,  # RecursionError escaped json.loads
        _MANIFEST_BYTES.replace(
            b'"llama.rope.freq_base":10000.0', b'"llama.rope.freq_base":NaN'
        ),  # to_bytes ValueError
        _MANIFEST_BYTES.replace(b'"n_layers":2', b'"n_layers":true'),  # a bool passed as an int
        _MANIFEST_BYTES.replace(b'"n_layers":2', b'"n_layers":1000000000000'),  # budget allocated n_layers
        _MANIFEST_BYTES.replace(b'"llama.context_length":64', b'"llama.context_length":"64"'),
    ),
)

# ---- artifact records: seeder, manifest record, zstd parts, torrents ---------------------------------

_MODEL_ID = hashlib.sha256(_MANIFEST_BYTES).hexdigest()


def _tiny_torrent() -> bytes:
    """The real (hybrid v1+v2) torrent of a file as large as _MANIFEST says."""
    path = _TMP / "model.gguf"
    path.write_bytes(bytes(_MANIFEST.file_size))
    return make_torrent(path, _MANIFEST).data


_TORRENT = _tiny_torrent()
_INFOHASH = str(lt.torrent_info(_TORRENT).info_hashes().v1)
_SEEDERS = [
    encode_seeder(SeederRecord(_INFOHASH, "192.0.2.2", 6881, more=(("::1", 6882),))),
    encode_seeder(SeederRecord(_INFOHASH, "127.0.0.1", 6881, torrent=_TORRENT)),
]


@st.composite
def seeder_maps(draw) -> bytes:
    body = msgpack.unpackb(draw(st.sampled_from(_SEEDERS)), raw=False)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(["v", "infohash", "host", "port", "more", "torrent", "extra"]))
        body[key] = draw(
            st.one_of(
                msgpack_values,
                st.sampled_from(["0.0.0.0", "::", "fe80::1%eth0", "ff02::1", "::1", "1.2.3.4", _INFOHASH]),
                st.lists(
                    st.lists(st.one_of(st.text(max_size=8), st.integers(-1, 70000)), max_size=3), max_size=20
                ),
            )
        )
    return msgpack.packb(body, use_bin_type=True)


def check_seeder(data: bytes) -> None:
    rec = _outcome(lambda: decode_seeder(data, _MODEL_ID), ProtocolError, 16 * len(data) + MiB)
    if rec is not None:
        assert decode_seeder(encode_seeder(rec), _MODEL_ID) == rec


SEEDER = Target(
    "seeder",
    st.one_of(st.binary(max_size=128), mutated(_SEEDERS), seeder_maps()),
    check_seeder,
    examples=(msgpack.packb({"v": 1, "infohash": _INFOHASH, "host": "0.0.0.0", "port": 6881}),),
)


@st.composite
def manifest_records(draw) -> bytes:
    raw = draw(st.one_of(st.just(_MANIFEST_BYTES), mutated([_MANIFEST_BYTES]), manifest_docs()))
    return msgpack.packb({"v": draw(st.sampled_from([1, 1, 2, "1"])), "manifest": raw}, use_bin_type=True)


def check_manifest_record(data: bytes) -> None:
    # The model_id of the inner bytes, so that parsing gets past the hash check.
    try:
        inner = msgpack.unpackb(data, raw=False)["manifest"]
        model_id = hashlib.sha256(inner).hexdigest()
    except Exception:  # noqa: BLE001 - only choosing the id here
        model_id = _MODEL_ID
    m = _outcome(lambda: decode_manifest(data, model_id), ProtocolError, 64 * len(data) + MiB)
    assert m is None or m.model_id == model_id


MANIFEST_RECORD = Target(
    "manifest_record",
    st.one_of(st.binary(max_size=128), manifest_records(), mutated([encode_manifest(_MANIFEST)])),
    check_manifest_record,
)


def check_manifest_parts(parts: list[bytes]) -> None:
    m = _outcome(lambda: join_manifest(parts, _MODEL_ID), ProtocolError, MAX_MANIFEST_RECORD_BYTES + 4 * MiB)
    assert m is None or m.model_id == _MODEL_ID


_PACKED = zstandard.ZstdCompressor().compress(encode_manifest(_MANIFEST))
_BOMBS = [  # 64 MiB of zeros in a few KB, with and without the content size in the frame header
    zstandard.ZstdCompressor(write_content_size=w).compress(bytes(64 << 20)) for w in (True, False)
]
MANIFEST_PARTS = Target(
    "manifest_parts",
    st.one_of(
        st.lists(st.binary(max_size=64), max_size=4),
        st.lists(mutated([_PACKED]), min_size=1, max_size=2),
        st.builds(lambda n: [_PACKED[:n], _PACKED[n:]], st.integers(0, len(_PACKED))),
    ),
    check_manifest_parts,
    examples=([_BOMBS[0]], [_BOMBS[1]]),  # the first allocated all 64 MiB its header declared
)


def check_torrent(data: bytes) -> None:
    t = _outcome(lambda: parse_torrent(data), ArtifactError, 64 * len(data) + MiB)
    assert t is None or t.name == _MODEL_ID or len(t.name) == 64
    _outcome(lambda: torrent_from_info(data, _MANIFEST), ArtifactError, 64 * len(data) + MiB)


TORRENT = Target(
    "torrent",
    st.one_of(st.binary(max_size=128), mutated([_TORRENT], max_ops=4)),
    check_torrent,
)

# ---- GGUF headers (`swarm serve --model PATH`) -------------------------------------------------------

_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_RANGES = {
    0: (0, 255),
    1: (-128, 127),
    2: (0, 2**16 - 1),
    3: (-(2**15), 2**15 - 1),
    4: (0, 2**32 - 1),
    5: (-(2**31), 2**31 - 1),
    7: (0, 1),
    10: (0, 2**64 - 1),
    11: (-(2**63), 2**63 - 1),
}


def _gstr(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def _gval(vtype: int, value: Any) -> bytes:
    if vtype == 8:
        return _gstr(value)
    if vtype == 9:
        sub, items = value
        return struct.pack("<IQ", sub, len(items)) + b"".join(_gval(sub, v) for v in items)
    return struct.pack(_FMT[vtype], value)


_KVS = [
    ("general.architecture", 8, "llama"),
    ("general.alignment", 4, 32),
    ("llama.block_count", 4, 2),
    ("llama.embedding_length", 4, 8),
    ("llama.attention.head_count", 4, 2),
    ("llama.context_length", 4, 64),
    ("tokenizer.ggml.tokens", 9, (8, ["a", "b", "c"])),
]
_TENSORS = [  # name, dims, ggml type (0 = f32), offset from the data start
    ("token_embd.weight", (8, 3), 0, 0),
    ("blk.0.attn_q.weight", (8, 8), 0, 96),
    ("blk.1.attn_q.weight", (8, 8), 0, 352),
    ("output_norm.weight", (8,), 0, 608),
]
_DATA_BYTES = 640


def gguf_bytes(kvs=_KVS, tensors=_TENSORS, *, version=3, n_kv=None, n_tensors=None, tail=None) -> bytes:
    """A GGUF file from a description; counts may lie (n_kv, n_tensors), the data may be cut (tail)."""
    out = b"GGUF" + struct.pack(  # magic, version, tensor count, key count
        "<IQQ", version, len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    for key, vtype, value in kvs:
        out += (
            _gstr(key)
            + struct.pack("<I", vtype)
            + (value if isinstance(value, bytes) else _gval(vtype, value))
        )
    for name, dims, ggml_type, offset in tensors:
        out += _gstr(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", ggml_type, offset)
    out += bytes(-len(out) % 32)
    return out + (bytes(_DATA_BYTES) if tail is None else tail)


_GGUF = gguf_bytes()


@st.composite
def gguf_files(draw) -> bytes:
    kvs, tensors = list(_KVS), list(_TENSORS)
    counts: dict[str, int] = {}
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["kv", "kv_raw", "tensor", "count", "version"]))
        if what == "kv":
            i = draw(st.integers(0, len(kvs) - 1))
            vtype = draw(st.sampled_from(sorted(_FMT) + [8]))
            if vtype == 8:
                value = draw(st.text(max_size=8))
            elif vtype in (6, 12):
                value = draw(st.floats(width=32 if vtype == 6 else 64))
            else:
                lo, hi = _RANGES[vtype]
                value = draw(st.integers(lo, hi))
            kvs[i] = (kvs[i][0], vtype, value)
        elif what == "kv_raw":  # any type id, any bytes (arrays with lying lengths, bad UTF-8, ...)
            key = draw(st.sampled_from([k for k, _, _ in _KVS] + ["x"]))
            kvs.append((key, draw(st.integers(0, 14)), draw(st.binary(max_size=24))))
        elif what == "tensor":
            i = draw(st.integers(0, len(tensors) - 1))
            name, dims, ggml_type, offset = tensors[i]
            tensors[i] = (
                draw(st.sampled_from([name, "blk.7.x", "blk.0.attn_q.weight", "", "blk.-1.y"])),
                tuple(draw(st.lists(st.integers(0, 2**40), max_size=6))) if draw(st.booleans()) else dims,
                draw(st.sampled_from([ggml_type, 1, 2, 12, 39, 1000])),
                draw(st.sampled_from([offset, 1, 2**40, 640])),
            )
        elif what == "count":
            counts[draw(st.sampled_from(["n_kv", "n_tensors"]))] = draw(
                st.sampled_from([0, 1, 5, 9, 2**20, 2**63])
            )
        else:
            counts["version"] = draw(st.sampled_from([1, 2, 4]))
    body = gguf_bytes(kvs, tensors, **counts)
    if draw(st.integers(0, 4)) == 0:
        body = body[: draw(st.integers(4, len(body)))]
    return body


def _gguf_path(data: bytes) -> Path:
    path = _TMP / f"{os.getpid()}.gguf"
    path.write_bytes(data)
    return path


def check_gguf(data: bytes) -> None:
    path = _gguf_path(data)
    header = _outcome(lambda: scan(path), ModelError, 64 * len(data) + MiB)
    m = _outcome(lambda: read_manifest(path), ModelError, 256 * len(data) + 4 * MiB)
    if m is not None:
        check_manifest(m)
        assert header is not None  # whatever builds a manifest passed the bounded scanner first
        assert Manifest.from_bytes(m.to_bytes(), m.model_id) == m


GGUF = Target(
    "gguf",
    st.one_of(gguf_files(), mutated([_GGUF]), st.binary(max_size=64).map(lambda b: b"GGUF" + b)),
    check_gguf,
    examples=(
        gguf_bytes([*_KVS[:1], ("general.alignment", 4, 0), *_KVS[2:]]),  # ZeroDivisionError in the scanner
        gguf_bytes(
            [("general.architecture", 8, _gstr(b"ll\xe9ma")), *_KVS[1:]]
        ),  # UnicodeDecodeError in gguf
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + _gstr("t")
        + struct.pack("<I", 2**31)
        + bytes(16),  # n_dims 2**31
        b"GGUF"
        + struct.pack("<IQQ", 3, 1, 0)
        + _gstr("general.alignment")
        + struct.pack("<IQ", 10, 2**64 - 1),
        gguf_bytes([*_KVS[:2], ("llama.block_count", 8, "2"), *_KVS[3:]]),  # block_count as a string
        gguf_bytes([*_KVS[:2], ("llama.block_count", 10, 2**40), *_KVS[3:]]),  # 2**40 layers
        gguf_bytes([*_KVS, ("x", 9, struct.pack("<IQ", 8, 2**62))]),  # a string array of 2**62 items
        gguf_bytes([*_KVS, ("x", 9, struct.pack("<IQ", 9, 3))]),  # an array of arrays
    ),
)

# ---- addresses ----------------------------------------------------------------------------------------

_maddr_text = st.one_of(
    st.text(max_size=60),
    st.builds(
        "/{}/{}/{}/{}{}".format,
        st.sampled_from(["ip4", "ip6", "dns", "x"]),
        st.sampled_from(["127.0.0.1", "::1", "0.0.0.0", "1.2.3.4", "fe80::1%lo", "::ffff:1.2.3.4", "", "a"]),
        st.sampled_from(["tcp", "udp", ""]),
        st.one_of(st.integers(-1, 70000).map(str), st.text(max_size=5)),
        st.sampled_from(["", "/p2p/QmTHEZ7jif1CF3N29tAbR4eW4NvG4qAnHvchyyacfMeRj2", "/p2p/x"]),
    ),
)


def check_address(text: str) -> None:
    hp = maddr_host_port(text)
    assert hp is None or (isinstance(hp[0], str) and 1 <= hp[1] <= 65535)
    _outcome(lambda: _parse_maddr(text), ProtocolError, MiB)
    ip = _outcome(lambda: parse_host(text), AddressError, MiB)
    assert ip is None or str(parse_host(str(ip))) == str(ip)


ADDRESS = Target("address", _maddr_text, check_address, examples=("/ip6/::1/tcp/0", "[::1]", "::1:0"))

# ---- sampling parameters (they travel in the Open frame to the last peer) ------------------------------

_LOGITS = np.array([2.0, 1.0, 0.0, -1.0, -np.inf, 2.0 - 1e-6], dtype=np.float32)


@st.composite
def sampling_cases(draw) -> tuple[dict, np.ndarray]:
    kw = {
        "temperature": draw(st.one_of(st.floats(), st.floats(0, 1e-290), st.sampled_from([1e-310, 5e-324]))),
        "top_p": draw(st.one_of(st.floats(), st.floats(0, 1))),
        "top_k": draw(st.one_of(st.integers(-2, 10), st.integers(-(2**70), 2**70))),
        "seed": draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(-(2**70), 2**70))),
    }
    logits = draw(
        st.lists(st.floats(-1e30, 1e30) | st.just(-math.inf), min_size=1, max_size=64).map(
            lambda v: np.array(v, dtype=np.float32)
        )
        | st.just(_LOGITS)
    )
    return kw, logits


def check_sampling(case: tuple[dict, np.ndarray]) -> None:
    kw, logits = case
    params = _outcome(lambda: SamplingParams(**kw), RequestError, MiB)
    if params is None:
        return
    r = _outcome(lambda: sample(logits, params, position=3), RequestError, 64 * logits.nbytes + MiB)
    if r is None:
        assert np.isneginf(logits).all()  # the only logits a valid request may not sample
        return
    assert 0 <= r.token < logits.size and np.isfinite(logits[r.token])  # never a masked or NaN draw
    with np.errstate(over="ignore", under="ignore"):
        weights = np.exp((logits.astype(np.float64) - logits.max()) / (params.temperature or 1.0))
    if params.greedy or weights.sum() == 1.0:
        assert logits[r.token] == logits.max()  # greedy, or so cold that only the maximum carries weight


SAMPLING = Target(
    "sampling",
    sampling_cases(),
    check_sampling,
    examples=(({"temperature": 1e-310, "top_p": 1.0, "top_k": 0, "seed": 0}, _LOGITS),),
)

# ---- prefix KV snapshots: payloads from a holder, holdings records from the DHT ----------------------

_SNAP_KEY = RSAPrivateKey()
_SNAP_HOLDER = peer_id_of_public_key(_SNAP_KEY.get_public_key())
_SNAP_FMT = SnapshotFormat(1, "0.3.36", 3, "f16", True, PREFIX_BLOCK_TOKENS)
_SNAP_OFFERS = prefix_offers(list(range(300)))
_SNAP = Snapshot(
    SnapshotKey("ab" * 32, 8, 16, _SNAP_OFFERS[-1][1]),
    300,
    _SNAP_OFFERS[:-1],
    _SNAP_FMT,
    bytes(range(256)) * 8,
)
_SNAP_BYTES = encode_snapshot(_SNAP, _SNAP_KEY)


def check_snapshot(data: bytes) -> None:
    got = _outcome(
        lambda: decode_snapshot(data, _SNAP.key, _SNAP_FMT, _SNAP_HOLDER, 1 << 20),
        ProtocolError,
        64 * len(data) + MiB,
    )
    assert got is None or got.kv == _SNAP.kv  # a signed payload cannot be altered and still accepted


SNAPSHOT = Target(
    "snapshot",
    st.one_of(st.binary(max_size=256), mutated([_SNAP_BYTES], max_ops=3)),
    check_snapshot,
    examples=(_SNAP_BYTES[:-1], _SNAP_BYTES[:6]),
)

_HOLDINGS = encode_holdings(["/ip4/127.0.0.1/tcp/1"], [(n, h) for n, h in _SNAP_OFFERS])


def check_holdings(data: bytes) -> None:
    got = _outcome(lambda: decode_holdings("QmHolder", data), (), 64 * len(data) + MiB)
    assert got is None or (got.peer_id == "QmHolder" and all(len(h) == 32 for _, h in got.held))


HOLDINGS = Target("holdings", st.one_of(st.binary(max_size=256), mutated([_HOLDINGS])), check_holdings)

_RELAY_OFFER = encode_offer(RelayOffer("QmRelay", ("/ip4/10.77.0.10/tcp/41000",), 64, 60, 32, 1 << 24))
_RELAY_MESSAGES = [encode_message("connect", peer="QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"),
                   encode_message("dial", token=bytes(16)), encode_message("refused", why="BUSY")]


def check_relay(data: bytes) -> None:
    """A relay's offer (DHT blob), its hello messages, and a relay address from an announcement."""
    offer = _outcome(lambda: decode_offer("QmRelay", data), (), 64 * len(data) + MiB)
    assert offer is None or (offer.peer_id == "QmRelay" and 0 <= offer.free_peers <= offer.max_peers)
    message = _outcome(lambda: decode_message(data), ProtocolError, 64 * len(data) + MiB)
    assert message is None or isinstance(message["op"], str)
    text = data.decode("utf-8", "replace")
    parsed = _outcome(lambda: parse_relay_addr(text), (), MiB)
    assert parsed is None or 0 < parsed[1] <= 65535


RELAY = Target("relay", st.one_of(st.binary(max_size=256), mutated([_RELAY_OFFER, *_RELAY_MESSAGES])), check_relay)

TARGETS = (
    WIRE,
    ANNOUNCEMENT,
    DHT_RECORD,
    MANIFEST,
    SEEDER,
    MANIFEST_RECORD,
    MANIFEST_PARTS,
    TORRENT,
    GGUF,
    ADDRESS,
    SAMPLING,
    SNAPSHOT,
    HOLDINGS,
    RELAY,
)

test_fuzz_wire = build_test(WIRE, SUITE_EXAMPLES, derandomize=True)
test_fuzz_announcement = build_test(ANNOUNCEMENT, SUITE_EXAMPLES, derandomize=True)
test_fuzz_dht_record = build_test(DHT_RECORD, SUITE_EXAMPLES, derandomize=True)
test_fuzz_manifest = build_test(MANIFEST, SUITE_EXAMPLES, derandomize=True)
test_fuzz_seeder = build_test(SEEDER, SUITE_EXAMPLES, derandomize=True)
test_fuzz_manifest_record = build_test(MANIFEST_RECORD, SUITE_EXAMPLES, derandomize=True)
test_fuzz_manifest_parts = build_test(MANIFEST_PARTS, SUITE_EXAMPLES // 2, derandomize=True)
test_fuzz_torrent = build_test(TORRENT, SUITE_EXAMPLES, derandomize=True)
test_fuzz_gguf = build_test(GGUF, SUITE_EXAMPLES, derandomize=True)
test_fuzz_address = build_test(ADDRESS, SUITE_EXAMPLES, derandomize=True)
test_fuzz_sampling = build_test(SAMPLING, SUITE_EXAMPLES, derandomize=True)
test_fuzz_snapshot = build_test(SNAPSHOT, SUITE_EXAMPLES // 3, derandomize=True)
test_fuzz_holdings = build_test(HOLDINGS, SUITE_EXAMPLES, derandomize=True)
test_fuzz_relay = build_test(RELAY, SUITE_EXAMPLES, derandomize=True)


def test_every_target_has_a_suite_test():
    names = {t.name for t in TARGETS}
    assert names == {n.removeprefix("test_fuzz_") for n in globals() if n.startswith("test_fuzz_")}


def test_valid_inputs_decode():
    """The fuzzers' seeds are valid, so mutations start from inputs that reach deep into each parser."""
    assert all(decode_frame(b) for b in _VALID_FRAMES)
    assert decode_announcement(_ANN_RECORD) == _ANN
    assert Manifest.from_bytes(_MANIFEST_BYTES, _MODEL_ID) == _MANIFEST
    assert decode_seeder(_SEEDERS[0], _MODEL_ID).addresses == (("192.0.2.2", 6881), ("::1", 6882))
    assert decode_seeder(_SEEDERS[1], _MODEL_ID).torrent == _TORRENT
    assert parse_torrent(_TORRENT).name == _MODEL_ID
    m = read_manifest(_gguf_path(_GGUF))
    assert (m.arch, m.n_layers, m.n_embd, m.n_vocab, len(m.tensors)) == ("llama", 2, 8, 3, 4)
    assert scan(_gguf_path(_GGUF)).tensors["output_norm.weight"].dims == (8,)
