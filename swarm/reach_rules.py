"""Reachability decisions (pure): what a peer's dial-back answers say about it, which addresses it
then announces, and how much dialling back another peer may ask of this one.

A peer behind a NAT or firewall with no port forward accepts no inbound connection: clients and the
previous hop's peer cannot reach it, however it announces itself. It learns this by asking peers it
reached (outbound, so the asked peer sees its address from outside) to dial it back (swarm/reach.py
does the I/O). Each answer says which address the asked peer saw it at, whether a TCP dial of its
direct port at that host carried a nonce to its own listener (the proof: the asking peer saw its own
nonce arrive), and whether its libp2p port at that host accepted a TCP connection.

Decisions, in `decide`:
- "public": at least one dial-back reached the direct listener (or, for a peer with no direct
  listener, the libp2p port); the host it was reached at is confirmed as the peer's public address.
- "private": at least `min_answers` peers answered and none reached it.
- "unknown": nobody answered (a first peer with nobody to ask, or every asked peer too old to answer).

The asked peer dials only the host it saw the asker at, never an address the asker names, and only
within `DialBackBudget`: no reflection of its dials at a third party, no amplification.

A dial-back from a peer on the asker's own LAN reaches it at its LAN address: "public" then means
"reachable by some peer", which is what routing needs from a swarm that runs on one LAN too.

This module opens no sockets and reads no clock: the caller passes `now_s`.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from swarm.netaddr import maddr_host_port

PUBLIC, PRIVATE, UNKNOWN = "public", "private", "unknown"
MODES = ("auto", PUBLIC, PRIVATE)
"""Values of `swarm serve --reachability`: auto probes; public and private force the result."""

MIN_ANSWERS = 1
"""Failed dial-backs from this many distinct peers make a peer "private" (a small swarm has only
its bootstrap peer to ask)."""
MAX_DIALBACK_PORTS = 2
"""Ports one request may name (the direct port and the libp2p port)."""
DIALBACKS_PER_WINDOW = 16
"""Dial-backs a peer makes for all askers together per `DIALBACK_WINDOW_S`."""
DIALBACKS_PER_ASKER = 2
"""Dial-backs a peer makes for one asking peer id per `DIALBACK_WINDOW_S`."""
DIALBACK_WINDOW_S = 60.0


@dataclass(frozen=True)
class DialBackAnswer:
    """One asked peer's answer to a dial-back request.

    Attributes:
        peer_id: the asked peer.
        observed_host: the IP the asked peer saw this peer's connection come from ("": not said).
        direct_ok: this peer's direct listener received the nonce (the asker saw it itself).
        libp2p_ok: the asked peer's TCP dial of the libp2p port at observed_host connected (its
            word; None: not asked or not tried).
        error: why the asked peer did not answer or refused ("" when it answered).
    """

    peer_id: str
    observed_host: str = ""
    direct_ok: bool = False
    libp2p_ok: bool | None = None
    error: str = ""


@dataclass(frozen=True)
class Reachability:
    """What a peer knows of its reachability from outside, and why.

    Attributes:
        status: "public", "private" or "unknown" (as announced: `Announcement.reachability`).
        observed_host: the IP other peers reach this peer at, confirmed by a dial-back ("" when
            none was confirmed).
        direct_ok: the direct port at observed_host was reached.
        libp2p_ok: the libp2p port at observed_host accepted a connection.
        forced: set by `--reachability public|private`, not probed.
        reason: one line for logs and status: what the answers were.
    """

    status: str
    observed_host: str = ""
    direct_ok: bool = False
    libp2p_ok: bool = False
    forced: bool = False
    reason: str = ""

    @property
    def private(self) -> bool:
        """Others cannot dial this peer (a relay or a port forward is needed to serve them)."""
        return self.status == PRIVATE


def forced(mode: str) -> Reachability:
    """The reachability `--reachability public|private` sets. Raises ValueError for another mode."""
    if mode not in (PUBLIC, PRIVATE):
        raise ValueError(f"reachability can be forced to public or private, not {mode!r}")
    return Reachability(mode, forced=True, reason=f"set by --reachability {mode}")


def decide(answers: Iterable[DialBackAnswer], *, has_direct: bool, min_answers: int = MIN_ANSWERS) -> Reachability:
    """The reachability the answers of distinct asked peers show (see the module docstring).

    Args:
        answers: one per asked peer; those with `error` did not answer.
        has_direct: the peer runs a direct listener (its nonce can prove a dial-back); without one,
            the libp2p port's connection is the only evidence.
        min_answers: answered-but-failed dial-backs needed for "private".
    Returns:
        Reachability; observed_host is the host of the first answer that reached the peer.
    """
    answers = list(answers)
    answered = [a for a in answers if not a.error]
    for a in answered:
        reached = a.direct_ok if has_direct else bool(a.libp2p_ok)
        if reached:
            how = "its direct port" if has_direct else "its libp2p port"
            return Reachability(PUBLIC, a.observed_host, a.direct_ok, bool(a.libp2p_ok),
                                reason=f"peer {a.peer_id[:12]}… dialled {how} back at {a.observed_host}")
    if answered and len({a.peer_id for a in answered}) >= min_answers:
        seen = ", ".join(sorted({a.observed_host for a in answered if a.observed_host})) or "?"
        return Reachability(PRIVATE, reason=f"{len(answered)} peer(s) saw it at {seen} but could not dial "
                            "it back (behind a NAT or firewall with no port forward)")
    why = "; ".join(f"{a.peer_id[:12]}…: {a.error}" for a in answers if a.error) or "no peer to ask"
    return Reachability(UNKNOWN, reason=f"no dial-back answer ({why})")


def announced_direct_addrs(local: Sequence[str], reach: Reachability, port: int) -> tuple[str, ...]:
    """The direct endpoints to announce: the confirmed public one first (a port forward found by
    dial-back, no `--public-address` needed), then the listener's own.

    Args:
        local: the listener's multiaddrs at this machine's addresses.
        reach: the probe's result.
        port: the direct listener's port (a forward keeps the port: that is what was dialled).
    """
    if not (reach.direct_ok and reach.observed_host):
        return tuple(local)
    observed = _tcp_maddr(reach.observed_host, port)
    return (observed, *(a for a in local if a != observed))


def announced_addrs(local: Sequence[str], reach: Reachability, port: int, peer_id: str) -> tuple[str, ...]:
    """The libp2p multiaddrs to announce: the confirmed public one first (`/.../p2p/<peer_id>`), then
    the daemon's own (as `SwarmDHT.visible_maddrs` gives them).

    Args:
        port: the libp2p listen port (what the dial-back connected to at the observed host).
    """
    if not (reach.libp2p_ok and reach.observed_host):
        return tuple(local)
    observed = f"{_tcp_maddr(reach.observed_host, port)}/p2p/{peer_id}"
    return (observed, *(a for a in local if a != observed))


def dialback_targets(observed_maddr: str, ports: Sequence[int]) -> list[tuple[str, int]]:
    """Where a dial-back request may be dialled: the observed host only, at the ports asked.

    Args:
        observed_maddr: the multiaddr the asker's connection came from (libp2p's view).
        ports: the ports the asker names, at most MAX_DIALBACK_PORTS, each in 1024..65535.
    Returns:
        (host, port) pairs, host always the observed one.
    Raises:
        ValueError: the connection did not come over IP/TCP (a relayed one has no host to dial), or
            the ports are too many, repeated or out of range.
    """
    hp = maddr_host_port(observed_maddr)
    if hp is None:
        raise ValueError(f"the request came over {observed_maddr[:80]!r}, which has no IP/TCP host to dial back")
    if not 1 <= len(ports) <= MAX_DIALBACK_PORTS or len(set(ports)) != len(ports):
        raise ValueError(f"a dial-back names 1..{MAX_DIALBACK_PORTS} distinct ports, got {list(ports)[:8]}")
    for port in ports:
        if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
            raise ValueError(f"dial-back ports must be integers in 1024..65535, got {port!r:.20}")
    return [(hp[0], port) for port in ports]


class DialBackBudget:
    """Dial-backs one answering peer makes: at most `per_window` in all and `per_asker` per asking
    peer id in any `window_s` (pure; the caller passes the time)."""

    def __init__(self, per_window: int = DIALBACKS_PER_WINDOW, per_asker: int = DIALBACKS_PER_ASKER,
                 window_s: float = DIALBACK_WINDOW_S):
        self._per_window, self._per_asker, self._window_s = per_window, per_asker, window_s
        self._granted: deque[tuple[float, str]] = deque()

    def grant(self, asker: str, now_s: float) -> str | None:
        """Take one dial-back for `asker` now: None when granted, else why not."""
        while self._granted and self._granted[0][0] <= now_s - self._window_s:
            self._granted.popleft()
        if len(self._granted) >= self._per_window:
            return f"busy: {self._per_window} dial-backs in the last {self._window_s:.0f} s"
        if sum(1 for _, who in self._granted if who == asker) >= self._per_asker:
            return f"at most {self._per_asker} dial-backs per peer per {self._window_s:.0f} s"
        self._granted.append((now_s, asker))
        return None


def _tcp_maddr(host: str, port: int) -> str:
    return f"/ip{ipaddress.ip_address(host).version}/{host}/tcp/{port}"


def unreachable_words(reachabilities: Sequence[str]) -> str:
    """Why announced peers did not answer, and the fix, for status and NoRoute messages.

    Args:
        reachabilities: the `Announcement.reachability` of each peer that did not answer.
    """
    n, private = len(reachabilities), sum(1 for r in reachabilities if r == PRIVATE)
    if private:
        cause = (f"{'it announces' if n == 1 else f'{private} of them announce'} private reachability: "
                 "behind a NAT or firewall with no port forward")
    else:
        cause = "crashed, frozen, or behind a NAT or firewall with no port forward"
    return (f"{cause}; fix: let such peers take a relay, forward their ports (libp2p and direct), "
            "or start them with --public-address")
