"""Exception types shared by every layer of swarm.

Each error carries a one-line message meant for a user; the CLI prints `str(err)` and exits
non-zero without a traceback. Nothing here does I/O.
"""


class SwarmError(Exception):
    """Base class: a clear, user-facing failure (bad input, bad peer, missing resource)."""


class ModelError(SwarmError):
    """A model name, path or file is unknown, missing, corrupt or not a GGUF."""


class RequestError(SwarmError):
    """A generation request is invalid: empty prompt, too long, bad sampling parameters."""


class UnsupportedArchitecture(SwarmError):
    """The GGUF's `general.architecture` has no row in `swarm.arch`."""


class ExecutorError(SwarmError):
    """The layer-span executor refused or failed a step; the message names the cause."""


class Busy(SwarmError):
    """A peer cannot admit a new session now (KV-cache budget or session slots exhausted)."""


class ShuttingDown(Busy):
    """A peer is leaving the swarm (it said SHUTTING_DOWN): route around it."""


class Forbidden(SwarmError):
    """A peer asked for something that belongs to another peer (e.g. another client's session)."""


class PeerUnreachable(SwarmError):
    """A peer cannot be dialled, refused the protocol, or its stream broke (reset, died, timed out)."""


class PeerTimeout(PeerUnreachable):
    """A peer did not answer within the time its announced speed allows (frozen, overloaded, cut off)."""


class ProtocolError(SwarmError):
    """A frame or record from a peer is malformed, oversized, or of another protocol generation."""


class NoRoute(SwarmError):
    """No chain of live peers covers every layer of the model.

    Attributes:
        missing: global layer indices that no usable peer serves.
    """

    def __init__(self, message: str, missing: tuple[int, ...] = ()):
        super().__init__(message)
        self.missing = missing


class ArtifactError(SwarmError):
    """Fetching, verifying or seeding model bytes failed (bad hash, no seeders, disk full)."""


class AddressError(SwarmError):
    """A listen or advertised address cannot work: not an IP literal, a port out of range, a public
    address without a fixed port (see `swarm.netaddr`)."""
