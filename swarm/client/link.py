"""The link protocol a route session drives, and what a peer's Error frame means.

A `RouteSession` (swarm/client/session.py) is given a `PeerDirectory` (announced spans, RTT probes)
and a `HopTransport` that opens one `HopLink` per hop: a sticky stream whose two directions are
used apart, `send` and `recv`. A relayed step is a `send` followed by the `recv` of its answer; a
pushed step is a `recv` alone (the previous hop's peer sent the frame). The session pairs the two
once, for every kind of link: swarm/client/streams.py (libp2p and direct streams), sim/transport.py
and sim/peers.py (simulated peers) only move frames.

This module does not: encode frames, time steps or decide failovers.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from swarm.errors import Busy, PeerUnreachable, ProtocolError, ShuttingDown, SwarmError
from swarm.route.plan import PeerSpan
from swarm.wire import Error, ErrorCode, Frame


class HopLink(Protocol):
    """A sticky stream to one peer for one session."""

    peer_id: str
    transport: str
    """How the frames travel: "direct" (swarm.direct), "relayed" (swarm.relay), "libp2p", or "sim"."""
    direct_error: str
    """Why a direct stream was not used when the peer offers one ("" when it was, or none offered)."""

    async def send(self, frame: Frame, timeout_s: float) -> int:
        """Send `frame`; return its bytes. A peer that cannot take it may instead have its reason
        (an Error frame) or its silence reported by the next `recv`.

        Raises:
            PeerTimeout: the frame was not accepted within timeout_s.
            PeerUnreachable: the stream is closed or broke.
        """

    async def recv(self, timeout_s: float) -> tuple[Frame, int]:
        """The next frame from the peer and its bytes.

        Raises:
            PeerTimeout: no frame within timeout_s.
            PeerUnreachable: the stream is closed or broke.
            ProtocolError: the frame is malformed.
        """

    async def close(self) -> None:
        """Tell the peer the session is over (best effort) and close the stream; never raises."""


class HopTransport(Protocol):
    """Opens links to peers."""

    async def connect(self, peer_id: str, timeout_s: float) -> HopLink:
        """Open a link to `peer_id`. Raises PeerUnreachable or PeerTimeout."""


class PeerDirectory(Protocol):
    """The model's announced spans as this client sees them."""

    async def peers(self, skip_probe: frozenset[str], fresh: bool) -> list[PeerSpan]:
        """Live announced spans with RTTs; peers not measured yet (and not in `skip_probe`) are
        probed first, and one that does not answer has `rtt_ms` = inf. `fresh`: read the DHT now;
        else the directory may answer from its last read (seconds old) and save a DHT round."""

    async def probe(self, peer_ids: Collection[str]) -> set[str]:
        """Probe these peers afresh; return the ones that answered."""


def error_of(peer_id: str, err: Error) -> SwarmError:
    """The exception for an `Error` frame from `peer_id`: BUSY → Busy, SHUTTING_DOWN → ShuttingDown,
    NOT_FOUND → PeerUnreachable, PROTOCOL → ProtocolError, any other code → SwarmError."""
    message = f"peer {peer_id[:12]}…: {err.message}"
    kinds = {
        ErrorCode.BUSY: Busy,
        ErrorCode.SHUTTING_DOWN: ShuttingDown,
        ErrorCode.NOT_FOUND: PeerUnreachable,
        ErrorCode.PROTOCOL: ProtocolError,
    }
    return kinds.get(err.code, SwarmError)(message)
