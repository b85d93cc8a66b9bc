"""Malformed and hostile input to a real `swarm serve` peer, over real libp2p streams.

One peer serves the whole of SmolLM2 (span 0:30, so it replies with `Token` frames), a second one
the non-final span 0:15 (it replies with `Hidden` frames). The tests
open raw streams to it from a client-mode DHT node and send frames built with swarm.wire, or raw
bytes. Each bad input must get an `Error` frame of the right code (or a closed stream), and the
peer must keep serving: the last tests check that a normal client still gets exactly llama.cpp's
whole-model greedy text, also while another stream misbehaves next to it.
"""

from __future__ import annotations

import os
import struct

import msgpack
import numpy as np
import pytest

from swarm import Client
from swarm.manifest import build_manifest
from swarm.p2p import MAX_FRAME_BYTES
from swarm.limits import MAX_FORWARD_TOKENS
from swarm.wire import PROTOCOL_GENERATION, Close, Error, ErrorCode, Forward, Hidden, Token, encode_frame

from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, RawClient, serve_args

PROMPT = "The three most important inventions of the twentieth century are"
N_EMBD = 576
GEN = bytes([PROTOCOL_GENERATION])  # the generation byte every frame starts with
CACHE_TOKENS = 12288
MAX_SESSIONS = 4
SESSION_TOKENS = CACHE_TOKENS // MAX_SESSIONS  # each session's own KV stream: 3,072 >= a full frame
REPLY_S = 30.0


def hidden(n: int = 1, cols: int = N_EMBD, seed: int = 0) -> np.ndarray:
    """Small random hidden states, `[n, cols]` float32 (the scale of real residuals)."""
    return (np.random.default_rng(seed).standard_normal((n, cols)) * 0.1).astype(np.float32)


def raw_frame(header: dict, payload: bytes = b"", generation: int = PROTOCOL_GENERATION) -> bytes:
    """A frame body built by hand, bypassing swarm.wire's encode-side checks."""
    packed = msgpack.packb(header, use_bin_type=True)
    return struct.pack(">BH", generation, len(packed)) + packed + payload


def expect_error(reply, code: ErrorCode, *words: str) -> None:
    assert isinstance(reply, Error), reply
    assert reply.code == code, reply
    for w in words:
        assert w in reply.message, reply.message


@pytest.fixture(scope="module")
def peer(smollm2_path, tmp_path_factory):
    ps = PeerSet(tmp_path_factory.mktemp("robust_peer"))
    sizes = ("--max-sessions", str(MAX_SESSIONS), "--cache-tokens", str(CACHE_TOKENS),
             "--client-sessions", str(MAX_SESSIONS))  # one raw client opens them all
    p = ps.start("p0", *serve_args(smollm2_path, "0:30", "--new-swarm", *sizes))
    yield p
    ps.stop_all()
    assert p.proc.returncode == 0, p.stderr_text()[-2000:]


@pytest.fixture(scope="module")
def raw(peer, smollm2_path, tmp_path_factory):
    c = RawClient(peer, build_manifest(smollm2_path).model_id, tmp_path_factory.mktemp("raw_client"))
    yield c
    c.close()


@pytest.fixture(scope="module")
def half(peer, smollm2_path, tmp_path_factory):
    """A second peer, serving the non-final span [0, 15) (it answers with Hidden frames)."""
    ps = PeerSet(tmp_path_factory.mktemp("robust_half"))
    p = ps.start("p1", *serve_args(smollm2_path, "0:15", "--initial-peers", peer.maddrs[0]))
    c = RawClient(p, build_manifest(smollm2_path).model_id, tmp_path_factory.mktemp("raw_half"), span=(0, 15))
    yield c
    c.close()
    ps.stop_all()
    assert p.proc.returncode == 0, p.stderr_text()[-2000:]


@pytest.fixture(scope="module")
def expected(smollm2_path) -> str:
    return oracle(smollm2_path, PROMPT, 24)


# ---- bad framing and protocol: an Error(PROTOCOL) frame, then the stream ends --------------------


def test_garbage_bytes(raw):
    s = raw.stream()
    expect_error(raw.ask(s, GEN + b"\x00\x08" + b"\xc1" * 8), ErrorCode.PROTOCOL, "malformed frame header")
    raw.assert_closed(s)


def test_garbage_bytes_that_are_not_even_a_prefix(raw):
    s = raw.stream()
    expect_error(raw.ask(s, b"\x07"), ErrorCode.PROTOCOL, "too short")
    raw.assert_closed(s)


def test_other_protocol_generation(raw):
    body = bytearray(raw.open_frame())
    body[0] = PROTOCOL_GENERATION + 1
    s = raw.stream()
    expect_error(raw.ask(s, bytes(body)), ErrorCode.PROTOCOL, f"generation {PROTOCOL_GENERATION + 1}")
    raw.assert_closed(s)


def test_forward_before_open(raw):
    s = raw.stream()
    expect_error(
        raw.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=hidden()))),
        ErrorCode.PROTOCOL,
        "first frame must be open",
        "Forward",
    )
    raw.assert_closed(s)


def test_open_of_another_model_or_span_is_not_found(raw):
    s = raw.stream()
    expect_error(raw.ask(s, raw.open_frame(model_id="ab" * 32)), ErrorCode.NOT_FOUND, "layers [0, 30)")
    raw.assert_closed(s)
    s = raw.stream()
    expect_error(raw.ask(s, raw.open_frame(span=(0, 15))), ErrorCode.NOT_FOUND, "layers [0, 30)")
    raw.assert_closed(s)


def test_open_for_another_client_is_forbidden(raw, peer):
    # A session is bound to the stream's authenticated peer id; claiming another id is refused.
    s = raw.stream()
    expect_error(raw.ask(s, raw.open_frame(client_id=peer.peer_id)), ErrorCode.FORBIDDEN, "peer id")
    raw.assert_closed(s)


def test_open_longer_than_a_session_stream_is_busy(raw):
    # The cache is free, but one session's KV stream holds cache-tokens / max-sessions: a longer
    # session is refused (Busy: the client routes around this peer), naming both numbers.
    s = raw.stream()
    expect_error(
        raw.ask(s, raw.open_frame(max_tokens=SESSION_TOKENS + 1)),
        ErrorCode.BUSY,
        f"{SESSION_TOKENS + 1} KV tokens",
        f"at most {SESSION_TOKENS}",
        f"{CACHE_TOKENS} cache tokens / {MAX_SESSIONS} sessions",
    )
    raw.assert_closed(s)
    s = raw.open_session(max_tokens=SESSION_TOKENS)  # exactly one stream: admitted
    raw.send(s, encode_frame(Close()))
    raw.assert_closed(s)


def test_open_beyond_the_context_cap_is_refused(raw):
    header = {
        "k": "open",
        "session_id": os.urandom(16),
        "client_id": raw.dht.peer_id,
        "model_id": raw.model_id,
        "start": 0,
        "end": 30,
        "max_tokens": 131_073,
        "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "n_top_logprobs": 0,
                     "logprobs": False},
        "prefixes": [],
    }
    s = raw.stream()
    expect_error(raw.ask(s, raw_frame(header)), ErrorCode.PROTOCOL, "max_tokens", "131072")
    raw.assert_closed(s)


def test_oversized_frame_closes_only_that_stream(raw):
    s = raw.stream()
    # Announce one byte more than the limit; the peer must refuse before reading (or allocating) it.
    s._writer.write(struct.pack(">I", MAX_FRAME_BYTES + 1))  # noqa: SLF001 - a hostile client's raw write
    raw.assert_closed(s)
    s2 = raw.open_session()  # the peer still admits sessions
    reply = raw.ask(s2, encode_frame(Forward(step=0, pos0=0, hidden=hidden())))
    assert isinstance(reply, Token)


# ---- bad requests inside an open session: Error(BAD_REQUEST), the session stays usable -----------


def test_bad_forwards_keep_the_session(raw):
    s = raw.open_session()
    expect_error(
        raw.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=hidden(cols=100)))),
        ErrorCode.BAD_REQUEST,
        "hidden size 100",
        str(N_EMBD),
    )
    nan = hidden(2)
    nan[1, 7] = np.nan
    expect_error(
        raw.ask(s, encode_frame(Forward(step=1, pos0=0, hidden=nan))),
        ErrorCode.BAD_REQUEST,
        "NaN or infinite",
    )
    expect_error(
        raw.ask(s, encode_frame(Forward(step=2, pos0=5, hidden=hidden()))),
        ErrorCode.BAD_REQUEST,
        "position 5",
        "at 0",
    )
    expect_error(
        raw.ask(s, encode_frame(Forward(step=3, pos0=0, hidden=hidden(65)))),
        ErrorCode.BAD_REQUEST,
        "65",
    )  # past the 64 tokens reserved at open
    # None of those advanced the session: position 0 works, then position 1.
    first = raw.ask(s, encode_frame(Forward(step=4, pos0=0, hidden=hidden(3))))
    assert isinstance(first, Token) and first.step == 4
    second = raw.ask(s, encode_frame(Forward(step=5, pos0=3, hidden=hidden(1, seed=1))))
    assert isinstance(second, Token) and second.step == 5


def test_forward_over_the_token_cap_is_refused_and_keeps_the_session(raw):
    s = raw.open_session(max_tokens=MAX_FORWARD_TOKENS + 8)
    expect_error(
        raw.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=hidden(MAX_FORWARD_TOKENS + 1)))),
        ErrorCode.BAD_REQUEST,
        f"at most {MAX_FORWARD_TOKENS} tokens",
        str(MAX_FORWARD_TOKENS + 1),
    )
    # A frame of exactly the cap is served (in several chunks on the peer), and the session goes on.
    # Its 2,048 rows take ~20-40 s on a loaded 2-core machine: the hang guard is wider than REPLY_S.
    frame = encode_frame(Forward(step=1, pos0=0, hidden=hidden(MAX_FORWARD_TOKENS)))
    first = raw.ask(s, frame, timeout_s=600.0)
    assert isinstance(first, Token) and first.step == 1
    nxt = raw.ask(s, encode_frame(Forward(step=2, pos0=MAX_FORWARD_TOKENS, hidden=hidden(1))))
    assert isinstance(nxt, Token) and nxt.step == 2


def test_non_final_span_answers_hidden_and_refuses_bad_forwards(half):
    s = half.open_session()
    x = hidden(4)
    x[2, 3] = np.inf
    expect_error(
        half.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=x))), ErrorCode.BAD_REQUEST, "NaN or infinite"
    )
    expect_error(
        half.ask(s, encode_frame(Forward(step=1, pos0=0, hidden=hidden(1, cols=N_EMBD + 1)))),
        ErrorCode.BAD_REQUEST,
        f"hidden size {N_EMBD + 1}",
    )
    reply = half.ask(s, encode_frame(Forward(step=2, pos0=0, hidden=hidden(4))))
    assert isinstance(reply, Hidden) and reply.step == 2
    assert reply.hidden.shape == (4, N_EMBD) and np.isfinite(reply.hidden).all()
    assert not np.allclose(reply.hidden, hidden(4))  # 15 layers changed the residual stream
    expect_error(
        half.ask(s, encode_frame(Forward(step=3, pos0=3, hidden=hidden()))),
        ErrorCode.BAD_REQUEST,
        "position 3",
        "at 4",
    )
    half.send(s, GEN + b"\x00\x00")  # a header length of 0: not a msgpack map
    expect_error(half.recv(s), ErrorCode.PROTOCOL, "malformed frame header")
    half.assert_closed(s)


def test_truncated_tensor_bytes_end_the_stream(raw):
    s = raw.open_session()
    body = encode_frame(Forward(step=0, pos0=0, hidden=hidden(2)))
    expect_error(
        raw.ask(s, body[:-4]),
        ErrorCode.PROTOCOL,
        f"needs {2 * N_EMBD * 4} B",
        f"carries {2 * N_EMBD * 4 - 4} B",
    )
    raw.assert_closed(s)


def test_wrong_dtype_ends_the_stream(raw):
    s = raw.open_session()
    header = {
        "k": "forward",
        "step": 0,
        "pos0": 0,
        "want_logits": False,
        "all_logits": False,
        "restore": 0,
        "push": False,
        "rewind": False,
        "steps": [],
        "verify": False,
        "token_ids": 0,
        "want_draft": False,
        "dtype": "f64",
        "shape": [1, N_EMBD],
    }
    expect_error(
        raw.ask(s, raw_frame(header, hidden().astype(np.float64).tobytes())),
        ErrorCode.PROTOCOL,
        "field 'dtype' must be one of",
    )
    raw.assert_closed(s)


# ---- the peer still serves correctly ----------------------------------------------------------------


def test_bad_stream_does_not_disturb_a_running_session(raw, peer, smollm2_path, expected):
    # Between every two tokens of a running generation, a bad stream opens a session, sends a
    # misplaced Forward and then garbage: interleaved by construction, not by timing.
    text, n_bad = "", 0
    with Client(str(smollm2_path), initial_peers=peer.maddrs) as client:
        for delta in client.stream(PROMPT, max_new_tokens=24):
            text += delta
            s = raw.open_session()
            expect_error(
                raw.ask(s, encode_frame(Forward(step=0, pos0=9, hidden=hidden()))),
                ErrorCode.BAD_REQUEST,
                "position 9",
            )
            expect_error(raw.ask(s, GEN + b"\xff\xff"), ErrorCode.PROTOCOL)
            raw.loop.run(s.close(), 30)  # hung up at once: the peer's lingering close ends with it
            n_bad += 1
    assert n_bad >= 2  # bad streams ran while the session was open, not only before or after it
    assert text == expected


def test_peer_still_matches_llama_cpp(peer, smollm2_path, expected):
    with Client(str(smollm2_path), initial_peers=peer.maddrs) as client:
        got = client.generate(PROMPT, max_new_tokens=24)
    assert got.text == expected
    assert [h.peer_id for h in got.telemetry.route] == [peer.peer_id]
    assert peer.proc.poll() is None
