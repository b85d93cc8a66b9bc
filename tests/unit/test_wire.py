"""swarm.wire: round trips, every refusal, a seeded fuzz of the decoder, and that every field is read."""

import ast
import dataclasses
import random
import struct
import typing
from pathlib import Path

import msgpack
import numpy as np
import pytest

from swarm.errors import ProtocolError
from swarm.limits import MAX_VERIFY_ROWS
from swarm.sampling import SamplingParams
from swarm.wire import (
    MAX_FRAME_BYTES,
    MAX_HEADER_BYTES,
    MAX_MESSAGE_CHARS,
    MAX_CHAIN_ADDRS,
    MAX_FORWARD_STEPS,
    PROTOCOL_GENERATION,
    RECEIPT_BYTES,
    Attach,
    Chain,
    Close,
    Error,
    ErrorCode,
    Forward,
    Frame,
    Hidden,
    Open,
    OpenOk,
    Token,
    Truncate,
    decode_frame,
    encode_frame,
    receipt,
)

RNG = np.random.default_rng(7)
H576 = RNG.standard_normal((1, 576)).astype(np.float32)
H_PREFILL = RNG.standard_normal((5, 896)).astype(np.float16)


def _frames():
    return [
        Open(
            session_id=bytes(range(16)),
            client_id="12D3KooWclient",
            model_id="0123abcdef" * 6,
            start=10,
            end=20,
            max_tokens=4096,
            sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=2**63, n_top_logprobs=3),
        ),
        OpenOk(reserved_tokens=4096),
        Error(code=ErrorCode.BUSY, message="no free session slot"),
        Forward(step=0, pos0=0, hidden=H_PREFILL),
        Forward(step=7, pos0=130, hidden=H576, want_logits=True, all_logits=True),
        Hidden(step=7, hidden=H576, compute_ms=1.25),
        Token(step=7, token=42, logprob=-0.25, top=((42, -0.25), (7, -2.0)), compute_ms=0.5),
        Token(step=9, token=3, logprob=None, top=(), compute_ms=0.5),
        Token(
            step=8,
            token=0,
            logprob=float("-inf"),
            top=(),
            compute_ms=0.0,
            logits=RNG.standard_normal((2, 100)).astype(np.float32),
        ),
        Truncate(pos=12),
        Forward(step=9, pos0=131, hidden=H576, push=True, rewind=True),
        Forward(step=10, pos0=0, hidden=H_PREFILL, steps=(H_PREFILL.shape[0] - 2, 1, 1)),
        Forward(step=11, pos0=40, hidden=H_PREFILL, steps=(1,) * H_PREFILL.shape[0], verify=True),
        Forward(step=12, pos0=3, hidden=H_PREFILL, token_ids=np.array([0, 7, 255, 2**20 - 1, 42], np.int64),
                push=True),
        Token(step=11, token=5, logprob=None, top=(), compute_ms=0.5, tokens=(1, 2, 3, 4, 5)),
        Forward(step=13, pos0=9, hidden=H576, want_draft=3),
        Token(step=13, token=5, logprob=None, top=(), compute_ms=0.5, draft=(17, 4, 9)),
        Hidden(step=9, hidden=H576, compute_ms=1.0, pushed=True),
        Chain(next_peer="12D3KooWnext", next_session=bytes(16), next_addrs=("/ip4/10.0.0.2/tcp/4001",),
              next_direct=("/ip4/10.0.0.2/tcp/4002",), prev_peer="12D3KooWprev"),
        Chain(),
        Attach(session_id=bytes(range(16))),
        Close(),
    ]


def _same(a, b):
    assert type(a) is type(b)
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        else:
            assert x == y, name


@pytest.mark.parametrize("frame", _frames(), ids=lambda f: type(f).__name__)
def test_round_trip_preserves_every_field(frame):
    _same(decode_frame(encode_frame(frame)), frame)


def test_size_line_decode_frame_is_4_n_embd_plus_small_header():
    body = encode_frame(Forward(step=123456, pos0=100_000, hidden=H576))
    # generation 2 added 'restore' (9 B), generation 3 'push' and 'rewind' (15 B), generation 4 'steps' (7 B);
    # generation 5 dropped 'sample' (8 B); generation 6 added 'verify' (8 B), generation 7 'token_ids'
    # (11 B: the count; the ids, when sent, follow the tensor at 4 B per row), generation 8
    # 'want_draft' (12 B)
    assert 4 * 576 < len(body) <= 4 * 576 + 149
    ids = encode_frame(Forward(step=123456, pos0=100_000, hidden=H576, token_ids=np.array([5], np.int32)))
    assert len(ids) == len(body) + 4


def test_a_verify_pass_is_bounded_and_its_tokens_end_with_the_token():
    with pytest.raises(ProtocolError, match="verify pass"):
        Forward(step=0, pos0=0, hidden=np.zeros((MAX_VERIFY_ROWS + 1, 4), np.float32), verify=True)
    Forward(step=0, pos0=0, hidden=np.zeros((MAX_VERIFY_ROWS + 1, 4), np.float32))  # not a verify pass
    with pytest.raises(ProtocolError, match="end with"):
        Token(step=0, token=5, logprob=None, top=(), compute_ms=0.0, tokens=(5, 6))


def test_decoded_tensor_is_a_readonly_view_without_copy():
    body = encode_frame(Hidden(step=1, hidden=H576, compute_ms=0.1))
    frame = decode_frame(body)
    assert not frame.hidden.flags.writeable
    assert np.shares_memory(frame.hidden, np.frombuffer(body, dtype=np.uint8))


def test_generation_mismatch_is_refused_before_the_header():
    body = bytearray(encode_frame(Close()))
    body[0] = PROTOCOL_GENERATION + 1
    with pytest.raises(ProtocolError, match=f"generation {PROTOCOL_GENERATION + 1}"):
        decode_frame(bytes(body))


def test_a_generation_10_peer_is_refused_and_a_draft_count_is_a_count():
    # generation 11 made `Forward.want_draft` a count of chained drafts (generation 10's was a flag,
    # which a generation-10 peer would read as one draft): a generation-10 frame is refused by its
    # first byte, as the peer's handler refuses any mismatch at the handshake
    assert PROTOCOL_GENERATION == 11
    body = _raw(_fwd_header(), bytes(16), generation=10)
    with pytest.raises(ProtocolError, match="peer speaks protocol generation 10, this one speaks 11"):
        decode_frame(body)
    for bad in (True, -1, MAX_VERIFY_ROWS):
        with pytest.raises(ProtocolError, match="want_draft"):
            Forward(step=0, pos0=0, hidden=H576, want_draft=bad)


def test_a_receipt_is_the_digest_of_the_rows_as_float32():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert len(receipt(x)) == RECEIPT_BYTES
    assert receipt(x) == receipt(x.astype(np.float16)) == receipt(x.copy())
    y = x.copy()
    y[1, 3] = np.nextafter(y[1, 3], np.float32(100))
    assert receipt(y) != receipt(x)
    frame = decode_frame(encode_frame(Hidden(step=1, hidden=x, compute_ms=0.1, receipt=receipt(x))))
    assert frame.receipt == receipt(x)
    with pytest.raises(ProtocolError):
        Hidden(step=1, hidden=x, compute_ms=0.1, receipt=b"short")


def _raw(header, payload=b"", generation=PROTOCOL_GENERATION):
    packed = msgpack.packb(header, use_bin_type=True)
    return struct.pack(">BH", generation, len(packed)) + packed + payload


def _fwd_header(**over):
    h = {
        "k": "forward",
        "step": 1,
        "pos0": 0,
        "want_logits": False,
        "all_logits": False,
        "restore": 0,
        "push": False,
        "rewind": False,
        "steps": [],
        "verify": False,
        "token_ids": 0,
        "want_draft": 0,
        "dtype": "f32",
        "shape": [1, 4],
    }
    h.update(over)
    return h


def test_token_ids_follow_the_tensor_and_decode_as_a_readonly_int32_view():
    ids = np.array([3, 1, 4, 1, 5], np.int32)
    body = encode_frame(Forward(step=1, pos0=0, hidden=H_PREFILL, token_ids=ids))
    assert body[-20:] == ids.astype("<i4").tobytes()  # after the tensor bytes, little-endian int32
    frame = decode_frame(body)
    assert frame.token_ids.dtype == np.dtype("<i4") and frame.token_ids.tolist() == [3, 1, 4, 1, 5]
    assert not frame.token_ids.flags.writeable
    assert np.shares_memory(frame.token_ids, np.frombuffer(body, dtype=np.uint8))
    assert frame.hidden.tobytes() == H_PREFILL.tobytes()  # the tensor ends where the ids start
    absent = decode_frame(encode_frame(Forward(step=1, pos0=0, hidden=H_PREFILL)))
    assert absent.token_ids.shape == (0,) and absent.token_ids.dtype == np.dtype("<i4")


@pytest.mark.parametrize(
    "ids, match",
    [
        (np.array([1, 2], np.int32), "holds 2 ids, the frame has 5 rows"),
        (np.arange(6, dtype=np.int32), "holds 6 ids, the frame has 5 rows"),
        (np.array([0, 1, -1, 2, 3], np.int32), r"ids in \[0, 1048575\]"),
        (np.array([0, 1, 2**20, 2, 3], np.int64), r"ids in \[0, 1048575\]"),
        (np.array([0, 1, 2**40, 2, 3], np.int64), r"ids in \[0, 1048575\]"),  # not wrapped into range
        (np.zeros(5, np.float32), "1-D integer array"),
        (np.zeros((5, 1), np.int32), "1-D integer array"),
        ([0, 1, 2, 3, 4], "1-D integer array"),
    ],
)
def test_token_ids_are_refused_on_construction(ids, match):
    with pytest.raises(ProtocolError, match=match):
        Forward(step=0, pos0=0, hidden=H_PREFILL, token_ids=ids)


def _with_ids(n_rows: int, ids: list[int], count: int | None = None) -> bytes:
    """A raw Forward of n_rows x 4 f32 zeros whose header counts `count` ids (default: len(ids))
    and whose payload carries `ids` as int32 after the tensor."""
    header = _fwd_header(shape=[n_rows, 4], token_ids=len(ids) if count is None else count)
    return _raw(header, bytes(16 * n_rows) + np.asarray(ids, "<i4").tobytes())


@pytest.mark.parametrize(
    "body, match",
    [
        (_with_ids(2, [1]), "holds 1 ids, the frame has 2 rows"),
        (_with_ids(1, [1, 2]), "holds 2 ids, the frame has 1 rows"),
        (_with_ids(2, [1, -5]), r"ids in \[0, 1048575\]"),
        (_with_ids(1, [2**20]), r"ids in \[0, 1048575\]"),
        (_with_ids(1, [1], count=-1), "'token_ids'"),
        (_with_ids(1, [1], count=True), "'token_ids'"),
        (_with_ids(1, [1], count="1"), "'token_ids'"),
        (_with_ids(1, [1], count=100), "counts 100 ids"),
        (_with_ids(2, [1, 2], count=1), "needs 32 B"),  # the tensor gets the uncounted bytes
        (_with_ids(2, [1, 2], count=0), "needs 32 B"),
    ],
)
def test_malformed_token_ids_raise_protocol_error(body, match):
    with pytest.raises(ProtocolError, match=match):
        decode_frame(body)


def test_a_receipt_covers_the_token_ids_when_the_step_has_them():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert receipt(x, np.zeros(0, np.int32)) == receipt(x, None) == receipt(x)
    assert receipt(x, np.array([1, 2])) != receipt(x)
    assert receipt(x, np.array([1, 2])) != receipt(x, np.array([2, 1]))
    assert receipt(x, np.array([1, 2], np.int64)) == receipt(x, np.array([1, 2], np.int32))


@pytest.mark.parametrize(
    "body, match",
    [
        (b"", "too short"),
        (b"\x01\x00", "too short"),
        (struct.pack(">BH", PROTOCOL_GENERATION, 50) + b"\x80", "past the end"),
        (
            struct.pack(">BH", PROTOCOL_GENERATION, MAX_HEADER_BYTES + 1) + bytes(MAX_HEADER_BYTES + 1),
            "over the bound",
        ),
        (struct.pack(">BH", PROTOCOL_GENERATION, 1) + b"\xc1", "malformed"),
        (_raw([1, 2]), "must be a map"),
        (_raw({"k": "launch"}), "unknown frame kind"),
        (_raw({"k": 5}), "unknown frame kind"),
        (_raw({"k": "close", "extra": 1}), "fields"),
        (_raw({"k": "truncate"}), "fields"),
        (_raw({"k": "truncate", "pos": -1}), "'pos'"),
        (_raw({"k": "truncate", "pos": True}), "'pos'"),
        (_raw({"k": "truncate", "pos": 1.0}), "'pos'"),
        (_raw({"k": "close"}, b"x"), "unexpected tensor bytes"),
        (_raw({"k": "error", "code": "teapot", "message": "x"}), "unknown error code"),
        (_raw({"k": "error", "code": [1], "message": "x"}), "unknown error code"),
        (_raw({"k": "error", "code": "busy", "message": "x" * (MAX_MESSAGE_CHARS + 1)}), "'message'"),
        (_raw(_fwd_header(), bytes(15)), "needs 16 B"),
        (_raw(_fwd_header(), bytes(17)), "needs 16 B"),
        (_raw(_fwd_header(steps=[1, 1]), bytes(16)), "sums to 2 rows"),
        (_raw(_fwd_header(steps="1"), bytes(16)), "'steps'"),
        (_raw(_fwd_header(steps=[1.0]), bytes(16)), "'steps"),
        (_raw(_fwd_header(dtype="f64"), bytes(32)), "'dtype'"),
        (_raw(_fwd_header(dtype=None), bytes(16)), "'dtype'"),
        (_raw(_fwd_header(shape=[4]), bytes(16)), "'shape'"),
        (_raw(_fwd_header(shape=[0, 4]), b""), r"shape\[0\]"),
        (_raw(_fwd_header(shape=[1, 70_000]), bytes(280_000)), r"shape\[1\]"),
        (_raw(_fwd_header(shape=[2**40, 2**20]), b""), r"shape\[0\]"),
        (_raw(_fwd_header(step=-1), bytes(16)), "'step'"),
        (_raw(_fwd_header(want_logits=1), bytes(16)), "'want_logits'"),
        (_raw(_fwd_header(push=1), bytes(16)), "'push'"),
        (_raw(_fwd_header(sample=True), bytes(16)), "fields"),
        (_raw(_fwd_header(all_logits=True), bytes(16)), "needs 'want_logits'"),
        (_raw(_fwd_header(pos0=131_072), bytes(16)), "'pos0'"),
        (
            _raw(
                {"k": "hidden", "step": 1, "compute_ms": float("nan"), "dtype": "f32", "shape": [1, 4]},
                bytes(16),
            ),
            "'compute_ms'",
        ),
        (
            _raw(
                {
                    "k": "token",
                    "step": 1,
                    "token": 3,
                    "logprob": 0.5,
                    "top": [],
                    "compute_ms": 1.0,
                    "dtype": None,
                    "shape": None,
                }
            ),
            "'logprob'",
        ),
        (
            _raw(
                {
                    "k": "token",
                    "step": 1,
                    "token": 3,
                    "logprob": -0.5,
                    "top": [[1]],
                    "compute_ms": 1.0,
                    "dtype": None,
                    "shape": None,
                }
            ),
            "'top'",
        ),
        (
            _raw(
                {
                    "k": "token",
                    "step": 1,
                    "token": 3,
                    "logprob": -0.5,
                    "top": [[1, -0.1]] * 21,
                    "compute_ms": 1.0,
                    "dtype": None,
                    "shape": None,
                }
            ),
            "'top'",
        ),
        (
            _raw({"k": "open_ok", "reserved_tokens": 131_073, "restorable": [], "fetched_from": ""}),
            "'reserved_tokens'",
        ),
    ],
)
def test_malformed_frames_raise_protocol_error(body, match):
    with pytest.raises(ProtocolError, match=match):
        decode_frame(body)


def _open_header(**over):
    h = {
        "k": "open",
        "session_id": bytes(16),
        "client_id": "c",
        "model_id": "ab",
        "start": 0,
        "end": 10,
        "max_tokens": 10,
        "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "n_top_logprobs": 0,
                     "logprobs": False},
        "prefixes": [],
    }
    h.update(over)
    return h


@pytest.mark.parametrize(
    "over, match",
    [
        ({"session_id": bytes(15)}, "session_id"),
        ({"session_id": "0" * 16}, "session_id"),
        ({"model_id": "XYZ"}, "hex"),
        ({"model_id": ""}, "hex"),
        ({"client_id": "c" * 129}, "client_id"),
        ({"start": 10, "end": 10}, "'end'"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 131_073}, "max_tokens"),
        (
            {"sampling": {"temperature": -1.0, "top_p": 1.0, "top_k": 0, "seed": 0, "n_top_logprobs": 0,
                          "logprobs": False}},
            "temperature",
        ),
        ({"sampling": {"temperature": 0.0}}, "'sampling'"),
        ({"sampling": [0.0, 1.0, 0, 0, 0]}, "'sampling'"),
    ],
)
def test_open_validation(over, match):
    with pytest.raises(ProtocolError, match=match):
        decode_frame(_raw(_open_header(**over)))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Chain(next_peer="p", next_session=b""), "next_session"),
        (lambda: Chain(next_session=bytes(16)), "next_session"),
        (lambda: Chain(next_peer="p", next_session=bytes(16), next_addrs=("/a",) * (MAX_CHAIN_ADDRS + 1)),
         "next_addrs"),
        (lambda: Chain(next_peer="p", next_session=bytes(16), next_direct=("x" * 257,)), "next_direct"),
        (lambda: Chain(prev_peer="p" * 129), "prev_peer"),
        (lambda: Attach(session_id=bytes(15)), "session_id"),
        (lambda: Forward(step=0, pos0=4, hidden=H576, restore=4, rewind=True), "exclude"),
        (lambda: Forward(step=0, pos0=0, hidden=H576, push=1), "push"),
        (lambda: Forward(step=0, pos0=0, hidden=H_PREFILL, steps=(1, 1)), "sums to 2 rows"),
        (lambda: Forward(step=0, pos0=0, hidden=H_PREFILL, steps=(H_PREFILL.shape[0], 0)), "steps"),
        (lambda: Forward(step=0, pos0=0, hidden=H576, steps=[1]), "tuple"),
        (lambda: Forward(step=0, pos0=0, hidden=H576, steps=(True,)), "steps"),
        (lambda: Forward(step=0, pos0=0, hidden=np.zeros((MAX_FORWARD_STEPS + 1, 4), np.float32),
                         steps=(1,) * (MAX_FORWARD_STEPS + 1)), "at most"),
    ],
)
def test_push_frames_validate(make, match):
    with pytest.raises(ProtocolError, match=match):
        make()


def test_oversized_frame_is_refused_without_parsing():
    with pytest.raises(ProtocolError, match="MAX_FRAME_BYTES"):
        decode_frame(bytes(MAX_FRAME_BYTES + 1))


def test_encode_refuses_oversized_tensor():
    big = np.zeros((MAX_FRAME_BYTES // (4 * 4096) + 1, 4096), np.float32)
    with pytest.raises(ProtocolError, match="MAX_FRAME_BYTES"):
        encode_frame(Hidden(step=0, hidden=big, compute_ms=0.0))


def test_constructors_validate_tensors():
    with pytest.raises(ProtocolError, match="float32 or float16"):
        Hidden(step=0, hidden=np.zeros((1, 4), np.float64), compute_ms=0.0)
    with pytest.raises(ProtocolError, match="2-D"):
        Forward(step=0, pos0=0, hidden=np.zeros(4, np.float32))


def test_error_message_is_cut_on_construction():
    assert len(Error(code=ErrorCode.INTERNAL, message="x" * 5000).message) == MAX_MESSAGE_CHARS


def test_fuzz_decoder_raises_only_protocol_error():
    rng = random.Random(1234)
    valid = [encode_frame(f) for f in _frames()]
    decoded = 0
    for i in range(6000):
        if i % 3 == 0:
            body = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64)))
        else:
            body = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 6)):
                op = rng.randrange(3)
                pos = rng.randrange(len(body)) if body else 0
                if op == 0 and body:
                    body[pos] = rng.getrandbits(8)
                elif op == 1:
                    del body[pos : pos + rng.randrange(1, 8)]
                else:
                    body[pos:pos] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 8)))
            body = bytes(body)
        try:
            frame = decode_frame(body)
        except ProtocolError:
            continue
        decoded += 1
        _same(decode_frame(encode_frame(frame)), frame)  # whatever decodes must re-encode cleanly
    assert decoded < 6000


def test_fuzz_header_fields_raise_only_protocol_error():
    rng = random.Random(99)
    pool = [
        None,
        True,
        False,
        -1,
        0,
        1,
        2**31,
        2**64 - 1,
        -(2**63),
        0.5,
        -0.0,
        float("nan"),
        float("inf"),
        "",
        "f32",
        "f16",
        "busy",
        "x" * 300,
        b"",
        bytes(16),
        [],
        [1],
        [1, 4],
        [0, 0],
        {},
        {"a": 1},
        msgpack.ExtType(5, b"x"),
    ]
    valid = [encode_frame(f) for f in _frames()]
    kinds_decoded = set()
    for _ in range(4000):
        body = rng.choice(valid)
        hlen = struct.unpack_from(">H", body, 1)[0]
        header = msgpack.unpackb(body[3 : 3 + hlen], raw=False)
        payload = body[3 + hlen :]
        for _ in range(rng.randrange(1, 3)):
            if not header:
                break
            key = rng.choice(sorted(header))
            if rng.random() < 0.1:
                del header[key]
            else:
                header[key] = rng.choice(pool)
        if rng.random() < 0.1:
            payload = payload[: rng.randrange(len(payload) + 1)]
        try:
            frame = decode_frame(_raw(header, payload))
        except ProtocolError:
            continue
        kinds_decoded.add(type(frame).__name__)
        _same(decode_frame(encode_frame(frame)), frame)
    assert kinds_decoded  # some mutations (e.g. a new step number) stay valid


def _attribute_reads(root: Path, skip: Path) -> set[str]:
    """Names `x` of every attribute load `<expr>.x` in the .py files under root, except skip."""
    names = set()
    for path in root.rglob("*.py"):
        if path != skip:
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    names.add(node.attr)
    return names


def test_every_frame_field_is_read_outside_wire():
    """A field that is only sent and never read is dead weight on the wire (as `Forward.sample` was
    until generation 5): some code in swarm/ outside wire.py must read each field.

    A read is an attribute load `.field` in the syntax tree, so comments, strings and constructor
    keywords (`Forward(sample=True)`, the sending side) do not count. Names are matched without
    types: a common name (`step`, `hidden`) may be satisfied by an unrelated read, so this catches a
    field that nothing reads by its name at all, which is how `sample` went unnoticed."""
    swarm_dir = Path(__file__).resolve().parents[2] / "swarm"
    reads = _attribute_reads(swarm_dir, swarm_dir / "wire.py")
    unread = [
        f"{cls.__name__}.{f.name}"
        for cls in typing.get_args(Frame)
        for f in dataclasses.fields(cls)
        if f.name not in reads
    ]
    assert not unread, f"frame fields sent but never read in swarm/: {unread}"


def test_only_attribute_loads_count_as_reads(tmp_path):
    (tmp_path / "sender.py").write_text(
        "send(Forward(step=0, sample=True))  # frame.sample\n"
        "log('frame.sample')\nframe.push = 1\nuse(frame.step)\n"
    )
    assert _attribute_reads(tmp_path, tmp_path / "wire.py") == {"step"}
