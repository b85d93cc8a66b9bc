"""The relay service of a reachable peer: registrations, splicing within a budget, its DHT offer.

One TCP listener (`--relay-port`) takes three kinds of connection, told apart by their first
message (swarm.relay.records):
- register: a peer that cannot be dialled proves it owns its peer id (it signs the relay's random
  challenge with its identity key) and keeps the connection as its control connection; a new
  registration of the same peer replaces the old one.
- connect: a client or pushing peer asks for a registered peer. The relay sends the peer a one-time
  token over its control connection, waits for the peer's data connection, answers `connected`, and
  from then on copies bytes both ways without reading them: no frame or byte limit per connection
  (go-libp2p's circuit relay v2 resets a relayed connection after 128 KiB by default), only the
  registered peer's byte rate (`RelayLimits.bytes_per_s`, a token bucket shared by its connections)
  and its count of open connections.
- accept: the peer's data connection for a token.
The two ends seal everything end to end (swarm.relay.handshake); the relay sees only ciphertext.

This module does not: authenticate the relayed streams' ends (they do), or decide who relays
(swarm.relay.rules.relay_roles).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
from collections.abc import Iterable

from swarm.dht.node import SwarmDHT
from swarm.direct import direct_maddrs
from swarm.errors import AddressError, SwarmError
from swarm.netaddr import NetConfig, bt_hosts
from swarm.p2p import FramedStream
from swarm.relay.handshake import signer_peer_id
from swarm.relay.records import (
    MAX_MESSAGE_BYTES,
    NONCE_BYTES,
    RELAY_BLOB_NAME,
    RELAYS_KEY,
    TOKEN_BYTES,
    RelayOffer,
    decode_message,
    encode_message,
    encode_offer,
)
from swarm.relay.rules import RelayBudget, RelayLimits, TokenBucket

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
"""A connection must say what it is within this long."""
ACCEPT_TIMEOUT_S = 10.0
"""A registered peer must open its data connection within this long after a dial request."""
CONTROL_IDLE_S = 60.0
"""A control connection silent this long (no ping) is dropped: its peer is gone."""
REGISTER_CONTEXT = b"swarm-relay-register:"
"""Prefix of what a registering peer signs: this, the relay's peer id, the challenge."""
_CHUNK_BYTES = 64 * 1024


def register_proof_data(relay_peer_id: str, nonce: bytes) -> bytes:
    """What a peer signs to register at `relay_peer_id` with challenge `nonce`."""
    return REGISTER_CONTEXT + relay_peer_id.encode("ascii") + nonce


class RelayServer:
    """A reachable peer's relay service.

    Args:
        peer_id: this relay's peer id (registrations sign it, so a proof made for another relay is void).
        limits: the budget, announced in the offer.
    """

    def __init__(self, peer_id: str, limits: RelayLimits = RelayLimits()):
        self.peer_id, self.limits = peer_id, limits
        self.budget = RelayBudget(limits)
        self._controls: dict[str, FramedStream] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._pending: dict[bytes, tuple[str, asyncio.Future]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def listen(self, host: str, port: int = 0) -> int:
        """Listen on host:port (0: any free port). Returns the port.

        Raises:
            AddressError: the port cannot be bound.
        """
        try:
            self._server = await asyncio.start_server(self._accept, host, port)
        except OSError as e:
            why = os.strerror(e.errno) if e.errno else str(e)
            raise AddressError(f"--relay-port {port}: cannot listen on {host}: {why}") from e
        return self._server.sockets[0].getsockname()[1]

    def offer(self, endpoints: Iterable[str]) -> RelayOffer:
        """This relay's offer as of now, at `endpoints` (TCP multiaddrs of the listener)."""
        return RelayOffer(self.peer_id, tuple(endpoints), self.limits.max_peers, self.budget.free_peers,
                          self.limits.max_conns_per_peer, self.limits.bytes_per_s)

    async def close(self) -> None:
        """Stop accepting and end every registration and relayed connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        hello = FramedStream("(relay client)", "relay", reader, writer, MAX_MESSAGE_BYTES)
        keep = False
        try:
            message = decode_message(await hello.recv(HELLO_TIMEOUT_S), "register", "connect", "accept")
            if message["op"] == "register":
                await self._serve_control(hello, message["peer"])
            elif message["op"] == "connect":
                await self._relay(hello, message["peer"], reader, writer)
            else:
                keep = self._hand_over(message["token"], reader, writer)
        except (SwarmError, asyncio.CancelledError) as e:
            logger.debug("relay connection from %s ended: %s", writer.get_extra_info("peername"), e)
        finally:
            self._tasks.discard(task)
            if not keep:
                writer.close()

    async def _serve_control(self, control: FramedStream, peer_id: str) -> None:
        nonce = secrets.token_bytes(NONCE_BYTES)
        await control.send(encode_message("challenge", nonce=nonce))
        proof = decode_message(await control.recv(HELLO_TIMEOUT_S), "proof")
        if signer_peer_id(proof["key"], register_proof_data(self.peer_id, nonce), proof["sig"]) != peer_id:
            await control.send(encode_message("refused", why="the registration proof does not match the peer id"))
            return
        why = self.budget.register(peer_id)
        if why is not None:
            await control.send(encode_message("refused", why=why))
            return
        old = self._controls.get(peer_id)
        self._controls[peer_id] = control
        self._buckets.setdefault(peer_id, TokenBucket(self.limits.bytes_per_s, self.limits.burst_bytes))
        if old is not None:
            await old.close()
        await control.send(encode_message("registered"))
        logger.info("relaying for %s…", peer_id[:12])
        try:
            while True:
                decode_message(await control.recv(CONTROL_IDLE_S), "ping")
                await control.send(encode_message("pong"))
        finally:
            if self._controls.get(peer_id) is control:
                del self._controls[peer_id]
                self._buckets.pop(peer_id, None)
                self.budget.unregister(peer_id)
                logger.info("%s… left this relay", peer_id[:12])

    async def _relay(self, hello: FramedStream, peer_id: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        control = self._controls.get(peer_id)
        why = self.budget.open(peer_id) if control is not None else f"peer {peer_id[:12]}… is not registered here"
        if why is not None:
            await hello.send(encode_message("refused", why=why))
            return
        token = secrets.token_bytes(TOKEN_BYTES)
        arrived: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[token] = (peer_id, arrived)
        try:
            await control.send(encode_message("dial", token=token))
            async with asyncio.timeout(ACCEPT_TIMEOUT_S):
                peer_reader, peer_writer = await arrived
        except (SwarmError, TimeoutError):
            self.budget.close(peer_id)
            await hello.send(encode_message("refused", why=f"peer {peer_id[:12]}… did not answer the relay"))
            return
        finally:
            self._pending.pop(token, None)
        try:
            await hello.send(encode_message("connected"))
            await self._splice(peer_id, (reader, writer), (peer_reader, peer_writer))
        finally:
            peer_writer.close()
            self.budget.close(peer_id)

    def _hand_over(self, token: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Give a data connection to the connect waiting for its token; False when none waits."""
        pending = self._pending.pop(token, None)
        if pending is None or pending[1].done():
            return False
        pending[1].set_result((reader, writer))
        return True

    async def _splice(self, peer_id: str, a: tuple, b: tuple) -> None:
        """Copy bytes both ways until either side closes; the registered peer's bucket paces them."""
        bucket = self._buckets.get(peer_id)

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            loop = asyncio.get_running_loop()
            while data := await reader.read(_CHUNK_BYTES):
                if bucket is not None:
                    wait_s = bucket.take(len(data), loop.time())
                    if wait_s > 0:
                        await asyncio.sleep(wait_s)
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.ensure_future(pump(a[0], b[1])), asyncio.ensure_future(pump(b[0], a[1]))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)


async def publish_forever(dht: SwarmDHT, server: RelayServer, endpoints: tuple[str, ...], period_s: float) -> None:
    """Keep this relay's offer in the DHT (`RELAYS_KEY`), refreshed every `period_s` until cancelled;
    a failed store is logged and retried next period."""
    while True:
        try:
            await dht.store_blob(RELAYS_KEY, RELAY_BLOB_NAME, encode_offer(server.offer(endpoints)),
                                 expiration_s=period_s * 2.5)
        except SwarmError as e:
            logger.warning("relay offer not stored: %s", e)
        await asyncio.sleep(period_s)



OFFER_PERIOD_S = 30.0
"""A relay of `swarm dht` refreshes its offer this often (as a serving peer's default announce period)."""


async def start_relay(dht: SwarmDHT, *, host: str, port: int, public_address: str | None,
                      limits: RelayLimits = RelayLimits()):
    """Start a relay service on a running DHT node (`swarm dht`): listen, publish the offer.

    Returns:
        an async function that stops it.
    Raises:
        AddressError: the port cannot be bound.
    """
    server = RelayServer(dht.peer_id, limits)
    bound = await server.listen(host, port)
    net = NetConfig(host=host, port=0, bt_port=0, public_address=public_address)
    endpoints = direct_maddrs(bt_hosts(net, dht.visible_maddrs()), bound)
    task = asyncio.create_task(publish_forever(dht, server, endpoints, OFFER_PERIOD_S))
    print(f"relaying for peers behind NATs on port {bound}", file=sys.stderr, flush=True)

    async def stop() -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.close()

    return stop
