"""UPnP routers in the network lab (sim/netlab.py): Debian's miniupnpd (package miniupnpd-nftables)
runs on a home site's router and forwards ports its LAN asks for, as a home router with UPnP does.

    with Lab() as lab:
        home = lab.home("h0")
        enable_upnp(lab, home)             # miniupnpd on h0's router, answering on its LAN
        port_mappings(lab, home)           # [Redirect(proto, port, to_host, to_port)] it holds now

Two facts shape it:
- miniupnpd refuses to map while its external interface has a private address, and every lab
  address is private; with `ext_perform_stun=yes` it asks a STUN server for its external address
  instead. `enable_upnp` starts one (sim/stunlab.py) on a public site named "stun" (the first call
  adds the site; later routers share it). It answers with the router's WAN address and ignores
  CHANGE-REQUEST, which miniupnpd takes for a 1:1 NAT that lets mapped ports in.
- miniupnpd (nftables) adds its rules to chains it expects to exist: MINIUPNPD_NFT makes them in
  a table of their own (`inet upnp`), as the package's /etc/miniupnpd/nft_init.sh would (its helper
  script is missing from the package). The DNAT rules it adds there pass the router's forward
  filter (sim/netlab.py accepts `ct status dnat`); the lab's own NAT and filter tables are untouched.

miniupnpd runs in the foreground (`-d`), logging to <lab.workdir>/miniupnpd-<site>.log, with its pid
file there too (so routers of parallel labs never see each other's); it answers only its LAN
(`secure_mode`: each host maps ports to itself only, 1024-65535) and speaks UPnP IGD, not NAT-PMP/PCP.
The lab's teardown ends it with every other process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

from sim import netns
from sim.netlab import Lab, Site
from sim.netns import LabError
from sim.netprobe import REPO_ROOT

MINIUPNPD = "/usr/sbin/miniupnpd"
STUN_SITE = "stun"
STUN_PORT = 3478
READY_S = 20.0
"""How long miniupnpd (its STUN check included, 3 s) and the STUN server may take to start."""
TABLE = "upnp"
MINIUPNPD_NFT = f"""
table inet {TABLE} {{
  chain forward {{ type filter hook forward priority filter; policy accept; jump miniupnpd; }}
  chain miniupnpd {{ }}
  chain prerouting {{ type nat hook prerouting priority dstnat; policy accept; jump prerouting_miniupnpd; }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept; jump postrouting_miniupnpd;
  }}
  chain prerouting_miniupnpd {{ }}
  chain postrouting_miniupnpd {{ }}
}}
"""
_REDIRECT = re.compile(r"@nh,72,8 (0x[0-9a-f]+) th dport (\d+) dnat ip to ([\d.]+):(\d+)")
_PROTOS = {6: "tcp", 17: "udp"}


@dataclass(frozen=True)
class Redirect:
    """One port mapping a UPnP router holds: `proto` `port` on its WAN address goes to to_host:to_port."""

    proto: str
    port: int
    to_host: str
    to_port: int


def upnp_available() -> str | None:
    """Why a UPnP router cannot run in a lab here (miniupnpd not installed), or None."""
    if shutil.which("miniupnpd") is None and not os.path.exists(MINIUPNPD):  # sbin: not on every PATH
        return "miniupnpd is not installed (apt-get install miniupnpd-nftables)"
    return None


def enable_upnp(lab: Lab, home: Site) -> subprocess.Popen:
    """Run miniupnpd on `home`'s router and return once it answers on the LAN (see the module
    docstring); the STUN site is added on the first call.

    Raises:
        LabError: `home` has no router, miniupnpd is missing, or it (or the STUN server) did not start.
    """
    if home.router is None:
        raise LabError(f"{home.name} is a public site: it has no router to run UPnP on")
    why = upnp_available()
    if why:
        raise LabError(why)
    stun = lab.sites.get(STUN_SITE) or _start_stun(lab)
    gw = home.router
    netns.nft(gw.ns, MINIUPNPD_NFT)
    lan = gw.lan_address.rsplit(".", 1)[0] + ".0/24"
    conf = lab.workdir / f"miniupnpd-{home.name}.conf"
    conf.write_text(f"""ext_ifname=wan0
listening_ip=lan0
http_port=0
enable_natpmp=no
enable_upnp=yes
ext_perform_stun=yes
ext_stun_host={stun.address}
ext_stun_port={STUN_PORT}
secure_mode=yes
system_uptime=yes
uuid={uuid.uuid4()}
upnp_table_name={TABLE}
upnp_nat_table_name={TABLE}
allow 1024-65535 {lan} 1024-65535
deny 0-65535 0.0.0.0/0 0-65535
""")
    log_path = lab.workdir / f"miniupnpd-{home.name}.log"
    with open(log_path, "w") as log:
        argv = [shutil.which("miniupnpd") or MINIUPNPD, "-d", "-f", str(conf),
                "-P", str(lab.workdir / f"miniupnpd-{home.name}.pid")]
        proc = lab.spawn(gw, argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + READY_S
    while "HTTP listening on port" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            netns.stop(proc)
            raise LabError(f"miniupnpd on {gw.ns} did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.05)  # the poll interval of this wait for miniupnpd's log line
    if "Port forwarding is now enabled" not in log_path.read_text():
        raise LabError(f"miniupnpd on {gw.ns} does not forward ports: {log_path.read_text()[-2000:]}")
    return proc


def port_mappings(lab: Lab, home: Site) -> list[Redirect]:
    """The port mappings `home`'s UPnP router holds now (read from its nftables rules)."""
    listed = lab.run(home.router, ["nft", "list", "chain", "inet", TABLE, "prerouting_miniupnpd"]).stdout
    return [Redirect(_PROTOS.get(int(proto, 16), proto), int(port), host, int(to_port))
            for proto, port, host, to_port in _REDIRECT.findall(listed)]


def _start_stun(lab: Lab) -> Site:
    site = lab.public(STUN_SITE)
    proc = lab.spawn(site, [sys.executable, "-m", "sim.stunlab", site.address, str(STUN_PORT)],
                     cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if netns.first_line(proc, READY_S) != "listening":
        netns.stop(proc)
        raise LabError(f"the STUN server did not start: {proc.stderr.read().strip()[-2000:]}")
    return site
