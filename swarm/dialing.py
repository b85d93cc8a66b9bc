"""Opening a stream to a peer: direct (swarm/direct.py) and libp2p dialled at once.

A peer that announces direct endpoints may be unreachable at them (a direct port not forwarded or
firewalled drops the dial silently, and the dial would wait DIAL_TIMEOUT_S), so `open_stream` starts
both and keeps direct only when it connects in time: when libp2p opens first, direct gets a grace of
DIRECT_GRACE_FACTOR times libp2p's opening time (at least DIRECT_GRACE_MIN_S) more, then is
abandoned. The loser is cancelled, or closed when it opened too. `OpenedStream.attempts` records
the order in which the two finished, and `direct_error` names the endpoints and the cause.

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


DIRECT_GRACE_MIN_S = 0.1
DIRECT_GRACE_FACTOR = 3.0
"""When libp2p opens first, the direct dial gets DIRECT_GRACE_FACTOR times libp2p's time (at least
DIRECT_GRACE_MIN_S) more to finish: a reachable endpoint needs a ticket round trip plus one TCP
handshake, about twice a libp2p stream's opening, while an unforwarded one never answers. So a dead
endpoint costs a hop at most this grace once (not DIAL_TIMEOUT_S); the client then remembers it
(swarm/client/streams.py, DIRECT_RETRY_S) and dials libp2p alone."""


async def open_stream(
    transport: SwarmP2P,
    peer_id: str,
    addrs: Iterable[str],
    endpoints: Iterable[str],
    protocol: str,
    timeout_s: float,
) -> OpenedStream:
    """A stream to `peer_id` for `protocol`: direct and libp2p dialled at once; direct is used when it
    connects, libp2p when direct fails or is still not open a grace after libp2p opened (so an
    unforwarded direct port costs no DIAL_TIMEOUT_S). The loser is cancelled, or closed if it opened.

    Raises:
        PeerUnreachable: neither could open the stream (the text says why each failed).
        PeerTimeout: the libp2p stream was not open within timeout_s and direct failed too.
    """
    endpoints, addrs = tuple(endpoints), tuple(addrs)
    if not endpoints:
        return OpenedStream(await _open_libp2p(transport, peer_id, addrs, protocol, timeout_s), "libp2p",
                            attempts=("libp2p opened",))
    loop = asyncio.get_running_loop()
    t0, progress, attempts = loop.time(), [], []
    direct = asyncio.create_task(dial(transport, peer_id, addrs, endpoints, protocol, timeout_s, progress))
    libp2p = asyncio.create_task(_open_libp2p(transport, peer_id, addrs, protocol, timeout_s))
    used: asyncio.Task | None = None
    try:
        done, _ = await asyncio.wait({direct, libp2p}, return_when=asyncio.FIRST_COMPLETED)
        if direct not in done and libp2p.exception() is None:
            attempts.append("libp2p opened")
            grace_s = max(DIRECT_GRACE_MIN_S, DIRECT_GRACE_FACTOR * (loop.time() - t0))
            await asyncio.wait({direct}, timeout=grace_s)
            if not direct.done():
                why = (f"direct dial abandoned {grace_s * 1000:.0f} ms after libp2p opened, still "
                       f"{progress[-1] if progress else 'starting'} (no answer: a port not forwarded "
                       "or firewalled?)")
                attempts.append(f"direct abandoned: {why}")
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
        try:
            stream = await libp2p
        except SwarmError as e:
            raise type(e)(f"{e} (and the direct stream failed: {why})") from e
        if "libp2p opened" not in attempts:
            attempts.append("libp2p opened")
        used = libp2p
        return OpenedStream(stream, "libp2p", why, tuple(attempts))
    finally:
        for task in (direct, libp2p):
            task.cancel()
        for task, result in zip((direct, libp2p), await asyncio.gather(direct, libp2p, return_exceptions=True)):
            if task is not used and isinstance(result, FramedStream):
                await result.close()  # the loser had opened too


async def _open_libp2p(transport: SwarmP2P, peer_id: str, addrs: tuple[str, ...], protocol: str,
                       timeout_s: float) -> FramedStream:
    try:
        async with asyncio.timeout(timeout_s):
            return await transport.open_stream(peer_id, addrs, protocol)
    except TimeoutError:
        raise PeerTimeout(f"peer {peer_id[:12]}… did not accept a stream within {timeout_s:.1f} s") from None
