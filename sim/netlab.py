"""The network lab: a small internet on one Linux machine, in network namespaces, for tests and
benchmarks of peers that sit behind home routers or far apart.

Layout (every name starts with the lab's own prefix, `swl<owner pid>x<4 hex>-`, so labs running in
parallel, or left behind by a killed run, never collide):

    <prefix>wan        the internet: bridge br0 with the gateway 10.77.0.1, which silently drops
                       (blackholes) whatever is not on 10.77.0.0/24, as the internet drops private
                       addresses: a dial to a home's private address times out, it is not refused
    <prefix>NAME       a public site (`Lab.public`): 10.77.0.N on br0, default route via the gateway
    <prefix>NAME-gw    a home site's router (`Lab.home`): WAN 10.77.0.N on br0, LAN 10.77.J.1/24;
                       nftables masquerade out of the WAN (the source port kept when free, or
                       randomised with nat="random"); forwards only LAN->WAN, replies and port
                       forwards (`Lab.forward`); new connections from the WAN to the router itself
                       are dropped silently (no RST)
    <prefix>NAME       the home site behind it: 10.77.J.2, default route via 10.77.J.1

Every site's link to br0 (a public site's, or a home router's) can hold frames for a one-way delay
(`Lab.set_delay`, `Lab.set_rtt`) through the userspace delay line (sim/delayline.py, one process in
the wan namespace; this kernel has no netem), and limit rate both ways with `tbf` (`rate_mbit`).
Links without delay are bridged directly. Offloads are off on every veth of the lab (the delay line
re-sends frames as they are), and IPv6 is off in every namespace.

API (stable; tests and scripts/bench_wan.py build on it):
    lab_available() -> str | None          None, or why a lab cannot run here (tests skip with it)
    with Lab() as lab:                     everything is torn down on exit, also when the body raises
        site = lab.public(name, rate_mbit=None) -> Site
        home = lab.home(name, nat="keep" | "random", rate_mbit=None) -> Site  (home.router: Router)
        lab.forward(home, *ports)          router port forwards (TCP and UDP) to the home site
        lab.set_rtt(rtt_ms)                every site link rtt/4 each way: any two sites rtt apart
        lab.set_delay({site: one_way_ms})  per-link delays (the others keep theirs)
        lab.exec_prefix(site) -> argv      `ip netns exec NS`: prepend to run anything in the site
        lab.run(site, argv) -> CompletedProcess;  lab.spawn(site, argv) -> Popen (ended at teardown)
        lab.pids() -> [pid]                every process inside the lab now
        lab.workdir -> Path                a directory for the lab's own files, removed at teardown
    sim.netprobe: listen(lab, site, port) -> Popen;  ping(lab, site, addr, port, ...) -> PingResult
    site.address (its own), site.public_address (what other sites dial: its router's WAN address
    behind a NAT), site.ns, site.router.
    tests/helpers/lab.py: `start_in` (a `swarm` peer inside a site), `forwarded_args` (port forwards
    and the serve flags for them), `swarm_in` (any `swarm` command there), `chat_in` (a client
    there); tests/lab/conftest.py skips lab tests with `lab_available()`'s reason.

Teardown ends every process inside the lab's namespaces (SIGTERM, then SIGKILL after
`netns.STOP_GRACE_S`), stops the delay line and deletes the namespaces; the veths and the bridge go with
them. `sweep_stale()` (run by every new Lab) removes labs whose owner process is gone.

This module does not: hole-punch, relay, offer UPnP (sim/upnplab.py does) or NAT-PMP, or use
public addresses (libp2p treats 10.x as private, so AutoNAT and DCUtR never start here); touch the root namespace's interfaces,
routes or firewall; or reach outside the machine (no namespace has a route out).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sim import delayline, netns
from sim.delayline import Pair
from sim.netns import LabError

__all__ = ["Lab", "LabError", "Router", "Site", "lab_available", "lab_namespaces", "sweep_stale"]

LAB_PREFIX = "swl"
BRIDGE_NET = "10.77.0"
"""The internet's /24: the gateway, public sites and routers' WAN addresses."""
GATEWAY = "10.77.0.1"
FIRST_HOST = 10
"""Sites and routers on the bridge get 10.77.0.FIRST_HOST + n, in the order they are made."""
MAX_SITES = 200
NAT_MODES = ("keep", "random")


@dataclass(frozen=True)
class Router:
    """A home site's NAT router.

    Attributes:
        ns: its namespace.
        wan_address: its address on the internet (10.77.0.N): what the home site looks like from there.
        lan_address: its address on the home network (10.77.J.1).
        nat: "keep" (masquerade keeps the source port when it is free) or "random" (randomised ports).
    """

    ns: str
    wan_address: str
    lan_address: str
    nat: str


@dataclass(frozen=True)
class Site:
    """A host in the lab.

    Attributes:
        name: the name given to `Lab.public` / `Lab.home`.
        ns: its namespace.
        address: its own IPv4 address (the one to listen on).
        link: index of its link to the internet (its router's, behind a NAT): names the link's veths.
        router: its NAT router, or None for a public site.
    """

    name: str
    ns: str
    address: str
    link: int
    router: Router | None = None

    @property
    def public_address(self) -> str:
        """The address other sites dial to reach this one (through port forwards, behind a NAT)."""
        return self.router.wan_address if self.router else self.address


Where = Site | Router
"""Anything a command can run in: a site or a router."""


@functools.cache
def lab_available() -> str | None:
    """Why a lab cannot run on this machine, or None when it can (`netns.missing`: Linux, root's
    network capabilities, the tools, and a namespace actually made). Cached per process."""
    return netns.missing(f"{LAB_PREFIX}{os.getpid()}xprobe")


def lab_namespaces() -> list[str]:
    """Every namespace of every lab on this machine (names only)."""
    return netns.listed(LAB_PREFIX)


def sweep_stale() -> list[str]:
    """Delete the namespaces of labs whose owner process is gone (a run killed before its teardown),
    ending the processes left inside them first. Returns the namespaces deleted."""
    stale = []
    for ns in lab_namespaces():
        m = re.match(rf"{LAB_PREFIX}(\d+)x", ns)
        if m and not netns.alive(int(m.group(1))):
            stale.append(ns)
    netns.end_processes(stale)
    for ns in stale:
        netns.delete(ns)
    return stale


class Lab:
    """One lab: the internet namespace on enter, sites added by `public` and `home`, all of it removed
    on exit (see the module docstring).

    Raises:
        LabError: on enter, when `lab_available()` gives a reason, or a setup command fails.
    """

    def __init__(self) -> None:
        self.prefix = f"{LAB_PREFIX}{os.getpid()}x{secrets.token_hex(2)}-"
        self.wan = self.prefix + "wan"
        self.sites: dict[str, Site] = {}
        self._namespaces: list[str] = []
        self._hosts = 0  # addresses handed out on the bridge
        self._homes = 0  # home LANs handed out
        self._delays_ms: dict[int, float] = {}  # link -> one-way delay
        self._spawned: list[subprocess.Popen] = []
        self._delayline: subprocess.Popen | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="swarm-lab-")
        self.workdir = Path(self._tmp.name)

    def __enter__(self) -> Lab:
        reason = lab_available()
        if reason:
            raise LabError(reason)
        sweep_stale()
        try:
            self._make_ns(self.wan)
            # bridged frames are not the (empty) firewall's business here
            netns.sysctl(self.wan, "net.bridge.bridge-nf-call-iptables=0", check=False)
            netns.ip(self.wan, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
            netns.ip(self.wan, "addr", "add", f"{GATEWAY}/24", "dev", "br0")
            netns.ip(self.wan, "link", "set", "br0", "up")
            netns.ip(self.wan, "route", "add", "blackhole", "default")
            netns.sysctl(
                self.wan,
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.send_redirects=0",
                "net.ipv4.conf.br0.send_redirects=0",
            )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End every process in the lab, stop the delay line, delete every namespace (idempotent)."""
        self._stop_delayline()
        netns.end_processes(self._namespaces)  # the spawned ones, and anything they started there
        for proc in self._spawned:
            netns.stop(proc)  # gone already: this reaps it
        for ns in reversed(self._namespaces):
            netns.delete(ns)
        self._namespaces.clear()
        self._spawned.clear()
        self._tmp.cleanup()

    def public(self, name: str, *, rate_mbit: float | None = None) -> Site:
        """A public site on the internet (10.77.0.N), reachable from every other site.

        Args:
            name: unique in this lab; letters, digits and '-' (names its namespace).
            rate_mbit: limit its link both ways to this many Mbit/s (tbf); None: no limit.
        Raises:
            LabError: a bad or repeated name, too many sites, or a setup command failed.
        """
        ns = self._new_site_ns(name)
        address, link = self._attach(ns, "eth0", rate_mbit)
        netns.ip(ns, "route", "add", "default", "via", GATEWAY)
        site = Site(name, ns, address, link)
        self.sites[name] = site
        return site

    def home(self, name: str, *, nat: str = "keep", rate_mbit: float | None = None) -> Site:
        """A home site (10.77.J.2) behind its own NAT router (WAN 10.77.0.N, LAN 10.77.J.1).

        Args:
            name: as for `public`; the router's namespace is NAME-gw.
            nat: "keep": masquerade keeps the source port when it is free (most home routers);
                "random": a random source port per connection (port-randomising NAT).
            rate_mbit: limit the router's internet link both ways (tbf); None: no limit.
        Raises:
            LabError: a bad name or nat mode, too many sites, or a setup command failed.
        """
        if nat not in NAT_MODES:
            raise LabError(f"nat must be one of {NAT_MODES}, got {nat!r}")
        ns = self._new_site_ns(name)
        gw = self.prefix + name + "-gw"
        self._make_ns(gw)
        wan_address, link = self._attach(gw, "wan0", rate_mbit)
        self._homes += 1
        lan = f"10.77.{self._homes}"
        netns.ip(gw, "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", ns)
        for where, ifname, addr in ((gw, "lan0", f"{lan}.1"), (ns, "eth0", f"{lan}.2")):
            netns.offloads_off(where, ifname)
            netns.ip(where, "addr", "add", f"{addr}/24", "dev", ifname)
            netns.ip(where, "link", "set", ifname, "up")
        netns.ip(gw, "route", "add", "default", "via", GATEWAY)
        netns.ip(ns, "route", "add", "default", "via", f"{lan}.1")
        netns.sysctl(gw, "net.ipv4.ip_forward=1")
        netns.nft(gw, _nat_rules(nat))
        site = Site(name, ns, f"{lan}.2", link, Router(gw, wan_address, f"{lan}.1", nat))
        self.sites[name] = site
        return site

    def forward(self, site: Site, *ports: int) -> None:
        """Forward TCP and UDP `ports` on the site's router to the site (a router's port forwards).

        Raises:
            LabError: the site has no router, or a port is out of range.
        """
        if site.router is None:
            raise LabError(f"{site.name} is a public site: it has no router to forward ports on")
        for port in ports:
            if not 0 < port < 65536:
                raise LabError(f"port {port} out of range")
            for proto in ("tcp", "udp"):
                netns.nft(
                    site.router.ns,
                    f'add rule ip lab_nat pre iifname "wan0" {proto} dport {port} dnat to {site.address}\n',
                )

    def set_rtt(self, rtt_ms: float) -> None:
        """Every site link holds frames rtt_ms / 4 each way, so any two sites are `rtt_ms` apart
        (a home's own LAN adds nothing); 0 bridges every link directly again. Sites added later start
        without delay."""
        self.set_delay({s: rtt_ms / 4 for s in self.sites.values()})

    def set_delay(self, one_way_ms: Mapping[Site, float]) -> None:
        """Hold frames on each given site's link (its router's, behind a NAT) for `ms` each way; links
        not named keep their delay. Restarts the delay line: frames in flight at that moment are lost,
        as on a link that flaps (TCP resends them).

        Raises:
            LabError: a negative delay, or the delay line did not start.
        """
        for site, ms in one_way_ms.items():
            if ms < 0:
                raise LabError(f"negative delay {ms} ms for {site.name}")
            self._delays_ms[site.link] = float(ms)
        self._stop_delayline()
        delayed = sorted(link for link, ms in self._delays_ms.items() if ms > 0)
        for link in self._delays_ms:
            # a delayed link's site end leaves the bridge; the bridge sees the delay line's far end
            on, off = (f"l{link}b", f"l{link}p") if link in delayed else (f"l{link}p", f"l{link}b")
            netns.ip(self.wan, "link", "set", off, "nomaster")
            netns.ip(self.wan, "link", "set", on, "master", "br0")
        if delayed:
            pairs = [Pair(f"l{n}p", f"l{n}q", self._delays_ms[n], self._delays_ms[n]) for n in delayed]
            self._delayline = delayline.start(self.wan, pairs, self.workdir)

    def exec_prefix(self, where: Where) -> list[str]:
        """The argv prefix that runs a command in `where`'s namespace (`ip netns exec` execs the
        command: the pid is the command's own)."""
        return netns.exec_prefix(where.ns)

    def run(
        self, where: Where, argv: Sequence[str], *, timeout_s: float = 120.0, check: bool = True, **kwargs
    ) -> subprocess.CompletedProcess:
        """Run `argv` in `where`'s namespace to completion; stdout and stderr captured as text.

        Raises:
            LabError: with `check`, a non-zero exit (the message holds its stderr).
            subprocess.TimeoutExpired: it ran past `timeout_s` (it is killed).
        """
        done = subprocess.run(
            [*self.exec_prefix(where), *argv], capture_output=True, text=True, timeout=timeout_s, **kwargs
        )
        if check and done.returncode != 0:
            raise LabError(f"{' '.join(argv)} in {where.ns}: exit {done.returncode}: {done.stderr.strip()}")
        return done

    def spawn(self, where: Where, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        """Start `argv` in `where`'s namespace, in a session of its own; teardown ends it (and
        anything else still in the lab). Popen keyword arguments pass through."""
        proc = subprocess.Popen([*self.exec_prefix(where), *argv], start_new_session=True, **popen_kwargs)
        self._spawned.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every process inside the lab's namespaces now (spawned ones, the delay line, peers)."""
        return [pid for ns in self._namespaces for pid in netns.pids(ns)]

    def _new_site_ns(self, name: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name):
            raise LabError(f"site name {name!r}: use lower-case letters, digits and '-' (at most 31)")
        if name in self.sites:
            raise LabError(f"site {name!r} exists already")
        ns = self.prefix + name
        self._make_ns(ns)
        return ns

    def _attach(self, ns: str, ifname: str, rate_mbit: float | None) -> tuple[str, int]:
        """Join `ns` to the internet: veth ns:ifname <-> wan:l{N}p (on the bridge), plus the delay
        line's spare path wan:l{N}q <-> wan:l{N}b. Returns (its address, link index N)."""
        if self._hosts >= MAX_SITES:
            raise LabError(f"at most {MAX_SITES} sites and routers on the bridge")
        link = self._hosts + 1
        address = f"{BRIDGE_NET}.{FIRST_HOST + self._hosts}"
        self._hosts += 1
        p, q, b = f"l{link}p", f"l{link}q", f"l{link}b"
        netns.ip(ns, "link", "add", ifname, "type", "veth", "peer", "name", p, "netns", self.wan)
        netns.ip(self.wan, "link", "add", q, "type", "veth", "peer", "name", b)
        for name in (p, q, b):
            netns.offloads_off(self.wan, name)
            netns.ip(self.wan, "link", "set", name, "up")
        netns.ip(self.wan, "link", "set", p, "master", "br0")
        netns.offloads_off(ns, ifname)
        netns.ip(ns, "addr", "add", f"{address}/24", "dev", ifname)
        netns.ip(ns, "link", "set", ifname, "up")
        if rate_mbit is not None:
            for where, dev in ((ns, ifname), (self.wan, p)):  # upload at the site, download at the bridge
                netns.limit_rate(where, dev, rate_mbit)
        self._delays_ms[link] = 0.0
        return address, link

    def _stop_delayline(self) -> None:
        if self._delayline is not None:
            netns.stop(self._delayline)
            self._delayline = None

    def _make_ns(self, ns: str) -> None:
        self._namespaces.append(ns)  # first: a half-made one is deleted too
        netns.make(ns)


def _nat_rules(nat: str) -> str:
    """A home router's nftables ruleset: masquerade out of wan0; a `pre` chain for port forwards;
    forward LAN->WAN, replies and forwarded ports only; new connections to the router itself from
    the WAN dropped (silently, as a home router does)."""
    masquerade = "masquerade random" if nat == "random" else "masquerade"
    return f"""
table ip lab_nat {{
  chain pre {{ type nat hook prerouting priority dstnat; policy accept; }}
  chain post {{ type nat hook postrouting priority srcnat; policy accept; oifname "wan0" {masquerade}; }}
}}
table inet lab_fw {{
  chain input {{ type filter hook input priority filter; policy accept; iifname "wan0" ct state new drop; }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "lan0" oifname "wan0" accept
    ct status dnat accept
  }}
}}
"""
