"""A live fuzz of a serving peer: random and mutated span-protocol frames sent to a real peer over
libp2p and direct streams, while a normal client generates through it.

The frame generators are plain functions of a `random.Random` (reproducible by seed); `fuzz_peer`
drives them against one peer from one client node, a few streams at a time, and returns counts.
What the peer must do with all of it (stay up, keep serving the normal client bit for bit, keep its
memory bounded) is checked by the callers: scripts/fuzz_peer.py and tests/integration/test_fuzz_peer.py.

Kinds of episode (each one stream, or one TCP connection for "direct_raw"):
    random      random bytes as frames
    mutated     valid frames with flipped, cut, extended or spliced bytes
    fields      well-formed msgpack headers with one field of a wrong type, range or size
    session     a valid Open, then malformed or hostile Forwards, Truncates and Chains inside it
    push        a push stream: Attach to an unknown session, then pushed Forwards and garbage
    truncated   a frame cut off mid-body (or a length prefix of up to 64 MiB and no body), then closed
    direct      the session or mutated episodes over a direct TCP stream (ticket, then sealed frames)
    direct_raw  garbage on the direct TCP port before any ticket
Idle streams (opened, never written) are held open for the whole run.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
from collections import Counter
from dataclasses import dataclass, field

import msgpack
import numpy as np

from swarm.direct import dial
from swarm.errors import SwarmError
from swarm.limits import MAX_FRAME_BYTES, PUSH_PROTOCOL, SPAN_PROTOCOL
from swarm.netaddr import maddr_host_port
from swarm.p2p import FramedStream, SwarmP2P
from swarm.sampling import SamplingParams
from swarm.wire import (
    PROTOCOL_GENERATION,
    Attach,
    Chain,
    Close,
    Error,
    Forward,
    Open,
    Truncate,
    decode_frame,
    encode_frame,
)

KINDS = ("random", "mutated", "fields", "session", "push", "truncated", "direct", "direct_raw")
REPLY_WAIT_S = 10.0
"""How long an episode waits for each answer before giving up on the stream (a guard, not a timing)."""

_PREFIX = struct.Struct(">BH")  # swarm.wire's frame prefix: generation, header length


@dataclass(frozen=True)
class Target:
    """The peer under fuzz: id, libp2p and direct addresses, and the span it serves."""

    peer_id: str
    addrs: tuple[str, ...]
    direct: tuple[str, ...]
    model_id: str
    start: int
    end: int
    n_embd: int


@dataclass
class FuzzReport:
    """What a fuzz run sent and what came back.

    Attributes:
        frames: frames (or junk writes) sent, all kinds.
        by_kind: frames sent per episode kind.
        replies: answers by kind ("error:<code>" for Error frames, "undecodable" for bytes that are
            not a frame).
        closed: episodes the peer ended by closing the stream.
        idle: idle streams held open through the run.
    """

    frames: int = 0
    by_kind: Counter = field(default_factory=Counter)
    replies: Counter = field(default_factory=Counter)
    closed: int = 0
    idle: int = 0


# ---- generators -------------------------------------------------------------------------------------


def random_bytes(rng: random.Random) -> bytes:
    """0 to 4 KiB of random bytes, sometimes starting with this protocol's generation byte."""
    data = rng.randbytes(rng.choice((0, 1, 2, 3, 8, 64, 512, 4096)))
    if data and rng.random() < 0.5:
        data = bytes([PROTOCOL_GENERATION]) + data[1:]
    return data


def valid_frame(rng: random.Random, t: Target, client_id: str, *, pos0: int = 0) -> bytes:
    """One well-formed frame of a random kind, as a client could send it."""
    choice = rng.randrange(6)
    if choice == 0:
        return encode_frame(Open(os.urandom(16), client_id, t.model_id, t.start, t.end, rng.randint(1, 512),
                                 SamplingParams()))
    if choice == 1:
        rows = rng.randint(1, 8)
        return encode_frame(Forward(step=rng.randrange(1 << 20), pos0=pos0,
                                    hidden=np.zeros((rows, t.n_embd), np.float32)))
    if choice == 2:
        return encode_frame(Truncate(rng.randint(0, 1000)))
    if choice == 3:
        return encode_frame(Attach(os.urandom(16)))
    if choice == 4:
        return encode_frame(Chain(prev_peer=client_id))
    return encode_frame(Close())


def mutate(rng: random.Random, frame: bytes) -> bytes:
    """`frame` with flipped bytes, cut short, extended, spliced, or its prefix changed."""
    b = bytearray(frame)
    how = rng.randrange(6)
    if how == 0 and b:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif how == 1:
        b = b[: rng.randrange(len(b) + 1)]
    elif how == 2:
        b += rng.randbytes(rng.randint(1, 256))
    elif how == 3 and len(b) > 3:
        i, j = sorted(rng.randrange(len(b)) for _ in range(2))
        b[i:j] = rng.randbytes(j - i)
    elif how == 4 and len(b) >= 3:
        b[1:3] = rng.randrange(1 << 16).to_bytes(2, "big")  # header length
    elif b:
        b[0] = rng.randrange(256)  # generation
    return bytes(b)


_WEIRD = (None, -1, 2**63, -(2**63), 2**64 + 5, 1.5, float("nan"), "", "x" * 5000, b"\x00" * 40, [], {}, [1, 2],
          True, {"k": "open"}, "forward")


def mutated_fields(rng: random.Random, t: Target, client_id: str) -> bytes:
    """A valid frame whose msgpack header has one field replaced by a value of the wrong type, range
    or size (most often), or one field added or dropped; the tensor bytes stay, or are cut."""
    data = valid_frame(rng, t, client_id)
    _, header_len = _PREFIX.unpack_from(data)
    header = msgpack.unpackb(data[_PREFIX.size : _PREFIX.size + header_len], raw=False)
    payload = data[_PREFIX.size + header_len :]
    how = rng.randrange(5)
    if how <= 2 and len(header) > 1:
        header[rng.choice([k for k in header if k != "k"])] = rng.choice(_WEIRD)
    elif how == 3:
        header[rng.choice(("extra", "dtype", "shape", "zz"))] = rng.choice(_WEIRD)
    else:
        header.pop(rng.choice(list(header)))
    if payload and rng.random() < 0.3:
        payload = payload[: rng.randrange(len(payload))]
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        packed = msgpack.packb({"k": header.get("k")}, use_bin_type=True)
    packed = packed[:65535]
    return _PREFIX.pack(PROTOCOL_GENERATION, len(packed)) + packed + payload


def hostile_session_frames(rng: random.Random, t: Target, client_id: str, n: int) -> list[bytes]:
    """`n` frames for inside a valid session: malformed Forwards (wrong width, position, row count,
    steps, restore, rewind; NaN and infinite values; float16), Truncates out of range, Chains naming
    bad next hops, and mutated copies of them."""
    out: list[bytes] = []
    for _ in range(n):
        choice = rng.randrange(10)
        rows = rng.randint(1, 4)
        if choice == 0:
            f = Forward(step=1, pos0=0, hidden=np.zeros((rows, t.n_embd + rng.choice((-1, 1, 7))), np.float32))
        elif choice == 1:
            f = Forward(step=2, pos0=rng.randint(1, 5000), hidden=np.zeros((rows, t.n_embd), np.float32))
        elif choice == 2:
            f = Forward(step=3, pos0=0, hidden=np.full((rows, t.n_embd), rng.choice((np.nan, np.inf, -1e38)),
                                                          np.float32))
        elif choice == 3:
            f = Forward(step=4, pos0=0, hidden=np.ones((rows, t.n_embd), np.float16), steps=(rows,))
        elif choice == 4:
            f = Forward(step=5, pos0=7, hidden=np.zeros((1, t.n_embd), np.float32), restore=7)
        elif choice == 5:
            f = Forward(step=6, pos0=0, hidden=np.zeros((1, t.n_embd), np.float32), rewind=True, push=True)
        elif choice == 6:
            f = Truncate(rng.choice((0, 1, 10**6)))
        elif choice == 7:
            f = Chain(next_peer="Qm" + "x" * 44, next_session=os.urandom(16),
                      next_addrs=("/ip4/127.0.0.1/tcp/1",), prev_peer=rng.choice((client_id, "", "junk")))
        elif choice == 8:
            f = Forward(step=8, pos0=0, hidden=rng.choice((np.zeros, np.ones))((rng.randint(1, 64), t.n_embd),
                                                                                  np.float32))
        else:
            out.append(mutate(rng, encode_frame(Forward(step=9, pos0=0, hidden=np.zeros((2, t.n_embd), np.float32)))))
            continue
        out.append(encode_frame(f))
    return out


# ---- episodes -----------------------------------------------------------------------------------------


async def _drain(stream: FramedStream, report: FuzzReport, expected: int) -> None:
    """Read up to `expected` answers (or until the peer closes the stream)."""
    for _ in range(expected):
        try:
            data = await stream.recv(REPLY_WAIT_S)
        except SwarmError:
            report.closed += 1
            return
        try:
            frame = decode_frame(data)
        except SwarmError:
            report.replies["undecodable"] += 1
            continue
        report.replies[f"error:{frame.code.value}" if isinstance(frame, Error) else type(frame).KIND] += 1


async def _send_all(stream: FramedStream, frames: list[bytes], report: FuzzReport, kind: str) -> int:
    sent = 0
    for data in frames:
        try:
            await stream.send(data)
        except SwarmError:
            break
        sent += 1
    report.frames += sent
    report.by_kind[kind] += sent
    return sent


async def _episode(transport: SwarmP2P, t: Target, rng: random.Random, kind: str, report: FuzzReport) -> None:
    client_id = transport.peer_id
    if kind == "direct_raw":
        hp = maddr_host_port(t.direct[0]) if t.direct else None
        if hp is None:
            return
        reader, writer = await asyncio.open_connection(*hp)
        writer.write(rng.randbytes(rng.choice((3, 20, 300))))
        report.frames += 1
        report.by_kind[kind] += 1
        try:
            await asyncio.wait_for(reader.read(), REPLY_WAIT_S)  # the peer drops it: EOF
            report.closed += 1
        except (TimeoutError, OSError):
            pass
        writer.close()
        return
    protocol = PUSH_PROTOCOL if kind == "push" else SPAN_PROTOCOL
    if kind == "direct":
        if not t.direct:
            return
        stream = await dial(transport, t.peer_id, t.addrs, t.direct, SPAN_PROTOCOL, REPLY_WAIT_S)
    else:
        stream = await transport.open_stream(t.peer_id, t.addrs, protocol)
    async with stream:
        if kind == "truncated":
            await _truncated(stream, rng, t, client_id, report)
            return
        if kind == "session" or (kind == "direct" and rng.random() < 0.5):
            opener = encode_frame(Open(os.urandom(16), client_id, t.model_id, t.start, t.end, 64, SamplingParams()))
            frames = [opener, *hostile_session_frames(rng, t, client_id, rng.randint(1, 8))]
        elif kind == "push":
            frames = [encode_frame(Attach(os.urandom(16))), *(
                encode_frame(Forward(step=1, pos0=0, hidden=np.zeros((1, t.n_embd), np.float32), push=True))
                if rng.random() < 0.5 else random_bytes(rng) for _ in range(rng.randint(0, 3)))]
        elif kind == "fields":
            frames = [mutated_fields(rng, t, client_id) for _ in range(rng.randint(1, 4))]
        elif kind == "random":
            frames = [random_bytes(rng) for _ in range(rng.randint(1, 4))]
        else:  # mutated, or the other half of direct
            frames = [mutate(rng, valid_frame(rng, t, client_id)) for _ in range(rng.randint(1, 4))]
        sent = await _send_all(stream, frames, report, kind)
        await _drain(stream, report, sent)


async def _truncated(stream: FramedStream, rng: random.Random, t: Target, client_id: str,
                     report: FuzzReport) -> None:
    """A length prefix and part of the body (or a huge length and nothing), then hang up."""
    if rng.random() < 0.3:
        length, body = rng.randint(1 << 20, MAX_FRAME_BYTES), b""
    else:
        whole = valid_frame(rng, t, client_id)
        length, body = len(whole), whole[: rng.randrange(len(whole))]
    writer = stream._writer  # a fuzzer writes what FramedStream refuses to: a frame it never finishes
    writer.write(struct.pack(">I", length) + body)
    await writer.drain()
    report.frames += 1
    report.by_kind["truncated"] += 1


async def fuzz_peer(transport: SwarmP2P, target: Target, n_frames: int, *, seed: int = 0, concurrency: int = 6,
                    idle_streams: int = 4) -> FuzzReport:
    """Send about `n_frames` random and mutated frames to `target` from `transport`'s peer id.

    Episodes of random kinds (`KINDS`) run `concurrency` at a time until `n_frames` frames are sent;
    `idle_streams` streams are opened first and held, unwritten, until the end. An episode whose
    stream cannot be opened (the peer refused it, e.g. BUSY at a limit) counts nothing.

    Args:
        transport: the fuzzing client's libp2p transport (its own peer id).
        target: the peer.
        n_frames: frames to send, about (an episode sends 1 to 9).
        seed: seeds every choice.
        concurrency: episodes at once.
        idle_streams: streams held open and silent.
    Returns:
        FuzzReport.
    """
    report = FuzzReport()
    rng = random.Random(seed)
    idle: list[FramedStream] = []
    for _ in range(idle_streams):
        try:
            idle.append(await transport.open_stream(target.peer_id, target.addrs, SPAN_PROTOCOL))
        except SwarmError:
            pass
    report.idle = len(idle)

    async def worker(wrng: random.Random) -> None:
        while report.frames < n_frames:
            try:
                await _episode(transport, target, wrng, wrng.choice(KINDS), report)
            except (SwarmError, OSError, TimeoutError):
                report.closed += 1

    try:
        await asyncio.gather(*(worker(random.Random(rng.random())) for _ in range(concurrency)))
    finally:
        for s in idle:
            await s.close()
    return report
