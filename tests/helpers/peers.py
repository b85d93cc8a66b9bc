"""Helpers for tests with real peers: peer processes (the ones `swarm demo` uses), their `serve`
arguments, raw span streams, and polling with a deadline. The oracles are in `oracle.py`."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import urllib.request
from typing import Callable, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from swarm.client.loop import LoopThread
from swarm.dht.node import SwarmDHT
from swarm.errors import SwarmError
from swarm.localswarm import PeerProcess, PeerSet, descendants, signal_tree, start_peer
from swarm.p2p import PeerUnreachable, FramedStream
from swarm.limits import SPAN_PROTOCOL
from swarm.sampling import SamplingParams
from swarm.wire import Open, OpenOk, decode_frame, encode_frame

__all__ = [
    "PeerProcess",
    "PeerSet",
    "RawClient",
    "descendants",
    "free_port",
    "rss_bytes",
    "scrape",
    "serve_args",
    "signal_tree",
    "start_peer",
    "wait_for",
]

REPLY_S = 30.0
DEADLINE_S = 30.0
T = TypeVar("T")


def wait_for(
    probe: Callable[[], T], what: str, deadline_s: float = DEADLINE_S, *, until: Callable[[T], object] = bool
) -> T:
    """Poll `probe()` until `until(value)` holds and return that value (libtorrent's `loop_until_timeout`).

    This waits for a condition; it does not time anything. The deadline is generous, only there so a
    condition that never comes fails the test instead of hanging it.

    Args:
        probe: reads the observed state (a DHT read, a process's log, ...).
        what: the awaited condition, for the failure message.
        deadline_s: give up after this many seconds.
        until: the condition on the probe's value; by default the value itself is truthy.
    Returns:
        the first value that satisfied `until`.
    Raises:
        pytest.fail.Exception: past the deadline; the message names `what` and the last value observed.
    """
    deadline = time.monotonic() + deadline_s
    interval_s = 0.02
    while True:
        value = probe()
        if until(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {deadline_s:.0f} s; last observed: {value!r:.2000}")
        time.sleep(interval_s)  # the poll interval of this wait, not a synchronisation
        interval_s = min(2 * interval_s, 0.5)


def serve_args(path, layers: str, *extra: str) -> tuple[str, ...]:
    # Each session's own KV stream holds cache-tokens / max-sessions cells: 32,768 gives every one
    # of the 8 default sessions 4,096, the most one session could use of the 4,096 shared cells
    # these tests had before the per-session streams.
    return (
        "serve",
        "--model",
        str(path),
        "--layers",
        layers,
        "--threads",
        "1",
        "--cache-tokens",
        "32768",
        *extra,
    )


class RawClient:
    """A client-mode DHT node on its own loop thread that opens raw span streams to one peer."""

    def __init__(self, peer, model_id: str, tmp, span: tuple[int, int] = (0, 30)):
        self.peer, self.model_id, self.span = peer, model_id, span
        self.loop = LoopThread()
        self.dht: SwarmDHT = self.loop.run(
            SwarmDHT.start(peer.maddrs, client_mode=True, data_dir=str(tmp)), 60
        )

    def stream(self) -> FramedStream:
        opening = self.dht.transport.open_stream(self.peer.peer_id, self.peer.maddrs, SPAN_PROTOCOL)
        return self.loop.run(opening, 30)

    def send(self, stream: FramedStream, data: bytes) -> None:
        self.loop.run(stream.send(data), 30)

    def recv(self, stream: FramedStream, timeout_s: float = REPLY_S):
        """The next frame from the peer, decoded; `timeout_s` only guards against a hang."""
        return decode_frame(self.loop.run(stream.recv(timeout_s), timeout_s + 5))

    def ask(self, stream: FramedStream, data: bytes, timeout_s: float = REPLY_S):
        self.send(stream, data)
        return self.recv(stream, timeout_s)

    def assert_closed(self, stream: FramedStream) -> None:
        """The peer ended this stream: the next read finds it closed (no frame, no hang)."""
        with pytest.raises(PeerUnreachable):
            self.loop.run(stream.recv(REPLY_S), REPLY_S + 5)

    def open_frame(
        self,
        *,
        max_tokens: int = 64,
        span: tuple[int, int] | None = None,
        model_id: str | None = None,
        client_id: str | None = None,
    ) -> bytes:
        start, end = span or self.span
        return encode_frame(
            Open(
                session_id=os.urandom(16),
                client_id=client_id or self.dht.peer_id,
                model_id=model_id or self.model_id,
                start=start,
                end=end,
                max_tokens=max_tokens,
                sampling=SamplingParams(),
            )
        )

    def open_session(self, max_tokens: int = 64) -> FramedStream:
        s = self.stream()
        reply = self.ask(s, self.open_frame(max_tokens=max_tokens))
        assert opened(reply) == max_tokens
        return s

    async def flood(self, n_frames: int, frame_bytes: int, timeout_s: float = 120.0) -> list:
        """Send `n_frames` junk frames of `frame_bytes` at once, each on its own span stream (run on
        this client's loop). Returns each stream's answer (an `Error` frame when refused), or None
        when the peer hung up without one."""
        junk = b"\x05" + bytes(frame_bytes - 1)
        streams = [await self.dht.transport.open_stream(self.peer.peer_id, self.peer.maddrs, SPAN_PROTOCOL)
                   for _ in range(n_frames)]

        async def one(s):
            try:
                await s.send(junk)
                return decode_frame(await s.recv(timeout_s))
            except SwarmError:  # refused unread: the peer answered and hung up while the frame was sent
                said = await s.last_words()
                return decode_frame(said) if said is not None else None
            finally:
                await s.close()

        return await asyncio.gather(*(one(s) for s in streams))

    def announce(self, stream: FramedStream, n_bytes: int) -> None:
        """Send only the length header of a frame of `n_bytes` (its body never follows): the peer
        reserves the frame's bytes when it reads the header. Written by hand: `FramedStream` sends
        whole frames only."""
        async def header() -> None:
            stream._writer.write(n_bytes.to_bytes(4, "big"))  # noqa: SLF001 - swarm.p2p's >I length prefix
            await stream._writer.drain()  # noqa: SLF001

        self.loop.run(header(), 30)

    def close(self) -> None:
        self.loop.run(self.dht.shutdown(), 30)
        self.loop.stop()


def opened(reply):
    """The tokens an `OpenOk` reserved, or the reply itself when it is not one (so an assertion shows
    the Error); the rest of an OpenOk (e.g. `verify_rows`, measured per model) is not compared."""
    return reply.reserved_tokens if isinstance(reply, OpenOk) else reply


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a peer's --metrics-port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """A peer's Prometheus metrics on 127.0.0.1:`port`: {sample name with its labels: value}, e.g.
    "swarm_peer_buffered_bytes_peak" or 'swarm_peer_limit_refusals_total{limit="client_streams"}'."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "span")
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (VmRSS), bytes."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for pid {pid}")
