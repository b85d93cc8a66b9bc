"""Test hook: a wrong wall clock for one `swarm` process, to test a peer whose clock is off.

Active only when the environment names SWARM_TEST_CLOCK_SKEW_FILE (tests set it; no flag of the CLI
does): that file holds a number of seconds, re-read at most every 0.2 s, which is added to
`time.time()` in this process and in the DHT process it forks; monotonic clocks are untouched, as a
wrong wall clock leaves them. It must be installed before hivemind is imported, which binds
`time.time` as its DHT clock at import. libfaketime would do this from outside the process, but on
this machine (Debian's 0.9.10) its clock_nanosleep shim makes every `time.sleep` fail with EINVAL under
an offset. The libp2p daemon (Go) keeps the true time; swarm's and hivemind's records are made in
Python.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

ENV = "SWARM_TEST_CLOCK_SKEW_FILE"
_REREAD_S = 0.2


def install_from_env() -> None:
    """Skew `time.time` by the seconds in the file $SWARM_TEST_CLOCK_SKEW_FILE names (no-op without)."""
    path = os.environ.get(ENV)
    if not path:
        return
    true_time = time.time
    skew = {"s": 0.0, "read_at": -math.inf}

    def skewed_time() -> float:
        now = time.monotonic()
        if now - skew["read_at"] > _REREAD_S:
            try:
                skew["s"] = float(Path(path).read_text().strip() or 0.0)
            except (OSError, ValueError):
                pass  # a test rewriting the file: keep the last skew
            skew["read_at"] = now
        return true_time() + skew["s"]

    time.time = skewed_time
