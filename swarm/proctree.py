"""Process trees on Linux: a process's descendants, and child processes that die with their parent.

hivemind runs each DHT node in a forked child process, which spawns the libp2p daemon (p2pd). Both
are stopped by a clean shutdown, but a parent killed with SIGKILL runs no shutdown: the DHT child and
its p2pd would live on as orphans, holding ports and the node's identity online. `die_with_parent`
makes the child follow its parent (Linux `prctl(PR_SET_PDEATHSIG)`, prctl(2)) and take its own
children (p2pd) with it.

This module does not start processes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def descendants(pid: int) -> list[int]:
    """Every live descendant process of `pid` (children first), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def die_with_parent(parent_pid: int) -> None:
    """In a freshly forked child: exit when the process that forked it dies, SIGTERMing the child's
    own descendants first (hivemind's p2pd). Call from the child, with the parent's pid as it was
    before the fork; a parent already gone by then ends the child at once. No-op off Linux.

    The signal comes when the parent *thread* that forked the child ends (prctl(2)): fork from a
    thread that lives as long as the child should.
    """
    if not sys.platform.startswith("linux"):
        return
    signal.signal(signal.SIGTERM, _end_tree)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return  # without the kernel's help the child keeps hivemind's own lifetime
    if os.getppid() != parent_pid:  # the parent died before prctl: no signal will come
        _end_tree(signal.SIGTERM, None)


def _end_tree(signum: int, frame) -> None:
    del frame
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    os._exit(128 + signum)
