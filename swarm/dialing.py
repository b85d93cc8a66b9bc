"""Opening a stream to a peer: direct (swarm/direct.py) raced against libp2p.

A peer that announces direct endpoints may be unreachable at them (a direct port not forwarded or
firewalled drops the dial silently, and the dial would wait DIAL_TIMEOUT_S), so `open_stream` starts
direct first and libp2p when direct has not connected within DIRECT_HEAD_START_S (happy eyeballs,
RFC 8305): whichever opens first wins, the other is abandoned, cancelled or closed.
`OpenedStream.attempts` records the order in which the two finished, and `direct_error` names the
endpoints and the cause.

This module does not remember which transport worked for a peer (swarm/client/streams.py does).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable, NamedTuple

from swarm.direct import dial
from swarm.errors import PeerTimeout, SwarmError
from swarm.p2p import FramedStream, SwarmP2P

logger = logging.getLogger(__name__)


class OpenedStream(NamedTuple):
    """What `open_stream` opened.

    Attributes:
        stream: the open stream.
        kind: "direct" or "libp2p".
        direct_error: why a direct stream was not used when endpoints were tried ("" otherwise); it
            names the endpoints and the cause.
        attempts: what happened, in order, e.g. ("libp2p opened", "direct abandoned: ..."), so a
            caller (and a test) can tell which transport finished first and whether one was waited for.
    """

    stream: FramedStream
    kind: str
    direct_error: str = ""
    attempts: tuple[str, ...] = ()


DIRECT_HEAD_START_S = 0.25
"""Libp2p is dialled only when direct has not connected this long after it started (RFC 8305's
"Connection Attempt Delay"): a reachable endpoint connects within it (a ticket round trip plus one
TCP handshake), so the peer sees one stream, not two; an unforwarded one costs this once per peer
(the client then remembers it: swarm/client/streams.py, DIRECT_RETRY_S), not DIAL_TIMEOUT_S."""


async def open_stream(
    transport: SwarmP2P,
    peer_id: str,
    addrs: Iterable[str],
    endpoints: Iterable[str],
    protocol: str,
    timeout_s: float,
) -> OpenedStream:
    """A stream to `peer_id` for `protocol`: direct when it connects; libp2p, started when direct has
    failed or not connected within DIRECT_HEAD_START_S, when direct fails or libp2p opens first (then
    direct is abandoned). The loser is cancelled, or closed if it opened too.

    Raises:
        PeerUnreachable: neither could open the stream (the text says why each failed).
        PeerTimeout: the libp2p stream was not open within timeout_s and direct failed too.
    """
    endpoints, addrs = tuple(endpoints), tuple(addrs)
    if not endpoints:
        return OpenedStream(await _open_libp2p(transport, peer_id, addrs, protocol, timeout_s), "libp2p",
                            attempts=("libp2p opened",))
    progress: list[str] = []
    attempts: list[str] = []
    direct = asyncio.create_task(dial(transport, peer_id, addrs, endpoints, protocol, timeout_s, progress))
    libp2p: asyncio.Task | None = None
    used: asyncio.Task | None = None
    try:
        await asyncio.wait({direct}, timeout=DIRECT_HEAD_START_S)
        if not (direct.done() and direct.exception() is None):
            libp2p = asyncio.create_task(_open_libp2p(transport, peer_id, addrs, protocol, timeout_s))
            done, _ = await asyncio.wait({direct, libp2p}, return_when=asyncio.FIRST_COMPLETED)
            if direct not in done and libp2p.exception() is None:
                why = (f"direct dial abandoned: libp2p, started {DIRECT_HEAD_START_S * 1000:.0f} ms after direct, "
                       f"opened first; direct was still {progress[-1] if progress else 'starting'} (no answer: "
                       "a port not forwarded or firewalled?)")
                attempts += ["libp2p opened", f"direct abandoned: {why}"]
                logger.info("direct stream to %s not used: %s", peer_id[:12], why)
                used = libp2p
                return OpenedStream(libp2p.result(), "libp2p", why, tuple(attempts))
            await asyncio.wait({direct})  # libp2p failed first: direct is the only way left
        if direct.exception() is None:
            attempts.append("direct opened")
            used = direct
            return OpenedStream(direct.result(), "direct", "", tuple(attempts))
        why = str(direct.exception()) or type(direct.exception()).__name__
        attempts.append(f"direct failed: {why}")
        logger.info("direct stream to %s failed, using libp2p: %s", peer_id[:12], why)
        if libp2p is None:  # direct failed within its head start
            libp2p = asyncio.create_task(_open_libp2p(transport, peer_id, addrs, protocol, timeout_s))
        try:
            stream = await libp2p
        except SwarmError as e:
            raise type(e)(f"{e} (and the direct stream failed: {why})") from e
        attempts.append("libp2p opened")
        used = libp2p
        return OpenedStream(stream, "libp2p", why, tuple(attempts))
    finally:
        tasks = [t for t in (direct, libp2p) if t is not None]
        for task in tasks:
            task.cancel()
        for task, result in zip(tasks, await asyncio.gather(*tasks, return_exceptions=True)):
            if task is not used and isinstance(result, FramedStream):
                await result.close()  # the loser had opened too


async def _open_libp2p(transport: SwarmP2P, peer_id: str, addrs: tuple[str, ...], protocol: str,
                       timeout_s: float) -> FramedStream:
    try:
        async with asyncio.timeout(timeout_s):
            return await transport.open_stream(peer_id, addrs, protocol)
    except TimeoutError:
        raise PeerTimeout(f"peer {peer_id[:12]}… did not accept a stream within {timeout_s:.1f} s") from None
