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


class ExecutorInterrupted(ExecutorError):
    """`SpanExecutor.interrupt` stopped a step before it ended; the sequence is as before the step."""


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


class SessionTooLong(NoRoute):
    """Peers serve the missing layers, but none of them takes a session this long: the prompt plus
    the tokens to generate exceed their per-session KV cap. Retrying will not help; a shorter
    prompt or fewer new tokens will.

    Attributes:
        need_tokens: KV tokens the session asked every hop for.
        most_tokens: the most any peer serving a missing layer offers one session.
    """

    def __init__(self, message: str, missing: tuple[int, ...], need_tokens: int, most_tokens: int):
        super().__init__(message, missing)
        self.need_tokens, self.most_tokens = need_tokens, most_tokens


class ArtifactError(SwarmError):
    """Fetching, verifying or seeding model bytes failed (bad hash, no seeders, disk full)."""


class AddressError(SwarmError):
    """A listen or advertised address cannot work: not an IP literal, a port out of range, a public
    address without a fixed port (see `swarm.netaddr`)."""
