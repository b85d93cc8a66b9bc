"""Port-mapping decisions (pure): when a peer asks its home router (UPnP IGD) to forward its ports,
which ports, for how long, and when it renews.

A volunteer behind a home router with UPnP need not forward ports by hand: the peer asks the router
(swarm/portmap.py does the I/O) to forward its listen ports, each at the same port number outside,
because the dial-back probe (swarm/reach.py) dials the ports it is told at the address it saw, and
the announcement keeps the port (reach_rules.announced_addrs). Only a successful dial-back makes the
mapped address public: a router that maps but sits behind a second NAT gains the peer nothing, and
the probe says so.

Ports mapped: the libp2p port, the direct-stream port and the relay port (when the peer runs one),
TCP only (every swarm stream is TCP). Not mapped: ports below 1024 (routers' default UPnP
permissions and the dial-back refuse them) and the BitTorrent port (it announces its local hosts).

Leases: LEASE_S, renewed after half of it, so a peer that dies without deleting its mappings leaves
them at most LEASE_S; a router that only grants permanent leases (UPnP error 725) gets lease 0 and no
renewal, and the peer deletes them on a clean stop as always.

This module opens no sockets and reads no clock.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

MODES = ("auto", "off")
"""Values of `swarm serve --port-mapping`: auto asks a UPnP router when one answers; off never."""
LEASE_S = 3600
"""Seconds a mapping is asked for."""
RENEW_FRACTION = 0.5
"""A mapping is asked for again after this fraction of its lease."""
MIN_PORT = 1024
PERMANENT_ONLY = "OnlyPermanentLeasesSupported"
"""miniupnpc's text for UPnP error 725: the router grants only leases of 0 (permanent)."""
DESCRIPTION_CHARS = 40
"""A mapping's description as the router lists it, at most this long."""


@dataclass(frozen=True)
class PortToMap:
    """One listen port to forward at the same port number outside.

    Attributes:
        role: "libp2p", "direct" or "relay" (in logs and the router's description).
        port: the TCP port, inside and outside.
    """

    role: str
    port: int


def skip_reason(mode: str, reachability: str, host: str, public_address: str | None) -> str | None:
    """Why this peer does not try port mapping, or None when it does.

    Args:
        mode: `--port-mapping` ("auto" or "off").
        reachability: `--reachability` ("auto", "public", "private").
        host: the listen address (an IP literal; a wildcard listens on every interface).
        public_address: `--public-address`, or None.
    Raises:
        ValueError: `mode` is not one of MODES.
    """
    if mode not in MODES:
        raise ValueError(f"--port-mapping must be one of {', '.join(MODES)}, got {mode!r:.40}")
    if mode == "off":
        return "--port-mapping off"
    if reachability == "private":
        return "--reachability private: the peer takes a relay instead"
    if public_address is not None:
        return "--public-address: the ports are forwarded by hand"
    ip = ipaddress.ip_address(host)
    if ip.is_loopback:
        return f"it listens on loopback only ({host})"
    if ip.version != 4:
        return f"UPnP IGD maps IPv4 ports, and it listens on {host}"
    return None


def ports_to_map(
    libp2p_port: int | None, direct_port: int | None, relay_port: int | None
) -> tuple[PortToMap, ...]:
    """The listen ports to forward (None or 0: that listener does not run), in this order; ports
    below MIN_PORT are left out."""
    ports = (("libp2p", libp2p_port), ("direct", direct_port), ("relay", relay_port))
    return tuple(PortToMap(role, port) for role, port in ports if port and port >= MIN_PORT)


def internal_host(host: str, lan_address: str) -> str:
    """The address a mapping forwards to: the listen address, or for a wildcard the address this
    machine reaches the router from (`lan_address`, as the UPnP client found it)."""
    return lan_address if ipaddress.ip_address(host).is_unspecified else host


def renew_after_s(lease_s: int) -> float | None:
    """Seconds until a mapping granted for `lease_s` is asked for again; None for a permanent one
    (lease 0)."""
    return lease_s * RENEW_FRACTION if lease_s > 0 else None


def lease_after_refusal(error: str, lease_s: int) -> int | None:
    """The lease to ask for again after the router refused `lease_s` with `error`, or None when a
    retry cannot help (only a router that grants permanent leases only is asked again, for 0)."""
    return 0 if PERMANENT_ONLY in error and lease_s != 0 else None


def description(role: str, peer_id: str) -> str:
    """A mapping's description, as the router shows it to its owner: "swarm <role> <peer id>"."""
    return f"swarm {role} {peer_id}"[:DESCRIPTION_CHARS]


def mapped_words(mapped: Sequence[PortToMap], failed: Sequence[tuple[PortToMap, str]], router: str,
                 lease_s: int) -> str:
    """One log line: what the router mapped and refused.

    Args:
        mapped: the ports the router forwards now.
        failed: (port, why) for each the router refused.
        router: the router's description (its external address as it reports it).
        lease_s: the lease granted (0: permanent).
    """
    lease = "permanently" if lease_s == 0 else f"for {lease_s} s"
    words = []
    if mapped:
        ports = ", ".join(f"{p.port} ({p.role})" for p in mapped)
        words.append(f"UPnP router {router} forwards TCP {ports} {lease}")
    if failed:
        why = "; ".join(f"{p.port} ({p.role}): {e}" for p, e in failed)
        words.append(f"UPnP router {router} refused {why}")
    return "; ".join(words) or f"UPnP router {router}: no port to map"
