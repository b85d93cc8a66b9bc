"""Addresses a peer listens on and advertises: IP literals, multiaddrs, libtorrent listen strings.

IPv4 and IPv6 are handled alike everywhere: a host is an IP literal (`127.0.0.1`, `::1`,
`[::1]`), a libp2p multiaddr names it `/ip4/...` or `/ip6/...`, and libtorrent's listen string
puts an IPv6 host in brackets (`[::1]:6881`; `::1:6881` does not parse). A wildcard host
(`0.0.0.0`, `::`) listens on every interface of its family; what other peers are told is then the
interface addresses the libp2p daemon reports, or the `--public-address` when one is given.

Every check here runs before any daemon or socket starts, so a bad `--host` is one clear error.

This module is pure: it opens no sockets and resolves no names.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from swarm.errors import AddressError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class NetConfig:
    """Where a peer listens and what it tells others, checked by `check_net_config`.

    Attributes:
        host: IP literal to listen on (libp2p and BitTorrent); a wildcard listens on every interface.
        port: libp2p TCP port, 0..65535 (0: any free port).
        bt_port: BitTorrent TCP port, 0..65535 (0: any free port, the same on every interface).
        public_address: IP literal other peers reach this machine at (a NAT's public address);
            when given, it is the only address advertised, and `port` must be fixed (not 0).
    """

    host: str = "127.0.0.1"
    port: int = 0
    bt_port: int = 0
    public_address: str | None = None


def parse_host(text: str, what: str = "--host") -> IPAddress:
    """The IP address of a host argument: an IPv4 or IPv6 literal, IPv6 optionally in brackets.

    Args:
        text: e.g. "127.0.0.1", "0.0.0.0", "::1", "[::1]", "::".
        what: the option's name, for the message.
    Returns:
        the address (IPv4-mapped IPv6 addresses are returned as IPv4).
    Raises:
        AddressError: a name ("localhost"), a scoped IPv6 address ("fe80::1%eth0"), or not an address.
    """
    if not isinstance(text, str):
        raise AddressError(f"{what} must be an IP address, got {type(text).__name__}")
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if "%" in bare:
        raise AddressError(f"{what} {text!r:.80}: scoped IPv6 addresses are not supported; use a global one")
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        raise AddressError(
            f"{what} must be an IP address such as 127.0.0.1, 0.0.0.0, ::1 or ::, got {text!r:.80}"
        ) from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def check_port(port: object, what: str = "--port") -> int:
    """`port` if it is an integer in 0..65535 (0: any free port). Raises AddressError."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise AddressError(f"{what} must be an integer in 0..65535, got {port!r:.40}")
    return port


def check_net_config(cfg: NetConfig) -> NetConfig:
    """Refuse a listen/advertise combination that cannot work, before anything starts.

    Returns:
        the config with hosts in canonical form (no brackets).
    Raises:
        AddressError: a host that is not an IP literal; a port out of range; a public address that
            is a wildcard, of another family than `host`, or given with `port` 0 (other peers must
            know the port; libp2p cannot announce port 0).
    """
    host = parse_host(cfg.host)
    port = check_port(cfg.port)
    bt_port = check_port(cfg.bt_port, "--bt-port")
    public = None
    if cfg.public_address is not None:
        pub = parse_host(cfg.public_address, "--public-address")
        if pub.is_unspecified:
            raise AddressError(f"--public-address must be an address others can reach, not {pub}")
        if pub.version != host.version:
            raise AddressError(
                f"--public-address {pub} is IPv{pub.version} but --host {host} is IPv{host.version}"
            )
        if port == 0:
            raise AddressError("--public-address needs a fixed --port (the port forwarded to this machine)")
        public = str(pub)
    return NetConfig(host=str(host), port=port, bt_port=bt_port, public_address=public)


def tcp_multiaddr(host: str, port: int) -> str:
    """`/ip4/HOST/tcp/PORT` or `/ip6/HOST/tcp/PORT`. Raises AddressError on a bad host or port."""
    ip = parse_host(host)
    return f"/ip{ip.version}/{ip}/tcp/{check_port(port)}"


def bt_listen_string(host: str, port: int) -> str:
    """libtorrent's `listen_interfaces` entry: `HOST:PORT`, an IPv6 host in brackets.

    Raises:
        AddressError: a bad host or port.
    """
    ip = parse_host(host)
    port = check_port(port)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def maddr_host_port(maddr: str) -> tuple[str, int] | None:
    """(host, port) of a `/ip4/HOST/tcp/PORT[/...]` or `/ip6/HOST/tcp/PORT[/...]` multiaddr string.

    Returns:
        None for any other multiaddr (DNS names, UDP, relays) or a malformed one; never raises.
    """
    if not isinstance(maddr, str):
        return None
    parts = maddr.split("/")
    if len(parts) < 5 or parts[0] != "" or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
        return None
    try:
        ip = ipaddress.ip_address(parts[2])
        port = int(parts[4])
    except ValueError:
        return None
    if f"ip{ip.version}" != parts[1] or not parts[4].isdigit() or not 0 < port <= 65535:
        return None
    return str(ip), port


def listen_port(maddrs: Iterable[str]) -> int | None:
    """The TCP port of the first IP/TCP multiaddr of `maddrs` (a `/p2p/<id>` tail allowed): the port
    a libp2p daemon listens on, as its visible multiaddrs name it; None when none is IP/TCP."""
    for maddr in maddrs:
        hp = maddr_host_port(maddr.split("/p2p/", 1)[0])
        if hp is not None:
            return hp[1]
    return None


def advertised_hosts(maddrs: Iterable[str]) -> list[str]:
    """The distinct IP hosts of `maddrs` (see `maddr_host_port`), wildcards left out; addresses
    other machines can reach come first, loopback ones (useful only on this machine) last."""
    hosts: list[str] = []
    for maddr in reachable_first(maddrs):
        hp = maddr_host_port(maddr)
        if hp is not None and hp[0] not in hosts and not ipaddress.ip_address(hp[0]).is_unspecified:
            hosts.append(hp[0])
    return hosts


def is_ip_maddr(line: str) -> bool:
    """Whether a line of a peer's output is one of its TCP multiaddrs (`/ip4/...` or `/ip6/...`)."""
    return maddr_host_port(line.split("/p2p/", 1)[0]) is not None and "/p2p/" in line


def bt_hosts(net: NetConfig, visible_maddrs: Iterable[str]) -> list[str]:
    """The hosts a BitTorrent session on `net.host` is advertised at.

    Args:
        net: a checked config (`check_net_config`).
        visible_maddrs: the multiaddrs the libp2p daemon reports for the same host (for a wildcard,
            one per interface address).
    Returns:
        [public_address] when one is given; else [host] for a specific host; else the interface
        addresses of `visible_maddrs` (`advertised_hosts`), reachable ones first.
    """
    if net.public_address is not None:
        return [net.public_address]
    if not parse_host(net.host).is_unspecified:
        return [net.host]
    return advertised_hosts(visible_maddrs)


def reachable_first(maddrs: Iterable[str]) -> list[str]:
    """`maddrs` with loopback ones (reachable only from this machine) moved last, order kept otherwise."""

    def loopback(maddr: str) -> bool:
        hp = maddr_host_port(maddr)
        return hp is not None and ipaddress.ip_address(hp[0]).is_loopback

    return sorted(maddrs, key=loopback)
