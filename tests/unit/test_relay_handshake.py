"""swarm.relay.handshake: the end-to-end handshake of a relayed stream, over in-process pipes.

The "relay" here is a byte pump between two socket pairs, so that a test can make it misbehave
(flip one byte): a real relay (swarm.relay.service) never alters bytes, and these are the failures
it must not be able to cause unnoticed.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from hivemind.utils.crypto import RSAPrivateKey

from swarm.errors import ProtocolError, PeerUnreachable
from swarm.limits import PING_PROTOCOL, SPAN_PROTOCOL
from swarm.p2p import FramedStream
from swarm.relay.handshake import MAX_HANDSHAKE_BYTES, RelayIdentity, initiate, respond

CLIENT, PEER, OTHER = (RelayIdentity(RSAPrivateKey()) for _ in range(3))


async def _pipe_through_relay(flip_at: int | None):
    """(client side, peer side) stream pairs joined by a pump that copies bytes, flipping byte
    number `flip_at` (counted over the client → peer direction then peer → client) when given."""
    a_client, a_relay = socket.socketpair()
    b_relay, b_peer = socket.socketpair()
    c_r, c_w = await asyncio.open_connection(sock=a_client)
    ra_r, ra_w = await asyncio.open_connection(sock=a_relay)
    rb_r, rb_w = await asyncio.open_connection(sock=b_relay)
    p_r, p_w = await asyncio.open_connection(sock=b_peer)
    seen = [0]

    async def pump(reader, writer):
        while data := await reader.read(65536):
            if flip_at is not None and seen[0] <= flip_at < seen[0] + len(data):
                data = bytearray(data)
                data[flip_at - seen[0]] ^= 0x01
                data = bytes(data)
            seen[0] += len(data)
            writer.write(data)
            await writer.drain()
        writer.close()

    pumps = [asyncio.ensure_future(pump(ra_r, rb_w)), asyncio.ensure_future(pump(rb_r, ra_w))]
    return (c_r, c_w), (p_r, p_w), pumps


async def _run(flip_at: int | None = None, expect_peer: str | None = None, protocols=(SPAN_PROTOCOL,),
               peer_identity: RelayIdentity = PEER):
    (c_r, c_w), (p_r, p_w), pumps = await _pipe_through_relay(flip_at)
    c = FramedStream(PEER.peer_id, SPAN_PROTOCOL, c_r, c_w, MAX_HANDSHAKE_BYTES)
    p = FramedStream("(relayed)", "relay", p_r, p_w, MAX_HANDSHAKE_BYTES)

    async def end(stream, coro):  # as swarm.relay.dial and the registrar do: a failed side hangs up
        try:
            return await coro
        except BaseException:
            await stream.close()
            raise

    try:
        results = await asyncio.gather(
            end(c, initiate(c, CLIENT, expect_peer or PEER.peer_id, SPAN_PROTOCOL)),
            end(p, respond(p, peer_identity, protocols)),
            return_exceptions=True,
        )
        return results, (c_r, c_w), (p_r, p_w)
    finally:
        for pump in pumps:
            pump.cancel()


def test_handshake_authenticates_both_ends_and_seals_frames():
    async def main():
        (c_cipher, (client_id, protocol, p_cipher)), (c_r, c_w), (p_r, p_w) = await _run()
        assert client_id == CLIENT.peer_id and protocol == SPAN_PROTOCOL
        frame = b"hidden state bytes"
        assert p_cipher.open(c_cipher.seal(frame)) == frame
        assert c_cipher.open(p_cipher.seal(b"token")) == b"token"

    asyncio.run(main())


def test_a_relay_pretending_to_be_the_peer_is_refused():
    async def main():
        # the responder holds another identity key (a relay answering in the peer's place)
        (c_result, _), *_ = await _run(peer_identity=OTHER)
        assert isinstance(c_result, ProtocolError) and "not" in str(c_result)

    asyncio.run(main())


@pytest.mark.parametrize("flip_at", [5, 40, 200, 700, 1500])
def test_a_relay_that_flips_a_handshake_byte_is_detected(flip_at):
    async def main():
        results, *_ = await _run(flip_at=flip_at)
        # whichever message the byte was in, some end fails authentication and no stream opens
        assert any(isinstance(r, (ProtocolError, PeerUnreachable)) for r in results)

    asyncio.run(main())


def test_a_relay_that_flips_a_byte_in_a_sealed_frame_is_detected():
    async def main():
        (c_cipher, (_, _, p_cipher)), *_ = await _run()
        sealed = bytearray(c_cipher.seal(b"x" * 64))
        sealed[10] ^= 0x80
        with pytest.raises(ProtocolError, match="failed authentication"):
            p_cipher.open(bytes(sealed))

    asyncio.run(main())


def test_an_unserved_protocol_is_refused():
    async def main():
        (_, p_result), *_ = await _run(protocols=(PING_PROTOCOL,))
        assert isinstance(p_result, ProtocolError) and "no relayed streams" in str(p_result)

    asyncio.run(main())


def test_a_static_key_signed_by_another_identity_is_refused():
    # the proof of one identity replayed with another static key: the signature does not cover it
    forged = RelayIdentity(RSAPrivateKey())
    forged.proof = dict(PEER.proof)

    async def main():
        (c_result, _), *_ = await _run(peer_identity=forged)
        assert isinstance(c_result, ProtocolError) and "not signed" in str(c_result)

    asyncio.run(main())
