"""The libp2p peer id of an RSA public key: pure derivation, shared by dht/ (record owners) and kv/
(snapshot holders), so that kv/ need not import dht/.

This module does not read keys from disk (swarm/dht/identity.py does) or touch the network.
"""

from __future__ import annotations

import hashlib

import multihash
from cryptography.hazmat.primitives import serialization
from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPublicKey


def peer_id_of_public_key(public_key: RSAPublicKey) -> str:
    """Base58 libp2p peer id of an RSA public key (sha2-256 multihash of its protobuf encoding)."""
    der = serialization.load_ssh_public_key(public_key.to_bytes()).public_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # the same derivation as hivemind's PeerID.from_identity, from the public half
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    digest = multihash.encode(hashlib.sha256(encoded).digest(), multihash.coerce_code("sha2-256"))
    return PeerID(digest).to_base58()
