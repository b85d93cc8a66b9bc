"""`swarm serve`, `swarm dht` and `swarm publish` refuse bad options before they import the peer, the
DHT node or the publisher (swarm/cli/): libp2p, hivemind and the torch hivemind imports cost 2-3 s of
CPU, which a mistyped flag should not. Run in a fresh interpreter, so that no module this test
process imported counts."""

from __future__ import annotations

import subprocess
import sys

import pytest

PEER_MODULES = ("swarm.peer.server", "swarm.dht.node", "swarm.artifacts.publisher", "hivemind", "torch", "llama_cpp")

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
        (("serve", "--layers", "0:10"), "pass either --initial-peers"),
        (("serve", "--new-swarm", "--threads", "0"), "threads must be an integer in [1, 1024]"),
        (("serve", "--new-swarm", "--host", "example.org"), "--host must be an IP address"),
        (("serve", "--new-swarm", "--public-address", "203.0.113.7"), "--public-address needs a fixed --port"),
        (("dht", "--host", "my-laptop.local"), "--host must be an IP address"),
        (("dht", "--port", "70000"), "--port must be an integer in 0..65535"),
        (("publish", "smollm2-135m", "--new-swarm", "--host", "my-laptop.local"), "--host must be an IP address"),
        (("publish", "smollm2-135m"), "pass either --initial-peers"),
    ],
)
def test_bad_options_are_refused_before_the_node_is_imported(args, needle):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(mods=PEER_MODULES), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout.split() == ["-"]  # none of the peer's heavy modules was loaded
