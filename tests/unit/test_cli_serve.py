"""`swarm serve` refuses bad options before it imports the peer (swarm/cli/serve.py): libp2p, hivemind
and the torch hivemind imports cost 2-3 s of CPU, which a mistyped flag should not. Run in a fresh
interpreter, so that no module this test process imported counts."""

from __future__ import annotations

import subprocess
import sys

import pytest

PEER_MODULES = ("swarm.peer.server", "hivemind", "torch", "llama_cpp")

PROBE = """
import sys
from swarm.cli import main
status = main(sys.argv[1:])
print(" ".join(m for m in {mods!r} if m in sys.modules) or "-")
sys.exit(status)
"""


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--layers", "0:10"), "pass either --initial-peers"),
        (("--new-swarm", "--threads", "0"), "threads must be an integer in [1, 1024]"),
        (("--new-swarm", "--host", "example.org"), "--host must be an IP address"),
        (("--new-swarm", "--public-address", "203.0.113.7"), "--public-address needs a fixed --port"),
    ],
)
def test_bad_serve_options_are_refused_before_the_peer_is_imported(args, needle):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(mods=PEER_MODULES), "serve", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout.split() == ["-"]  # none of the peer's heavy modules was loaded
