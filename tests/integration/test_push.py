"""Server push on real peers: who may push into a session, what a pushed step answers, stale and
rewound pushes, a hop whose push fails answering the client so that it can relay, and a hop that
dies between pushing a step and answering it.

`swarm serve` peers of SmolLM2: 0:15 and 15:30, and a second 0:15 that dies after its fifth push.
Raw clients play both the client and, for the 15:30 peer, the pushing first hop: every frame is the
real wire format over real libp2p streams. The oracle for a pushed step is the same rows sent by the
client itself (relay), which the chain parity tests tie to llama.cpp; for a generation, llama.cpp's
whole-model text.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from swarm.manifest import build_manifest
from swarm.limits import PUSH_PROTOCOL
from swarm.wire import Attach, Chain, Error, ErrorCode, Forward, Hidden, Open, Token, encode_frame

from swarm import Client

from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, RawClient, opened, serve_args

RNG = np.random.default_rng(11)
ROWS = RNG.standard_normal((5, 576)).astype(np.float32)


@pytest.fixture(scope="module")
def push_peers(smollm2_path, tmp_path_factory):
    ps = PeerSet(tmp_path_factory.mktemp("push_peers"))
    first = ps.start("p0", *serve_args(smollm2_path, "0:15", "--new-swarm"))
    ps.start("p1", *serve_args(smollm2_path, "15:30", "--initial-peers", first.maddrs[0]))
    ps.start("dies", *serve_args(smollm2_path, "0:15", "--initial-peers", first.maddrs[0],
                                 "--debug-die-after-pushes", "5"))
    yield ps
    ps.stop_all()


@pytest.fixture(scope="module")
def clients(push_peers, smollm2_path, tmp_path_factory):
    """Raw clients: `last` and `pusher` talk to the 15:30 peer, `first` to the 0:15 peer."""
    model_id = build_manifest(smollm2_path).model_id
    p0, p1, _ = push_peers.started
    made = {
        "last": RawClient(p1, model_id, tmp_path_factory.mktemp("last"), span=(15, 30)),
        "pusher": RawClient(p1, model_id, tmp_path_factory.mktemp("pusher"), span=(15, 30)),
        "first": RawClient(p0, model_id, tmp_path_factory.mktemp("first"), span=(0, 15)),
    }
    yield made
    for c in made.values():
        c.close()


def _session(c: RawClient):
    """(stream, session id) of a new 64-token session."""
    s = c.stream()
    session_id = os.urandom(16)
    frame = Open(session_id=session_id, client_id=c.dht.peer_id, model_id=c.model_id, start=c.span[0],
                 end=c.span[1], max_tokens=64)
    assert opened(c.ask(s, encode_frame(frame))) == 64
    return s, session_id


def _push_stream(c: RawClient, session_id: bytes):
    s = c.loop.run(c.dht.transport.open_stream(c.peer.peer_id, c.peer.maddrs, PUSH_PROTOCOL), 30)
    return s, c.ask(s, encode_frame(Attach(session_id)))


def _relayed(c: RawClient, steps: list[tuple[int, np.ndarray]]) -> list:
    """The answers of a fresh session to `steps` (pos0, rows) sent by the client itself."""
    s, _ = _session(c)
    return [c.ask(s, encode_frame(Forward(step=i, pos0=p, hidden=x))) for i, (p, x) in enumerate(steps)]


def test_only_the_named_previous_peer_may_push_into_a_session(clients):
    last, pusher = clients["last"], clients["pusher"]
    s, session_id = _session(last)
    # chained to accept pushes from another peer (the 0:15 peer), not from `pusher`
    other = clients["first"].peer.peer_id
    assert opened(last.ask(s, encode_frame(Chain(prev_peer=other)))) == 64
    _, reply = _push_stream(pusher, session_id)
    assert isinstance(reply, Error) and reply.code == ErrorCode.FORBIDDEN
    _, reply = _push_stream(pusher, os.urandom(16))  # no such session
    assert isinstance(reply, Error) and reply.code == ErrorCode.FORBIDDEN


def test_a_pushed_step_is_answered_to_the_client_stale_pushes_are_dropped_rewinds_recompute(clients):
    last, pusher = clients["last"], clients["pusher"]
    a, b = ROWS[:3], ROWS[3:4]
    want = _relayed(last, [(0, a), (3, b)])
    s, session_id = _session(last)
    assert opened(last.ask(s, encode_frame(Chain(prev_peer=pusher.dht.peer_id)))) == 64
    push, reply = _push_stream(pusher, session_id)
    assert opened(reply) == 64

    pusher.send(push, encode_frame(Forward(step=5, pos0=0, hidden=a, push=True)))
    got = last.recv(s)
    assert isinstance(got, Token) and got.step == 5
    assert (got.token, got.logprob) == (want[0].token, want[0].logprob)
    # A push at a position the session has passed is stale: dropped without an answer, so the next
    # answer the client reads is step 7's.
    pusher.send(push, encode_frame(Forward(step=6, pos0=0, hidden=a, push=True)))
    pusher.send(push, encode_frame(Forward(step=7, pos0=3, hidden=b, push=True)))
    got = last.recv(s)
    assert got.step == 7 and (got.token, got.logprob) == (want[1].token, want[1].logprob)
    # With rewind, it rolls the session back and computes the step again: the same answer.
    pusher.send(push, encode_frame(Forward(step=8, pos0=3, hidden=b, push=True, rewind=True)))
    got = last.recv(s)
    assert got.step == 8 and (got.token, got.logprob) == (want[1].token, want[1].logprob)


def test_a_hop_whose_push_fails_answers_unpushed_with_the_same_hidden_state(clients):
    first = clients["first"]
    want = _relayed(first, [(0, ROWS[:3])])[0]
    s, _ = _session(first)
    chain = Chain(next_peer=clients["last"].peer.peer_id, next_session=os.urandom(16),  # no such session
                  next_addrs=tuple(clients["last"].peer.maddrs))
    assert opened(first.ask(s, encode_frame(chain))) == 64
    got = first.ask(s, encode_frame(Forward(step=0, pos0=0, hidden=ROWS[:3], push=True)))
    assert isinstance(got, Hidden) and not got.pushed
    assert got.hidden.tobytes() == want.hidden.tobytes()
    got = first.ask(s, encode_frame(Forward(step=1, pos0=3, hidden=ROWS[3:4], push=True)))
    assert isinstance(got, Hidden) and not got.pushed  # it stopped trying; the session goes on


def test_the_last_span_refuses_to_push(clients):
    last = clients["last"]
    s, _ = _session(last)
    chain = Chain(next_peer=clients["first"].peer.peer_id, next_session=os.urandom(16))
    got = last.ask(s, encode_frame(chain))
    assert isinstance(got, Error) and got.code == ErrorCode.BAD_REQUEST and "last span" in got.message


def test_a_hop_that_dies_after_pushing_is_replaced_and_the_next_hop_rewinds(push_peers, smollm2_path):
    """The 0:15 hop pushes a decode step to 15:30 and dies before answering the client: the client
    replaces it, replays, and finishes the step by relay with rewind; 15:30, which already ran the
    pushed step, rolls back and runs it again; its answer to the abandoned step is skipped."""
    p0, p1, dies = push_peers.started
    prompt = "The three most important inventions of the twentieth century are"
    with Client(str(smollm2_path), initial_peers=p0.maddrs) as client:
        client._engine.directory.rtt_ms[p0.peer_id] = 500.0  # noqa: SLF001 - route through the dying peer first
        got = client.generate(prompt, max_new_tokens=12)
    assert got.text == oracle(smollm2_path, prompt, 12)
    [f] = got.telemetry.failovers
    assert (f.peer_id, f.start, f.end, f.replacements) == (dies.peer_id, 0, 15, [p0.peer_id])
    assert f.position == got.telemetry.prompt_tokens + 3  # prefill + 3 decode steps pushed, the 4th lost
    last = got.telemetry.route[1]
    assert last.peer_id == p1.peer_id and last.skipped_replies == 1


def test_garbage_on_a_push_stream_ends_only_that_stream(clients):
    """A pushing peer that sends a malformed frame, or a frame that is not a pushed Forward, loses
    its push stream; the session it pushed into is still served by its client."""
    last, pusher = clients["last"], clients["pusher"]
    want = _relayed(last, [(0, ROWS[:3])])[0]
    s, session_id = _session(last)
    assert opened(last.ask(s, encode_frame(Chain(prev_peer=pusher.dht.peer_id)))) == 64
    for bad in (b"\x03garbage", encode_frame(Forward(step=1, pos0=0, hidden=ROWS[:3]))):  # not push
        push, reply = _push_stream(pusher, session_id)
        assert opened(reply) == 64
        pusher.send(push, bad)
        pusher.assert_closed(push)
    got = last.ask(s, encode_frame(Forward(step=2, pos0=0, hidden=ROWS[:3])))
    assert isinstance(got, Token) and (got.step, got.token) == (2, want.token)
