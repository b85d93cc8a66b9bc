"""Where a peer keeps its persistent identity, and the key that proves it.

One RSA-2048 key per data directory serves both purposes: it is the libp2p identity that p2pd loads
(so the peer id is stable across restarts) and it signs this peer's DHT records (so only this peer can
overwrite them, and a record's claimed peer id can be checked against the key that signed it).

The file `identity.key` is a libp2p `crypto.pb.PrivateKey` protobuf (key_type RSA, DER data), exactly what
p2pd's `-id` flag reads; it is created once with mode 0600 inside a 0700 directory.

The peer id of a public key alone (a record's or a snapshot's signer) is derived in swarm/peerid.py.

This module does not start daemons or touch the network.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey

from swarm.errors import SwarmError

IDENTITY_FILE = "identity.key"


class IdentityError(SwarmError):
    """The data directory or its identity key file is unusable (unreadable, corrupt, not RSA)."""


@dataclasses.dataclass(frozen=True)
class Identity:
    """A peer's persistent identity.

    Attributes:
        data_dir: the peer's data directory.
        identity_path: the key file p2pd loads (`identity_path` of hivemind's P2P).
        private_key: the same key as a hivemind RSAPrivateKey, used to sign DHT records.
        peer_id: base58 libp2p peer id derived from the key.
    """

    data_dir: Path
    identity_path: Path
    private_key: RSAPrivateKey
    peer_id: str


def resolve_data_dir(explicit: str | os.PathLike | None = None) -> Path:
    """Pick the data directory: `explicit`, else `$SWARM_HOME`, else `$XDG_DATA_HOME/swarm`,
    else `~/.local/share/swarm`. Nothing is created here.
    """
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("SWARM_HOME"):
        return Path(os.environ["SWARM_HOME"]).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg).expanduser() / "swarm"


def load_or_create_identity(data_dir: str | os.PathLike | None = None) -> Identity:
    """Load the identity key from the data directory, creating directory and key on first run.

    Args:
        data_dir: directory to use; None resolves it with `resolve_data_dir`.
    Returns:
        Identity with a peer id that is the same on every later call with the same directory.
    Raises:
        IdentityError: the directory cannot be created or the key file is unreadable, corrupt or not RSA.
    """
    root = resolve_data_dir(data_dir)
    path = root / IDENTITY_FILE
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.exists():
            _write_new_key(path)
        raw = path.read_bytes()
    except OSError as e:
        raise IdentityError(f"cannot use data directory {root}: {e}") from e
    try:
        proto = crypto_pb2.PrivateKey.FromString(raw)
        if proto.key_type != crypto_pb2.RSA:
            raise ValueError(f"key type {proto.key_type} is not RSA")
        key = RSAPrivateKey.__new__(RSAPrivateKey)  # hivemind's unpickling path loads a DER key
        key.__setstate__({"_private_key": proto.data})
        peer_id = PeerID.from_identity(raw).to_base58()
    except Exception as e:  # protobuf DecodeError, ValueError/TypeError from cryptography
        raise IdentityError(f"identity key {path} is corrupt: {e}") from e
    return Identity(root, path, key, peer_id)


def _write_new_key(path: Path) -> None:
    """Write a fresh RSA identity with mode 0600. It is linked into place atomically: if a concurrent
    first run got there first, its key is kept and this one is discarded."""
    blob = crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=RSAPrivateKey().to_bytes()).SerializeToString()
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    try:
        os.link(tmp, path)  # atomic, fails if another process created it first
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
