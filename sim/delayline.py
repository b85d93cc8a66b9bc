"""The lab's delay line: Ethernet frames forwarded between pairs of interfaces, each frame held for a
fixed time, in a userspace process (this kernel has no `netem` and no other delaying qdisc).

    python -m sim.delayline --pair IF_A,IF_B,MS_A_TO_B,MS_B_TO_A [--pair ...] --ready-file PATH

Frames read on IF_A (an AF_PACKET socket, every protocol) are written to IF_B no earlier than
MS_A_TO_B milliseconds after they were read, and back the other way after MS_B_TO_A; each direction
keeps its order (one FIFO, one delay). A frame is never released early: the delay is a floor, and
`select` oversleeps by ~0.1-0.3 ms per wake on this machine kind, so 20 ms set measures 20.3-21 ms
of round trip through four held crossings. Run it in the network namespace that holds the
interfaces (sim/netlab.py does). Offloads must be off on every interface the frames cross
(`ethtool -K IF tx off tso off gso off gro off`): a TSO/GSO super-frame larger than the MTU cannot
be re-sent as one frame, and a frame with a partial checksum would arrive corrupt.

Each direction queues at most `QUEUE_BYTES` (16 MiB) and drops what comes past that (a router's
tail drop, counted). The ready file is written once every socket is bound: from then on frames are
held, not lost. SIGTERM or SIGINT exits and writes the counters (one line per direction) to
`--stats-file` when given.

`start` runs it in a namespace from outside and returns once it is ready.

This module does not: change interfaces, bridges or delays of a running lab (sim/netlab.py rewires
the lab and restarts this process), limit rates (the lab uses `tbf`), or drop or reorder on purpose.
"""

from __future__ import annotations

import argparse
import collections
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sim import netns
from sim.netns import LabError

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
"""Linux >= 4.20: a packet socket does not read back the frames it sends itself."""
MAX_FRAME_BYTES = 1514
"""The largest frame forwarded (MTU 1500 + Ethernet header); a larger one means offloads are on."""
QUEUE_BYTES = 16 << 20
"""Frame bytes one direction may hold before it drops (tail drop)."""
SOCKET_BUFFER_BYTES = 8 << 20
READY_S = 20.0
"""How long the delay line may take to open its sockets."""
REPO_ROOT = Path(__file__).resolve().parents[1]
"""Where `python -m sim.delayline` finds this package when run inside a namespace."""


def start(ns: str, pairs: list[Pair], workdir: Path) -> subprocess.Popen:
    """Run the delay line for `pairs` inside namespace `ns` (in a session of its own; end it with
    `netns.stop`) and return once every socket is bound.

    Args:
        workdir: an existing directory for its ready file and its log.
    Raises:
        LabError: it exited or was not ready within READY_S (the message holds its log).
    """
    ready = workdir / f"delayline-{time.monotonic_ns()}.ready"
    log_path = workdir / "delayline.log"
    argv = [sys.executable, "-m", "sim.delayline", "--ready-file", str(ready)]
    for p in pairs:
        argv += ["--pair", p.spec()]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*netns.exec_prefix(ns), *argv], cwd=REPO_ROOT, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_S
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            netns.stop(proc)
            raise LabError(f"the delay line did not start: {log_path.read_text().strip()[-2000:]}")
        time.sleep(0.02)  # the poll interval of this wait for the ready file
    return proc


@dataclass(frozen=True)
class Pair:
    """Two interfaces joined by the delay line, with the one-way hold of each direction.

    Attributes:
        a, b: interface names in this namespace.
        a_to_b_ms, b_to_a_ms: how long a frame is held in each direction, ms (>= 0).
    """

    a: str
    b: str
    a_to_b_ms: float
    b_to_a_ms: float

    @classmethod
    def parse(cls, text: str) -> Pair:
        """`IF_A,IF_B,MS_A_TO_B,MS_B_TO_A` as given to `--pair`.

        Raises:
            ValueError: not four fields, a delay that is not a number, or a negative delay.
        """
        parts = text.split(",")
        if len(parts) != 4:
            raise ValueError(f"--pair wants IF_A,IF_B,MS_A_TO_B,MS_B_TO_A, got {text!r}")
        pair = cls(parts[0], parts[1], float(parts[2]), float(parts[3]))
        if min(pair.a_to_b_ms, pair.b_to_a_ms) < 0:
            raise ValueError(f"negative delay in {text!r}")
        return pair

    def spec(self) -> str:
        """The `--pair` text of this pair (the inverse of `parse`)."""
        return f"{self.a},{self.b},{self.a_to_b_ms:g},{self.b_to_a_ms:g}"


@dataclass(eq=False)
class Direction:
    """One direction of a pair: frames read on `src`, held `hold_s`, written to `dst`."""

    name: str
    src: socket.socket
    dst: socket.socket
    hold_s: float
    queue: collections.deque = field(default_factory=collections.deque)
    """(due time on time.monotonic(), frame) in arrival order."""
    queued_bytes: int = 0
    frames: int = 0
    dropped: int = 0
    too_big: int = 0
    send_errors: int = 0

    def take(self, frame: bytes, now: float) -> None:
        """Queue a frame read now (or count it as dropped or too big)."""
        if len(frame) > MAX_FRAME_BYTES:
            self.too_big += 1
        elif self.queued_bytes + len(frame) > QUEUE_BYTES:
            self.dropped += 1
        else:
            self.frames += 1
            self.queue.append((now + self.hold_s, frame))
            self.queued_bytes += len(frame)

    def release(self, now: float) -> float | None:
        """Send every frame due by `now`; returns when the next one is due (None: queue empty)."""
        while self.queue and self.queue[0][0] <= now:
            frame = self.queue[0][1]
            try:
                self.dst.send(frame)
            except BlockingIOError:
                return now  # the interface's queue is full: try again on the next turn
            except OSError:
                self.send_errors += 1  # e.g. the interface went down: the frame is lost, as on a wire
            self.queue.popleft()
            self.queued_bytes -= len(frame)
        return self.queue[0][0] if self.queue else None

    def counters(self) -> str:
        return (
            f"{self.name} hold_ms={self.hold_s * 1000:g} frames={self.frames} queued={len(self.queue)} "
            f"dropped={self.dropped} too_big={self.too_big} send_errors={self.send_errors}"
        )


def open_interface(name: str) -> socket.socket:
    """A non-blocking packet socket that reads every frame arriving on interface `name` and writes
    frames out of it, without reading back its own."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: receives nothing until bound
    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    s.bind((name, ETH_P_ALL))
    s.setblocking(False)
    return s


def build(pairs: list[Pair]) -> list[Direction]:
    """Open one socket per interface and two directions per pair.

    Raises:
        OSError: an interface does not exist, or no CAP_NET_RAW.
    """
    sockets: dict[str, socket.socket] = {}
    for p in pairs:
        for name in (p.a, p.b):
            if name not in sockets:
                sockets[name] = open_interface(name)
    directions = []
    for p in pairs:
        directions.append(Direction(f"{p.a}->{p.b}", sockets[p.a], sockets[p.b], p.a_to_b_ms / 1000.0))
        directions.append(Direction(f"{p.b}->{p.a}", sockets[p.b], sockets[p.a], p.b_to_a_ms / 1000.0))
    return directions


class Stop(Exception):
    """Raised by the SIGTERM/SIGINT handler: a handler that returns would leave `select` waiting
    (PEP 475 retries it), so stopping has to unwind out of it."""


def forward(directions: list[Direction]) -> None:
    """Forward until `Stop` is raised: release due frames, then wait for new frames or the next due
    time, whichever comes first. `select`, not epoll: epoll's timeout is rounded up to whole ms."""
    by_socket = {d.src: d for d in directions}
    while True:
        now = time.monotonic()
        due = [t for t in (d.release(now) for d in directions) if t is not None]
        timeout = max(0.0, min(due) - now) if due else None
        ready, _, _ = select.select(list(by_socket), [], [], timeout)
        for s in ready:
            d = by_socket[s]
            while True:
                try:
                    frame = s.recv(65536)
                except OSError:  # BlockingIOError included: nothing more to read now
                    break
                d.take(frame, time.monotonic())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.delayline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", action="append", required=True, type=Pair.parse, metavar="A,B,MS_AB,MS_BA")
    ap.add_argument("--ready-file", type=Path, help="written once every socket is bound")
    ap.add_argument("--stats-file", type=Path, help="counters written here on exit")
    args = ap.parse_args(argv)
    directions = build(args.pair)

    def stop(*_):
        raise Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.ready_file:
        args.ready_file.write_text("ready\n")
    try:
        forward(directions)
    except Stop:
        pass
    if args.stats_file:
        args.stats_file.write_text("".join(d.counters() + "\n" for d in directions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
