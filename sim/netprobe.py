"""TCP probes for the network lab: `listen` and `ping` start them inside a lab's sites
(sim/netlab.py), where this module runs as a command:

    python -m sim.netprobe serve ADDR PORT
        listen on ADDR:PORT, print `listening` once listening; on each connection send one line with
        the peer's address as this end sees it (`IP:PORT\\n`, what a NAT made of the dialler), then
        echo every byte back until the dialler closes.
    python -m sim.netprobe ping ADDR PORT [--count N] [--bulk-bytes B] [--bind-port P] [--timeout-s S]
        dial a `serve`, read the observed-address line, time N 32-byte echoes (TCP_NODELAY) and then
        B bytes echoed in bulk; print one JSON object (`PingResult` fields) and exit 0, also when the
        dial fails (`error` says why).

This module does not: build or change the lab, or judge a result (the tests and the benchmark do).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sim import netns
from sim.netns import LabError

if TYPE_CHECKING:
    from sim.netlab import Lab, Where

PROBE_BYTES = 32
CHUNK_BYTES = 64 << 10
READY_S = 20.0
"""How long a probe server may take to listen."""
REPO_ROOT = Path(__file__).resolve().parents[1]
"""Where `python -m sim.netprobe` finds this package when run inside a namespace."""


@dataclass
class PingResult:
    """What one `ping` saw.

    Attributes:
        error: "" when the dial and every echo worked; else the failure ("timed out", ...).
        observed: the dialler's address as the server saw it, "IP:PORT".
        local: the dialler's own socket address, "IP:PORT".
        connect_ms: the TCP handshake, ms.
        rtt_ms: one round trip per 32-byte echo, ms, in order.
        bulk_bytes: bytes sent and echoed back in the bulk phase.
        bulk_s: from the bulk phase's first byte sent to its last byte back, s.
    """

    error: str = ""
    observed: str = ""
    local: str = ""
    connect_ms: float = 0.0
    rtt_ms: list[float] = field(default_factory=list)
    bulk_bytes: int = 0
    bulk_s: float = 0.0


def listen(lab: Lab, where: Where, port: int) -> subprocess.Popen:
    """Start a probe server in `where` on its own address (a router's: its WAN address) and `port`,
    and return once it listens; the lab's teardown ends it.

    Raises:
        LabError: it exited or did not listen within READY_S.
    """
    address = getattr(where, "address", None) or where.wan_address
    proc = lab.spawn(where, [sys.executable, "-m", "sim.netprobe", "serve", address, str(port)],
                     cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if netns.first_line(proc, READY_S) != "listening":
        netns.stop(proc)
        raise LabError(f"probe server on {address}:{port} did not start: {proc.stderr.read().strip()}")
    return proc


def ping(lab: Lab, where: Where, addr: str, port: int, *, count: int = 10, bulk_bytes: int = 0,
         bind_port: int = 0, timeout_s: float = 5.0) -> PingResult:
    """Dial a probe server from `where` and measure; a dial that fails is returned with `error` set,
    not raised.

    Args:
        addr, port: the server as dialled (a router's WAN address for a port forward).
        count: 32-byte echoes to time, one round trip each.
        bulk_bytes: then send this many bytes and time their echo (0: none).
        bind_port: dial from this local port (0: any), to see what a NAT makes of it.
        timeout_s: the dial's and each read's limit.
    Raises:
        LabError: the probe itself could not run.
    """
    argv = [sys.executable, "-m", "sim.netprobe", "ping", addr, str(port), "--count", str(count),
            "--bulk-bytes", str(bulk_bytes), "--bind-port", str(bind_port), "--timeout-s", str(timeout_s)]
    done = lab.run(where, argv, cwd=REPO_ROOT, timeout_s=timeout_s * (count + 3) + 60)
    return PingResult(**json.loads(done.stdout))


def serve_forever(addr: str, port: int) -> None:
    """Accept connections forever, one thread each (see the module docstring)."""
    listener = socket.create_server((addr, port), reuse_port=False)
    print("listening", flush=True)
    while True:
        conn, peer = listener.accept()
        threading.Thread(target=_echo, args=(conn, peer), daemon=True).start()


def _echo(conn: socket.socket, peer: tuple[str, int]) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        try:
            conn.sendall(f"{peer[0]}:{peer[1]}\n".encode())
            while data := conn.recv(CHUNK_BYTES):
                conn.sendall(data)
        except OSError:
            pass  # the dialler went away: nothing to answer


def measure(addr: str, port: int, count: int, bulk_bytes: int, bind_port: int, timeout_s: float) -> PingResult:
    """Dial a `serve` and measure (see `PingResult`); a failure is returned in `error`, not raised."""
    result = PingResult()
    try:
        t0 = time.perf_counter()
        conn = socket.create_connection(
            (addr, port), timeout=timeout_s, source_address=("", bind_port) if bind_port else None
        )
        result.connect_ms = (time.perf_counter() - t0) * 1000
    except OSError as e:
        result.error = str(e) or type(e).__name__
        return result
    with conn:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            result.local = "%s:%d" % conn.getsockname()
            result.observed = _read_line(conn)
            for _ in range(count):
                t = time.perf_counter()
                conn.sendall(b"x" * PROBE_BYTES)
                _read_exactly(conn, PROBE_BYTES)
                result.rtt_ms.append((time.perf_counter() - t) * 1000)
            if bulk_bytes:
                t = time.perf_counter()
                sender = threading.Thread(target=conn.sendall, args=(b"y" * bulk_bytes,), daemon=True)
                sender.start()
                _read_exactly(conn, bulk_bytes)
                result.bulk_s = time.perf_counter() - t
                result.bulk_bytes = bulk_bytes
        except OSError as e:
            result.error = str(e) or type(e).__name__
    return result


def _read_line(conn: socket.socket) -> str:
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            raise ConnectionError("closed before the observed-address line")
        line += chunk
    return line.decode().strip()


def _read_exactly(conn: socket.socket, n: int) -> None:
    got = 0
    while got < n:
        chunk = conn.recv(min(CHUNK_BYTES, n - got))
        if not chunk:
            raise ConnectionError(f"closed after {got} of {n} echoed bytes")
        got += len(chunk)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.netprobe", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("addr")
    s.add_argument("port", type=int)
    p = sub.add_parser("ping")
    p.add_argument("addr")
    p.add_argument("port", type=int)
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--bulk-bytes", type=int, default=0)
    p.add_argument("--bind-port", type=int, default=0, help="dial from this local port (0: any)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="give up on the dial and each read")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        serve_forever(args.addr, args.port)
        return 0
    result = measure(args.addr, args.port, args.count, args.bulk_bytes, args.bind_port, args.timeout_s)
    json.dump(asdict(result), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
