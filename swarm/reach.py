"""Dial-back probes: a peer learns from other peers whether it can be dialled from outside.

Asking (`ask_dialback`, `ReachabilityMonitor`): the peer opens a libp2p stream (outbound, so the
asked peer sees the address its connection comes from) for REACH_PROTOCOL and sends one request:
a fresh 16-byte nonce, its direct port and its libp2p port. Answering (`DialBackResponder`): the
asked peer dials the *observed host* (never a host the asker names) at those ports, presents the
nonce on the direct port as a direct listener's first frame, only opens and closes a TCP connection
on the libp2p port, and answers what it saw and what worked. The asker trusts its own listener: the
direct port counts as reached only when the nonce arrived there (`DirectServer.expect_nonce`).

Messages are msgpack maps, one frame each way (at most MAX_MESSAGE_BYTES):
    request  {"nonce": 16 bytes, "direct_port": int (0: none), "libp2p_port": int (0: none)}
    answer   {"seen": the multiaddr the request came from, "direct": "ok" | why not | "",
              "libp2p": "ok" | why not | "", "refused": "" | why the request was refused}

What the answers mean, which addresses follow and the answerer's budget are swarm/reach_rules.py.
`ReachabilityMonitor.current` is the hook the rest of the peer reads (announcement, relaying).

This module does not decide (reach_rules) and does not announce (swarm/peer/announce.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence

import msgpack

from swarm.errors import SwarmError
from swarm.limits import REACH_PROTOCOL
from swarm.netaddr import maddr_host_port
from swarm.p2p import FramedStream, SwarmP2P
from swarm.reach_rules import (
    UNKNOWN,
    DialBackAnswer,
    DialBackBudget,
    Reachability,
    decide,
    dialback_targets,
    forced,
)

logger = logging.getLogger(__name__)

NONCE_BYTES = 16
"""A dial-back nonce's length: a direct ticket's (swarm.direct.TICKET_BYTES), so the direct listener
reads it as a connection's first frame."""
MAX_MESSAGE_BYTES = 512
DIALBACK_TIMEOUT_S = 3.0
"""The answering peer gives up one TCP dial-back after this long."""
ASK_TIMEOUT_S = 10.0
"""A request, its dial-backs and the answer: the asker gives up after this long."""
NONCE_WAIT_S = 2.0
"""After an answer saying the direct dial-back connected, how long the asker waits for its listener
to have read the nonce (the two arrive on different connections)."""
MAX_ASKED = 3
"""Peers asked per probe."""
REPROBE_S = 600.0
"""A peer that knows its reachability probes again this often (a router or forward may change)."""

Helpers = Callable[[], Awaitable[Sequence[tuple[str, tuple[str, ...]]]]]
"""Coroutine function giving peers to ask: (peer id, multiaddrs) pairs."""


def encode_request(nonce: bytes, direct_port: int, libp2p_port: int) -> bytes:
    """The request frame (see the module docstring)."""
    return msgpack.packb({"nonce": nonce, "direct_port": direct_port, "libp2p_port": libp2p_port})


def decode_request(data: bytes) -> tuple[bytes, int, int]:
    """(nonce, direct_port, libp2p_port) of a request frame; ports 0 mean none.

    Raises:
        ValueError: not a well-formed request.
    """
    try:
        msg = msgpack.unpackb(data, raw=False)
    except Exception as e:  # msgpack raises several types on malformed input
        raise ValueError(f"a dial-back request that is not msgpack: {e}") from None
    if not isinstance(msg, dict):
        raise ValueError("a dial-back request must be a map")
    nonce, direct, libp2p = msg.get("nonce"), msg.get("direct_port", 0), msg.get("libp2p_port", 0)
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise ValueError(f"a dial-back request needs a {NONCE_BYTES}-byte nonce")
    for port in (direct, libp2p):
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"dial-back ports must be integers in 0..65535, got {port!r:.20}")
    return nonce, direct, libp2p


def decode_answer(data: bytes) -> dict[str, str]:
    """The answer frame's four strings ("" where absent). Raises ValueError when malformed."""
    try:
        msg = msgpack.unpackb(data, raw=False)
    except Exception as e:  # msgpack raises several types on malformed input
        raise ValueError(f"a dial-back answer that is not msgpack: {e}") from None
    if not isinstance(msg, dict):
        raise ValueError("a dial-back answer must be a map")
    out = {k: msg.get(k, "") for k in ("seen", "direct", "libp2p", "refused")}
    if not all(isinstance(v, str) for v in out.values()):
        raise ValueError("a dial-back answer's fields are strings")
    return out


class DialBackResponder:
    """Answers dial-back requests on REACH_PROTOCOL within a `DialBackBudget`.

    Args:
        budget: the dial-backs this peer makes (default: reach_rules' limits).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, budget: DialBackBudget | None = None, clock: Callable[[], float] = time.monotonic):
        self._budget, self._clock = budget or DialBackBudget(), clock

    async def serve(self, transport: SwarmP2P) -> None:
        """Answer requests arriving on `transport`."""
        await transport.serve(REACH_PROTOCOL, self.handle, max_frame_bytes=MAX_MESSAGE_BYTES)

    async def handle(self, stream: FramedStream) -> None:
        """One request: check it, dial back the observed host, answer."""
        answer = {"seen": stream.remote_addr, "direct": "", "libp2p": "", "refused": ""}
        try:
            nonce, direct_port, libp2p_port = decode_request(await stream.recv(ASK_TIMEOUT_S))
            ports = [p for p in (direct_port, libp2p_port) if p]
            targets = dialback_targets(stream.remote_addr, ports)
        except ValueError as e:
            answer["refused"] = str(e)
        else:
            why_not = self._budget.grant(stream.remote_peer_id, self._clock())
            if why_not is not None:
                answer["refused"] = why_not
            else:
                results = await asyncio.gather(*(
                    _dial_back(host, port, nonce if port == direct_port else None) for host, port in targets
                ))
                for (_, port), result in zip(targets, results):
                    answer["direct" if port == direct_port else "libp2p"] = result
        await stream.send(msgpack.packb(answer))


async def _dial_back(host: str, port: int, nonce: bytes | None) -> str:
    """Connect to host:port (and present `nonce` as the first frame): "ok", or why not."""
    try:
        async with asyncio.timeout(DIALBACK_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return f"timed out after {DIALBACK_TIMEOUT_S:.1f} s dialling {host}:{port}"
    except OSError as e:
        return f"{os.strerror(e.errno) if e.errno else e} dialling {host}:{port}"
    conn = FramedStream("(dial-back)", REACH_PROTOCOL, reader, writer, NONCE_BYTES)
    try:
        if nonce is not None:
            await conn.send(nonce)
    except SwarmError as e:
        return f"{host}:{port} broke while the nonce was sent: {e}"
    finally:
        await conn.close()
    return "ok"


async def ask_dialback(
    transport: SwarmP2P,
    peer_id: str,
    addrs: Sequence[str],
    expect_nonce: Callable[[bytes], asyncio.Future] | None,
    forget_nonce: Callable[[bytes], None],
    direct_port: int | None,
    libp2p_port: int | None,
) -> DialBackAnswer:
    """Ask `peer_id` to dial this peer back; never raises (a failure is the answer's `error`).

    Args:
        transport: this peer's libp2p transport (the request goes out on it).
        addrs: the asked peer's multiaddrs.
        expect_nonce, forget_nonce: the direct listener's `DirectServer.expect_nonce` and
            `forget_nonce` (None: no direct listener).
        direct_port, libp2p_port: this peer's listen ports (None: not to be tried).
    """
    nonce = secrets.token_bytes(NONCE_BYTES)
    arrived = expect_nonce(nonce) if expect_nonce is not None and direct_port else None
    answer = {"seen": "", "direct": "", "libp2p": "", "refused": ""}
    try:
        async with asyncio.timeout(ASK_TIMEOUT_S):
            async with await transport.open_stream(
                peer_id, addrs, REACH_PROTOCOL, max_frame_bytes=MAX_MESSAGE_BYTES
            ) as s:
                await s.send(encode_request(nonce, direct_port or 0, libp2p_port or 0))
                answer = decode_answer(await s.recv(ASK_TIMEOUT_S))
            if answer["refused"]:
                return DialBackAnswer(peer_id, error=f"refused: {answer['refused']}")
            if arrived is not None and answer["direct"] == "ok":
                await asyncio.wait_for(asyncio.shield(arrived), NONCE_WAIT_S)
    except TimeoutError:
        if arrived is None or not arrived.done():
            return DialBackAnswer(peer_id, error=f"no answer within {ASK_TIMEOUT_S:.0f} s")
    except (SwarmError, ValueError) as e:
        return DialBackAnswer(peer_id, error=str(e) or type(e).__name__)
    finally:
        if expect_nonce is not None:
            forget_nonce(nonce)
    host = _host_of(answer["seen"])
    return DialBackAnswer(
        peer_id,
        observed_host=host,
        direct_ok=arrived is not None and arrived.done(),
        libp2p_ok=None if not libp2p_port else answer["libp2p"] == "ok",
    )


class ReachabilityMonitor:
    """This peer's reachability: forced by `--reachability`, or probed by dial-backs at start and
    again every REPROBE_S (every `retry_s` while unknown).

    The hook for the rest of the peer: read `current` (a `reach_rules.Reachability`), e.g.
    `monitor.current.private` to decide to take a relay; `on_change` callbacks run when the status
    or the confirmed address changes.

    Args:
        mode: "auto", "public" or "private" (reach_rules.MODES).
        transport: this peer's libp2p transport.
        helpers: coroutine function giving peers to ask (at most MAX_ASKED are asked).
        expect_nonce, forget_nonce: the direct listener's, or None without one.
        direct_port, libp2p_port: this peer's listen ports (None: not to be tried).
        retry_s: probe period while the result is unknown (the announce period).
    """

    def __init__(self, mode: str, transport: SwarmP2P, helpers: Helpers,
                 expect_nonce: Callable[[bytes], asyncio.Future] | None,
                 forget_nonce: Callable[[bytes], None],
                 direct_port: int | None, libp2p_port: int | None, retry_s: float = 30.0):
        self.mode = mode
        self.current = forced(mode) if mode != "auto" else Reachability(UNKNOWN, reason="not probed yet")
        self.on_change: list[Callable[[Reachability], None]] = []
        self._transport, self._helpers = transport, helpers
        self._expect, self._forget = expect_nonce, forget_nonce
        self._direct_port, self._libp2p_port, self._retry_s = direct_port, libp2p_port, retry_s

    async def probe(self) -> Reachability:
        """Ask up to MAX_ASKED peers now and keep the result (forced modes: no probe)."""
        if self.mode != "auto":
            return self.current
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):  # a DHT read may hang on a frozen node
                helpers = [h for h in await self._helpers() if h[0] != self._transport.peer_id][:MAX_ASKED]
        except (SwarmError, TimeoutError) as e:
            helpers = []
            logger.info("no peers to ask for a dial-back: %s", str(e) or f"none within {ASK_TIMEOUT_S:.0f} s")
        answers = await asyncio.gather(*(
            ask_dialback(self._transport, pid, addrs, self._expect, self._forget,
                         self._direct_port, self._libp2p_port)
            for pid, addrs in helpers
        ))
        result = decide(answers, has_direct=self._direct_port is not None)
        changed = (result.status, result.observed_host) != (self.current.status, self.current.observed_host)
        self.current = result
        if changed:
            logger.info("reachability %s: %s", result.status, result.reason)
            for callback in self.on_change:
                callback(result)
        return result

    async def run(self) -> None:
        """Probe again every REPROBE_S (retry_s while unknown) until cancelled."""
        if self.mode != "auto":
            return
        while True:
            await asyncio.sleep(self.retry_s_now)
            await self.probe()

    @property
    def retry_s_now(self) -> float:
        """Seconds until the next probe: sooner while nothing is known."""
        return self._retry_s if self.current.status == UNKNOWN else REPROBE_S


def _host_of(maddr: str) -> str:
    hp = maddr_host_port(maddr)
    return "" if hp is None else hp[0]
