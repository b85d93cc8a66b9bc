"""The end-to-end handshake of a relayed stream: Noise XX, each end's static key signed by its identity.

The relay splices two TCP connections byte for byte, so it sees every byte the two ends exchange.
They run Noise_XX_25519_ChaChaPoly_SHA256 (the Noise Protocol Framework, rev. 34, through the
`noiseprotocol` package) over the spliced pipe, framed as swarm.p2p frames:

    -> e                                     (initiator: the client or the pushing peer)
    <- e, ee, s, es   + {key, sig}           (responder: the relayed peer)
    -> s, se          + {key, sig, protocol, stream key}

Each `{key, sig}` payload is the sender's libp2p identity key (RSA, OpenSSH bytes) and its
signature of STATIC_KEY_CONTEXT + the sender's Noise static public key, the construction of
libp2p's own Noise handshake (libp2p/specs noise/README.md, "Static Key Authentication") with a
context string of our own. So each end learns the other's peer id (`swarm.peerid`), and a relay that
does not hold the relayed peer's identity key cannot complete the handshake in its place. The
initiator checks that the responder is the peer it asked for; the responder takes the initiator's
peer id as the stream's authenticated client, as libp2p and direct streams do.

The last message also carries the protocol wanted (SPAN_PROTOCOL, PUSH_PROTOCOL, PING_PROTOCOL) and
a fresh 256-bit stream key, both encrypted; every later frame is sealed with swarm.direct's
`AeadFrameCipher` under that key, exactly as on a direct stream (the key crosses an authenticated,
encrypted channel in both designs). A byte the relay flips in a handshake message fails Noise's
authentication, in a later frame the AEAD tag: both end the stream with ProtocolError.

This module does not open connections (swarm.relay.dial and swarm.relay.registrar do).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection

import msgpack
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey
from noise.connection import Keypair, NoiseConnection

from swarm.direct import KEY_BYTES, AeadFrameCipher
from swarm.errors import ProtocolError
from swarm.p2p import FramedStream
from swarm.peerid import peer_id_of_public_key

NOISE_PROTOCOL = b"Noise_XX_25519_ChaChaPoly_SHA256"
PROLOGUE = b"swarm-relay/1"
"""Mixed into the handshake hash: both ends must mean this protocol."""
STATIC_KEY_CONTEXT = b"swarm-relay-static-key:"
"""Prefix of the signed Noise static key (libp2p signs "noise-libp2p-static-key:" + key)."""
MAX_HANDSHAKE_BYTES = 4096
"""Largest handshake message (an RSA-2048 key and signature in msgpack take ~750 bytes)."""
HANDSHAKE_TIMEOUT_S = 10.0
_MAX_PROTOCOL_CHARS = 64


class RelayIdentity:
    """A process's credentials for relayed streams: its libp2p identity key and a Noise static key
    (X25519, made fresh per process) signed by it. Build once per process; signing is RSA, ~1 ms.

    Args:
        private_key: the peer's (or client's) identity key (swarm.dht.identity.Identity.private_key).
    Attributes:
        peer_id: the libp2p peer id of the identity key.
    """

    def __init__(self, private_key: RSAPrivateKey):
        static = X25519PrivateKey.generate()
        self._static = static.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        public = static.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._private_key = private_key
        self.peer_id = peer_id_of_public_key(private_key.get_public_key())
        self.proof = {"key": private_key.get_public_key().to_bytes(),
                      "sig": private_key.sign(STATIC_KEY_CONTEXT + public)}

    def sign(self, data: bytes) -> bytes:
        """A signature of `data` by the identity key (hivemind's RSA signature)."""
        return self._private_key.sign(data)

    def noise(self, initiator: bool) -> NoiseConnection:
        """A Noise XX handshake state with this identity's static key, started."""
        conn = NoiseConnection.from_name(NOISE_PROTOCOL)
        conn.set_as_initiator() if initiator else conn.set_as_responder()
        conn.set_prologue(PROLOGUE)
        conn.set_keypair_from_private_bytes(Keypair.STATIC, self._static)
        conn.start_handshake()
        return conn


def signer_peer_id(key: bytes, data: bytes, sig: bytes) -> str | None:
    """The peer id of RSA public key `key` (OpenSSH bytes) if `sig` is its signature of `data`."""
    try:
        public = RSAPublicKey.from_bytes(key)
        return peer_id_of_public_key(public) if public.verify(data, sig) else None
    except Exception:  # a malformed key or signature raises assorted types (ValueError, binascii.Error)
        return None


async def initiate(stream: FramedStream, identity: RelayIdentity, peer_id: str, protocol: str) -> AeadFrameCipher:
    """The initiator's side of the handshake, on a plain stream through the relay.

    Args:
        stream: the relayed connection, unsealed (max frame MAX_HANDSHAKE_BYTES).
        identity: this client's or peer's credentials.
        peer_id: the peer this stream must reach.
        protocol: the stream protocol to speak.
    Returns:
        the cipher of every later frame (initiator side).
    Raises:
        ProtocolError: the responder is not `peer_id`, or a message was altered or malformed.
        PeerUnreachable, PeerTimeout: the connection broke or went silent.
    """
    noise = identity.noise(initiator=True)
    state = noise.noise_protocol.handshake_state  # noiseprotocol drops it (and the remote key) when done
    await stream.send(bytes(noise.write_message()))
    payload = _read(noise, await stream.recv(HANDSHAKE_TIMEOUT_S))
    remote = _remote_peer_id(state, payload)
    if remote != peer_id:
        raise ProtocolError(f"the relayed peer proved to be {remote[:12]}…, not {peer_id[:12]}…")
    key = secrets.token_bytes(KEY_BYTES)
    await stream.send(bytes(noise.write_message(
        msgpack.packb({**identity.proof, "protocol": protocol, "stream_key": key}, use_bin_type=True))))
    return AeadFrameCipher(key, initiator=True)


async def respond(stream: FramedStream, identity: RelayIdentity,
                  protocols: Collection[str]) -> tuple[str, str, AeadFrameCipher]:
    """The responder's side of the handshake (the relayed peer).

    Args:
        stream: the data connection to the relay, unsealed (max frame MAX_HANDSHAKE_BYTES).
        identity: this peer's credentials.
        protocols: the protocols it serves on relayed streams.
    Returns:
        (the initiator's authenticated peer id, the protocol it asked for, the cipher of later frames).
    Raises:
        ProtocolError: a message was altered or malformed, or the protocol is not served.
        PeerUnreachable, PeerTimeout: the connection broke or went silent.
    """
    noise = identity.noise(initiator=False)
    state = noise.noise_protocol.handshake_state
    _read(noise, await stream.recv(HANDSHAKE_TIMEOUT_S))
    await stream.send(bytes(noise.write_message(msgpack.packb(identity.proof, use_bin_type=True))))
    payload = _read(noise, await stream.recv(HANDSHAKE_TIMEOUT_S))
    client = _remote_peer_id(state, payload)
    protocol, key = payload.get("protocol"), payload.get("stream_key")
    if not isinstance(protocol, str) or protocol not in protocols:
        raise ProtocolError(f"no relayed streams for protocol {str(protocol)[:_MAX_PROTOCOL_CHARS]!r}")
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise ProtocolError("relayed handshake carries no valid stream key")
    return client, protocol, AeadFrameCipher(key, initiator=False)


def _read(noise: NoiseConnection, message: bytes) -> dict:
    """Process a handshake message; its payload as a map ({} when empty).

    Raises:
        ProtocolError: the message fails Noise's authentication or its payload is not a msgpack map.
    """
    try:
        payload = bytes(noise.read_message(message))
    except Exception:  # noiseprotocol raises InvalidTag, NoiseInvalidMessage, ValueError, ... on bad bytes
        raise ProtocolError("relayed handshake message failed authentication") from None
    if not payload:
        return {}
    try:
        decoded = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception:  # msgpack raises many types on junk
        decoded = None
    if not isinstance(decoded, dict):
        raise ProtocolError("relayed handshake payload is not a map")
    return decoded


def _remote_peer_id(state, payload: dict) -> str:
    """The peer id whose identity key signed the remote's Noise static key (`state`: noiseprotocol's
    HandshakeState, which holds the remote static key as `rs`).

    Raises:
        ProtocolError: no valid signature of the static key the remote used.
    """
    key, sig = payload.get("key"), payload.get("sig")
    peer = None
    if isinstance(key, bytes) and isinstance(sig, bytes) and state.rs is not None:
        peer = signer_peer_id(key, STATIC_KEY_CONTEXT + state.rs.public_bytes, sig)
    if peer is None:
        raise ProtocolError("relayed handshake: the static key is not signed by an identity key")
    return peer
