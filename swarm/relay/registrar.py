"""The relayed peer's side: choose a relay, stay registered, answer its dial requests.

A peer that cannot be dialled (`--reachability private`) reads the relays' offers from the DHT,
measures the TCP round trip to each, registers with the nearest one that has room
(swarm.relay.rules.choose_relay), and announces that relay's addresses. For each dial request on
the control connection it opens a data connection to the relay, answers the handshake as responder
and runs the stream's handler like a direct stream's. When the control connection fails (the relay
died, froze or dropped it) it avoids that relay for `AVOID_S`, registers with another and tells the
announcer at once, so clients learn the new address within one DHT store.

This module does not announce (its `on_relay` callback does) or serve frames (the handlers do).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping

from swarm.dht.node import SwarmDHT
from swarm.errors import SwarmError
from swarm.limits import MAX_FRAME_BYTES
from swarm.netaddr import maddr_host_port
from swarm.p2p import FramedStream, StreamHandler, SwarmP2P
from swarm.relay.handshake import MAX_HANDSHAKE_BYTES, RelayIdentity, respond
from swarm.relay.records import (
    MAX_MESSAGE_BYTES,
    RELAY_BLOB_NAME,
    RELAYS_KEY,
    RelayOffer,
    decode_message,
    decode_offer,
    encode_message,
)
from swarm.relay.rules import choose_relay
from swarm.relay.service import HELLO_TIMEOUT_S, register_proof_data

logger = logging.getLogger(__name__)

PING_PERIOD_S = 10.0
"""The control connection's keepalive period; a pong missing for 2 periods means the relay is gone."""
AVOID_S = 60.0
"""A relay that failed or refused is not chosen again for this long (unless no other is left)."""
RETRY_S = 2.0
"""Wait between rounds when no relay could be registered with."""
PROBE_TIMEOUT_S = 3.0
"""A relay whose endpoint takes longer to accept a TCP connection is not considered."""


class RelayRegistrar:
    """Keeps this peer registered with one relay and serves the streams relayed to it.

    Args:
        dht: this peer's DHT node (relay offers are read from it).
        identity: this peer's credentials (registration proof, handshake).
        transport: runs handlers like its own streams (`SwarmP2P.run_handler`; its close ends them).
        handlers: protocol → stream handler, the protocols served on relayed streams.
        on_relay: awaited with this peer's relay addresses whenever they change (() while none).
    Attributes:
        relay: the offer of the relay registered with now, or None.
    """

    def __init__(self, dht: SwarmDHT, identity: RelayIdentity, transport: SwarmP2P,
                 handlers: Mapping[str, StreamHandler],
                 on_relay: Callable[[tuple[str, ...]], Awaitable[None]]):
        self._dht, self._identity, self._transport = dht, identity, transport
        self._handlers, self._on_relay = dict(handlers), on_relay
        self._avoid: dict[str, float] = {}  # relay peer id → monotonic time until which it is avoided
        self.relay: RelayOffer | None = None
        self.registered = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    async def run(self) -> None:
        """Register, serve, re-register on loss; until cancelled."""
        try:
            while True:
                offer = await self._choose()
                if offer is None:
                    await asyncio.sleep(RETRY_S)
                    continue
                try:
                    await self._serve(offer)
                except (SwarmError, OSError, TimeoutError) as e:
                    logger.warning("relay %s… lost: %s; registering elsewhere", offer.peer_id[:12], e)
                self._avoid[offer.peer_id] = time.monotonic() + AVOID_S
                if self.relay is not None:
                    self.relay = None
                    self.registered.clear()
                    await self._on_relay(())
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def _choose(self) -> RelayOffer | None:
        """The relay to register with now (see swarm.relay.rules.choose_relay)."""
        try:
            blobs = await self._dht.get_blob(RELAYS_KEY)
        except SwarmError as e:
            logger.warning("relay offers not readable: %s", e)
            return None
        offers = [o for b in blobs if b.name == RELAY_BLOB_NAME
                  for o in [decode_offer(b.owner_peer_id, b.value)] if o is not None]
        rtts = dict(zip([o.peer_id for o in offers], await asyncio.gather(*(_rtt_ms(o) for o in offers))))
        now = time.monotonic()
        avoid = {p for p, until in self._avoid.items() if until > now}
        chosen = choose_relay(offers, rtts, self._identity.peer_id, avoid)
        if chosen is None and avoid:  # every other relay failed lately: better one of them than none
            chosen = choose_relay(offers, rtts, self._identity.peer_id)
        if chosen is None:
            logger.warning("no relay to register with (%d offers in the DHT)", len(offers))
        return chosen

    async def _serve(self, offer: RelayOffer) -> None:
        """Register with `offer`'s relay and serve its dial requests until the control connection fails.

        Raises:
            SwarmError: refused, or the connection failed or went silent.
        """
        host, port = _endpoint(offer)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT_S)
        async with FramedStream(offer.peer_id, "relay", reader, writer, MAX_MESSAGE_BYTES) as control:
            await control.send(encode_message("register", peer=self._identity.peer_id))
            nonce = decode_message(await control.recv(HELLO_TIMEOUT_S), "challenge")["nonce"]
            await control.send(encode_message(
                "proof", key=self._identity.proof["key"],
                sig=self._identity.sign(register_proof_data(offer.peer_id, nonce))))
            answer = decode_message(await control.recv(HELLO_TIMEOUT_S), "registered", "refused")
            if answer["op"] == "refused":
                raise SwarmError(f"refused: {answer['why']}")
            self.relay = offer
            logger.info("registered with relay %s… at %s:%d", offer.peer_id[:12], host, port)
            await self._on_relay(offer.addrs())
            self.registered.set()
            pinger = asyncio.ensure_future(_keepalive(control))
            try:
                while True:
                    message = decode_message(await control.recv(2 * PING_PERIOD_S), "dial", "pong")
                    if message["op"] == "dial":
                        self._spawn(self._answer(host, port, message["token"]))
            finally:
                pinger.cancel()

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, host: str, port: int, token: bytes) -> None:
        """Open the data connection for `token`, run the handshake, then the stream's handler."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT_S)
        except (OSError, TimeoutError) as e:
            logger.info("relay data connection failed: %s", e or "timed out")
            return
        hello = FramedStream("(relayed)", "relay", reader, writer, max(MAX_MESSAGE_BYTES, MAX_HANDSHAKE_BYTES))
        try:
            await hello.send(encode_message("accept", token=token))
            client, protocol, cipher = await respond(hello, self._identity, self._handlers)
        except SwarmError as e:
            logger.info("relayed stream refused: %s", e)
            await hello.close()
            return
        stream = FramedStream(client, protocol, reader, writer, MAX_FRAME_BYTES, cipher=cipher)
        await self._transport.run_handler(self._handlers[protocol], stream)


async def _keepalive(control: FramedStream) -> None:
    while True:
        await asyncio.sleep(PING_PERIOD_S)
        try:
            await control.send(encode_message("ping"))
        except SwarmError:
            return


def _endpoint(offer: RelayOffer) -> tuple[str, int]:
    """The first usable endpoint of an offer (host, port).

    Raises:
        SwarmError: none is a TCP multiaddr.
    """
    for e in offer.endpoints:
        hp = maddr_host_port(e)
        if hp is not None:
            return hp
    raise SwarmError(f"relay {offer.peer_id[:12]}… offers no usable endpoint")


async def _rtt_ms(offer: RelayOffer) -> float:
    """Time to open (and close) a TCP connection to the offer's relay, ms; inf when it fails."""
    try:
        host, port = _endpoint(offer)
        t0 = time.perf_counter()
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT_S)
        rtt = (time.perf_counter() - t0) * 1000.0
        writer.close()
        return rtt
    except (SwarmError, OSError, TimeoutError):
        return math.inf
