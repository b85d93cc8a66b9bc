"""Limits per remote client on a serving peer, and the peer's global caps: the decisions, no I/O.

A public swarm is served by strangers to strangers, so a peer bounds what any one client (keyed by
the authenticated peer id of its streams: libp2p's, or the one a direct stream's ticket was issued
to) may hold: sessions and reserved KV tokens (kept by `swarm.kv.sessions.SessionTable`), open
streams, and frame bytes in flight (read off the stream and not yet answered). Across all clients
it caps concurrent streams and buffered frame bytes, so many clients together cannot exhaust its
memory either. A frame's bytes are reserved from its length prefix, before its body is read; a
small frame (a decode step's) never waits for the peer's budget, so stalled bulk frames cannot
hold up every session's next step.

`ClientLedger` is the accounting: it answers each request with a grant, WAIT (the global byte
budget is full now; a later release may make room) or a refusal naming the limit, which the peer
sends as a BUSY error. The stream handler (swarm/peer/handler.py) applies the answers.

This module does not read frames, wait, or know sessions (swarm/kv/sessions.py holds those caps).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from swarm.kv.sessions import CLIENT_LIMIT_PREFIX
from swarm.limits import MAX_FRAME_BYTES

CLIENT_STREAMS = 16
"""Default most span and push streams one remote peer may hold open on a peer (a client holds one
per session; a previous hop one push stream per chained session)."""
CLIENT_BYTES = 128 * 1024 * 1024
"""Default most frame bytes one remote peer may have in flight on a peer: two of the largest frames."""
MAX_STREAMS = 256
"""Default most span and push streams a peer serves at once, from all remote peers together."""
MAX_BUFFERED_BYTES = 256 * 1024 * 1024
"""Default most frame bytes a peer holds in flight from all remote peers together: four of the
largest frames (MAX_FRAME_BYTES, 64 MiB)."""

SMALL_FRAME_BYTES = 1024 * 1024
"""Frames up to this size never wait for the peer's byte budget (they still count in it, and against
the client's own): a decode step's frame (4 B x its row width and a header, 256 KiB at MAX_HIDDEN)
must not queue behind bulk frames whose senders stall. What they add past the budget is bounded by
max_streams x SMALL_FRAME_BYTES."""

WAIT = "wait"
"""`ClientLedger.reserve`'s answer when only the global byte budget is short now."""


@dataclass(frozen=True)
class ClientLimits:
    """What one remote client may hold on a peer, and the peer's global caps (`swarm serve` options).

    Attributes:
        sessions: sessions per client (None: half of max_sessions, rounded up).
        kv_tokens: reserved KV tokens per client (None: half of the span's cache).
        streams: open span and push streams per client.
        bytes: frame bytes in flight per client (>= MAX_FRAME_BYTES, so any one frame can pass).
        max_streams: open span and push streams from all clients.
        max_buffered_bytes: frame bytes in flight from all clients (>= bytes).
    """

    sessions: int | None = None
    kv_tokens: int | None = None
    streams: int = CLIENT_STREAMS
    bytes: int = CLIENT_BYTES
    max_streams: int = MAX_STREAMS
    max_buffered_bytes: int = MAX_BUFFERED_BYTES

    def resolved(self, max_sessions: int, cache_tokens: int) -> ClientLimits:
        """These limits with the defaults of `sessions` and `kv_tokens` worked out for a span of
        `max_sessions` slots and `cache_tokens` KV tokens."""
        sessions = -(-max_sessions // 2) if self.sessions is None else self.sessions
        kv_tokens = -(-cache_tokens // 2) if self.kv_tokens is None else self.kv_tokens
        return ClientLimits(sessions, kv_tokens, self.streams, self.bytes, self.max_streams,
                            self.max_buffered_bytes)


def limits_refusal(limits: ClientLimits) -> str | None:
    """Why `limits` cannot serve, or None: a count below 1, a byte budget that a single largest frame
    (MAX_FRAME_BYTES) would not fit, or a per-client cap above its global cap."""
    for name, value in (("client_sessions", limits.sessions), ("client_kv_tokens", limits.kv_tokens),
                        ("client_streams", limits.streams), ("max_streams", limits.max_streams)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return f"{name} must be an integer >= 1, got {value!r:.40}"
    for name, value in (("client_bytes", limits.bytes), ("max_buffered_bytes", limits.max_buffered_bytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < MAX_FRAME_BYTES:
            return f"{name} must be an integer >= {MAX_FRAME_BYTES} (the largest frame), got {value!r:.40}"
    if limits.streams > limits.max_streams:
        return f"client_streams {limits.streams} > max_streams {limits.max_streams}"
    if limits.bytes > limits.max_buffered_bytes:
        return f"client_bytes {limits.bytes} > max_buffered_bytes {limits.max_buffered_bytes}"
    return None


class ClientLedger:
    """Open streams and frame bytes in flight, per remote client and in all.

    Args:
        limits: the caps (`ClientLimits`; sessions and kv_tokens are not used here).
    Attributes:
        reserved_bytes: frame bytes in flight now, all clients.
        peak_reserved_bytes: the most `reserved_bytes` has been since the ledger was made.
        refusals: refusals so far by limit name ("client_streams", "max_streams", "client_bytes").
    """

    def __init__(self, limits: ClientLimits):
        self.limits = limits
        self.streams: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.reserved_bytes = 0
        self.peak_reserved_bytes = 0
        self.refusals: Counter[str] = Counter()

    @property
    def open_streams(self) -> int:
        """Span and push streams open now, all clients."""
        return sum(self.streams.values())

    def open_stream(self, client: str) -> str | None:
        """Count a new stream of `client`; or, at a cap, count nothing and return the refusal."""
        if self.streams[client] >= self.limits.streams:
            self.refusals["client_streams"] += 1
            return (f"{CLIENT_LIMIT_PREFIX}this client holds {self.streams[client]} streams here, the most "
                    f"one client may (client_streams {self.limits.streams})")
        if self.open_streams >= self.limits.max_streams:
            self.refusals["max_streams"] += 1
            return f"this peer serves {self.open_streams} streams, its most (max_streams {self.limits.max_streams})"
        self.streams[client] += 1
        return None

    def close_stream(self, client: str) -> None:
        """Uncount a stream that `open_stream` counted."""
        self.streams[client] -= 1
        if self.streams[client] <= 0:
            del self.streams[client]

    def reserve(self, client: str, n_bytes: int) -> str | None:
        """Reserve `n_bytes` of a frame of `client` before its body is read.

        Returns:
            None: reserved (release it with `release`). WAIT: the global budget is short now and the
            frame is over SMALL_FRAME_BYTES; ask again after a release. Else the refusal: the client's own budget cannot take the frame
            (it has to finish frames in flight first; the peer does not wait for that).
        """
        held = self.bytes[client]
        if held + n_bytes > self.limits.bytes:
            self.refusals["client_bytes"] += 1
            return (f"{CLIENT_LIMIT_PREFIX}this client has {held} frame bytes in flight here; a frame of "
                    f"{n_bytes} more would pass client_bytes {self.limits.bytes}")
        if self.reserved_bytes + n_bytes > self.limits.max_buffered_bytes and n_bytes > SMALL_FRAME_BYTES:
            return WAIT
        self.bytes[client] = held + n_bytes
        self.reserved_bytes += n_bytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return None

    def release(self, client: str, n_bytes: int) -> None:
        """Return `n_bytes` that `reserve` granted to `client`."""
        self.bytes[client] -= n_bytes
        if self.bytes[client] <= 0:
            del self.bytes[client]
        self.reserved_bytes -= n_bytes
