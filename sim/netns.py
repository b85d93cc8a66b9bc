"""Linux network namespaces for the lab (sim/netlab.py): the commands that make and configure them
(iproute2, sysctl, ethtool, tc, nft) and the processes inside them (listing, ending).

Every command is a subprocess of its tool; a failure raises `LabError` with the tool's own words.

This module does not: decide a topology or addresses (netlab.py does), or touch the root namespace.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

STOP_GRACE_S = 5.0
"""How long processes get to exit after SIGTERM before SIGKILL."""
TOOLS = ("ip", "nft", "ethtool", "tc", "sysctl")
CAP_NET_ADMIN = 12
CAP_NET_RAW = 13


class LabError(RuntimeError):
    """A lab command failed or a lab request was wrong; the message says which and why."""


def missing(probe_ns: str) -> str | None:
    """What keeps this process from building namespaces, or None: Linux, CAP_NET_ADMIN and CAP_NET_RAW,
    the tools in `TOOLS`, and then one namespace (`probe_ns`) made and deleted, since a container can
    hold the capabilities and still be refused."""
    if sys.platform != "linux":
        return f"the network lab needs Linux network namespaces (this is {sys.platform})"
    caps = next((int(ln.split()[1], 16) for ln in Path("/proc/self/status").read_text().splitlines()
                 if ln.startswith("CapEff:")), 0)
    lacking = [n for n, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_NET_RAW", CAP_NET_RAW)) if not caps >> bit & 1]
    if lacking:
        return f"the network lab needs {' and '.join(lacking)} (run as root)"
    tools = [t for t in TOOLS if shutil.which(t) is None]
    if tools:
        return f"the network lab needs {', '.join(tools)} (Debian: apt-get install -y iproute2 nftables ethtool procps)"
    made = sh(["ip", "netns", "add", probe_ns], check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    delete(probe_ns)
    return None


def sh(argv: Sequence[str], *, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command to completion, output captured as text.

    Raises:
        LabError: with `check`, a non-zero exit (the message holds the command and its stderr).
    """
    done = subprocess.run(list(argv), input=input, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done


def exec_prefix(ns: str) -> list[str]:
    """The argv prefix that runs a command in namespace `ns` (`ip netns exec` execs the command, so
    the pid is the command's own)."""
    return ["ip", "netns", "exec", ns]


def make(ns: str) -> None:
    """A new namespace with its loopback up and IPv6 off (no link-local addresses to advertise)."""
    sh(["ip", "netns", "add", ns])
    ip(ns, "link", "set", "lo", "up")
    sysctl(ns, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")


def delete(ns: str) -> None:
    """Delete a namespace (its veths and bridges go with it); one already gone is no error."""
    sh(["ip", "netns", "del", ns], check=False)


def listed(prefix: str) -> list[str]:
    """Every namespace on this machine whose name starts with `prefix`."""
    out = sh(["ip", "netns", "list"]).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(prefix)]


def ip(ns: str, *args: str) -> None:
    """`ip -n NS ARGS...`."""
    sh(["ip", "-n", ns, *args])


def sysctl(ns: str, *settings: str, check: bool = True) -> None:
    """Set sysctls (`name=value`) inside `ns`."""
    sh([*exec_prefix(ns), "sysctl", "-qw", *settings], check=check)


def offloads_off(ns: str, ifname: str) -> None:
    """Checksum and segmentation offloads off: every frame leaves whole and checksummed, so the delay
    line can re-send it as it is."""
    sh([*exec_prefix(ns), "ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off", "gro", "off"])


def tbf_burst_bytes(rate_mbit: float) -> int:
    """The burst a rate limit allows: 10 ms at the rate, and at least four full frames (tbf cannot
    send a frame larger than its burst)."""
    return max(int(rate_mbit * 1e6 / 8 / 100), 4 * 1514)


def limit_rate(ns: str, dev: str, rate_mbit: float) -> None:
    """Limit what `dev` sends to `rate_mbit` Mbit/s (tbf, bursts of `tbf_burst_bytes`, frames queued
    at most 100 ms).

    Raises:
        LabError: a rate <= 0, or tc refused it.
    """
    if rate_mbit <= 0:
        raise LabError(f"rate_mbit must be > 0, got {rate_mbit}")
    sh(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
        "burst", str(tbf_burst_bytes(rate_mbit)), "latency", "100ms"])


def nft(ns: str, ruleset: str) -> None:
    """Load an nftables ruleset (`nft -f -` text) inside `ns`."""
    sh([*exec_prefix(ns), "nft", "-f", "-"], input=ruleset)


def pids(ns: str) -> list[int]:
    """Every process inside `ns` now."""
    return [int(p) for p in sh(["ip", "netns", "pids", ns], check=False).stdout.split()]


def end_processes(namespaces: Sequence[str]) -> None:
    """SIGTERM every process inside the namespaces, SIGKILL those still there after STOP_GRACE_S."""
    found = [p for ns in namespaces for p in pids(ns)]
    for pid in found:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(alive(p) for p in found) and time.monotonic() < deadline:
        time.sleep(0.05)  # the poll interval of this wait for the processes to exit
    for pid in found:
        if alive(pid):
            _kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """A process exists and is not a zombie (a zombie has left its namespace already)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM a process started in a session of its own, and its session; SIGKILL after
    STOP_GRACE_S; reap it."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first line `proc` prints on its stdout pipe, or "" when it exits or stays silent that long."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            return ""
    return proc.stdout.readline().strip()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
