"""Limits per remote client on a real peer (issue 24, "What happens today" 3): one client can no
longer take every session slot, hold unbounded streams, starve another client's generation, or make
the peer buffer unbounded frame bytes.

One private `swarm serve` peer holds the whole of SmolLM2 with 8 session slots and the default
limits (4 sessions, 16 streams, 128 MiB in flight per client; 256 streams and 256 MiB in all), and
serves Prometheus metrics, which the tests read: streams open, refusals by limit, frame bytes in
flight at most, and the scheduler's holds (units held back for a lighter client's next step).
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from swarm import Client
from swarm.errors import SwarmError
from swarm.manifest import build_manifest
from swarm.peer.quotas import CLIENT_BYTES, CLIENT_STREAMS, MAX_BUFFERED_BYTES
from swarm.wire import Close, Error, ErrorCode, Forward, OpenOk, Token, decode_frame, encode_frame

from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, RawClient, free_port, opened, scrape, serve_args, wait_for

CLIENT_SESSIONS = 4  # the default: half of the 8 slots
REFUSED = 'swarm_peer_limit_refusals_total{limit="%s"}'
PROMPT = ", ".join(str(i) for i in range(1, 61)) + ","  # ~120 tokens: a prefill of two chunks, then counting


@pytest.fixture(scope="module")
def limited(smollm2_path, tmp_path_factory):
    ps = PeerSet(tmp_path_factory.mktemp("limits_peer"))
    port = free_port()
    peer = ps.start("p0", *serve_args(smollm2_path, "0:30", "--new-swarm", "--max-sessions", "8",
                                      "--metrics-port", str(port)))
    model_id = build_manifest(smollm2_path).model_id
    clients = [RawClient(peer, model_id, tmp_path_factory.mktemp(f"client{i}")) for i in range(2)]
    yield peer, port, clients
    for c in clients:
        c.close()
    ps.stop_all()
    assert peer.proc.returncode == 0, peer.stderr_text()[-2000:]


def _idle(port: int) -> dict:
    """The peer's metrics once every stream of earlier tests is gone."""
    return wait_for(lambda: scrape(port), "no stream open", until=lambda m: m["swarm_peer_streams_open"] == 0
                    and m["swarm_peer_sessions_open"] == 0)


def _close(c: RawClient, streams) -> None:
    for s in streams:
        try:
            c.send(s, encode_frame(Close()))
        except SwarmError:
            pass
        c.loop.run(s.close(), 30)


def test_one_client_cannot_take_every_session_slot(limited):
    peer, port, (greedy, modest) = limited
    _idle(port)
    held, replies = [], []
    for _ in range(CLIENT_SESSIONS + 1):
        s = greedy.stream()
        held.append(s)
        replies.append(greedy.ask(s, greedy.open_frame()))
    assert [opened(r) for r in replies[:CLIENT_SESSIONS]] == [64] * CLIENT_SESSIONS
    refusal = replies[-1]
    assert isinstance(refusal, Error) and refusal.code == ErrorCode.BUSY
    assert refusal.message.startswith("client limit: ") and "client_sessions 4" in refusal.message
    # 4 of 8 slots are still free: another client gets a session
    other = modest.stream()
    assert opened(modest.ask(other, modest.open_frame())) == 64
    _close(greedy, held)
    _close(modest, [other])


def _answer(c: RawClient, stream, frame: bytes):
    """The peer's answer to `frame`, or what it said before closing the stream (a refused stream)."""
    try:
        return c.ask(stream, frame)
    except SwarmError:
        return decode_frame(c.loop.run(stream.last_words(), 30))


async def _hammer(streams, stop: threading.Event, n_embd: int, replies: list) -> None:
    """Keep every session prefilling 256 rows from position 0 (rewinding) until `stop`; collect the
    replies in `replies`."""
    rng = np.random.default_rng(0)
    rows = (0.1 * rng.standard_normal((256, n_embd))).astype(np.float32)

    async def one(s) -> None:
        step = 0
        while not stop.is_set():
            step += 1
            await s.send(encode_frame(Forward(step=step, pos0=0, hidden=rows, rewind=True)))
            replies.append(decode_frame(await s.recv(60)))

    await asyncio.gather(*(one(s) for s in streams))


def test_a_client_holding_32_streams_cannot_starve_another_clients_generation(limited, smollm2_path):
    peer, port, (greedy, _) = limited
    before = _idle(port)
    streams = [greedy.stream() for _ in range(32)]
    # Streams past the client's 16 are refused at once; the first 16 stay open, waiting for an Open.
    m = wait_for(lambda: scrape(port), "16 of the 32 streams held and 16 refused",
                 until=lambda m: m[REFUSED % "client_streams"] - before.get(REFUSED % "client_streams", 0) == 16)
    assert m["swarm_peer_streams_open"] == CLIENT_STREAMS
    answers = [_answer(greedy, s, greedy.open_frame(max_tokens=512)) for s in streams]
    sessions = [s for s, a in zip(streams, answers) if isinstance(a, OpenOk)]
    reasons = sorted(a.message.split("(")[-1] for a in answers if isinstance(a, Error))
    assert all(a.code == ErrorCode.BUSY for a in answers if isinstance(a, Error))
    assert len(sessions) == CLIENT_SESSIONS
    assert reasons == ["client_sessions 4)"] * 12 + ["client_streams 16)"] * 16

    stop, hammered = threading.Event(), []
    n_embd = build_manifest(smollm2_path).n_embd
    load = asyncio.run_coroutine_threadsafe(_hammer(sessions, stop, n_embd, hammered), greedy.loop.loop)
    try:
        wait_for(lambda: len(hammered), "the greedy client's prefills running", until=lambda n: n >= 4)
        m = scrape(port)
        holds, stopped = m["swarm_peer_scheduler_holds_total"], m["swarm_peer_scheduler_preemptions_total"]
        with Client(str(smollm2_path), initial_peers=peer.maddrs) as modest:
            text = modest.generate(PROMPT, max_new_tokens=16).text
        m = scrape(port)
        holds = m["swarm_peer_scheduler_holds_total"] - holds
        stopped = m["swarm_peer_scheduler_preemptions_total"] - stopped
    finally:
        stop.set()
        load.result(120)
        _close(greedy, streams)
    assert text == oracle(smollm2_path, PROMPT, 16) and text.strip()
    assert hammered and all(isinstance(r, Token) for r in hammered)
    # Cost-weighted shares: the modest client, having used less, goes first, and the greedy
    # client's prefill chunks wait for its next steps instead of running in its round trips.
    assert holds > 0
    # Its first messages, and any that come after a gap not yet measured, stop the greedy chunk
    # running then (the greedy client's prefills go on: every one of its replies above is a Token).
    assert stopped > 0



def test_concurrent_huge_frames_never_hold_more_than_the_byte_budget(limited, tmp_path_factory):
    peer, port, _ = limited
    before = _idle(port)
    flooders = [RawClient(peer, "00", tmp_path_factory.mktemp(f"flood{i}")) for i in range(4)]
    try:
        futures = [asyncio.run_coroutine_threadsafe(c.flood(3, 60 << 20), c.loop.loop) for c in flooders]
        answers = [a for f in futures for a in f.result(600)]
    finally:
        for c in flooders:
            c.close()
    m = scrape(port)
    # 12 frames of 60 MiB from 4 clients: at most 4 were ever held at once (256 MiB).
    assert 60 << 20 <= m["swarm_peer_buffered_bytes_peak"] <= MAX_BUFFERED_BYTES
    for a in answers:
        # read and refused as a malformed frame, or refused unread at the client's own budget
        assert isinstance(a, Error), a
        assert a.code == ErrorCode.PROTOCOL or (a.code == ErrorCode.BUSY and "client_bytes" in a.message), a
    # Every refusal the peer counted reached its client (how many there are depends on how fast
    # the peer reads): the peer lingers after refusing, so the unread rest of the frame does not
    # reset the stream before the client reads the reason.
    refused = m.get(REFUSED % "client_bytes", 0) - before.get(REFUSED % "client_bytes", 0)
    assert sum(a.code == ErrorCode.BUSY for a in answers) == refused
    assert m["swarm_peer_buffered_bytes"] == 0


def test_a_frame_past_the_clients_own_byte_budget_is_refused_unread(limited):
    peer, port, (greedy, modest) = limited
    before = _idle(port)
    # two frames of 60 MiB announced and never sent: the peer holds 120 MiB for this client
    held = [greedy.stream() for _ in range(2)]
    for s in held:
        greedy.announce(s, 60 << 20)
    wait_for(lambda: scrape(port), "120 MiB reserved", until=lambda m: m["swarm_peer_buffered_bytes"] == 120 << 20)
    # a third would pass its 128 MiB: refused before its body is read, and the client reads why
    third = greedy.stream()
    answer = _answer(greedy, third, b"\x05" + bytes((60 << 20) - 1))
    assert isinstance(answer, Error) and answer.code == ErrorCode.BUSY, answer
    assert f"a frame of {60 << 20} more would pass client_bytes {CLIENT_BYTES}" in answer.message
    # another client's frame of the same size is read (and refused as the junk it is)
    other = modest.stream()
    junk = modest.ask(other, b"\x05" + bytes((60 << 20) - 1))
    assert isinstance(junk, Error) and junk.code == ErrorCode.PROTOCOL, junk
    m = scrape(port)
    assert m[REFUSED % "client_bytes"] - before.get(REFUSED % "client_bytes", 0) == 1
    # hanging up gives the held bytes back
    for s in held + [third]:
        greedy.loop.run(s.close(), 30)
    modest.loop.run(other.close(), 30)
    wait_for(lambda: scrape(port), "the held frames released", until=lambda m: m["swarm_peer_buffered_bytes"] == 0)
