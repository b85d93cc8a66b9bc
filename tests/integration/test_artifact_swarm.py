"""Model bytes through the swarm: a fresh peer and a client that know only the model_id.

One publisher seeds the whole SmolLM2 file; peers for 0:10 and 20:30 serve from local files (and
seed them); a fresh peer for 10:20 fetches only its span's bytes by torrent, found through the DHT.
The oracle is llama-cpp-python's whole-model greedy output.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet

from swarm import Client
from swarm.artifacts.distribute import span_ranges
from swarm.manifest import build_manifest

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def torrent_swarm(smollm2_path, tmp_path_factory):
    ps = PeerSet(tmp_path_factory.mktemp("torrent_swarm"))
    pub = ps.start("publisher", "publish", str(smollm2_path), "--new-swarm", ready_marker="publishing")
    join = ("--initial-peers", pub.maddrs[0], "--threads", "1", "--cache-tokens", "2048")
    ps.start("a", "serve", "--model", str(smollm2_path), "--layers", "0:10", *join)
    ps.start("b", "serve", "--model", str(smollm2_path), "--layers", "20:30", *join)
    model_id = build_manifest(smollm2_path).model_id
    fresh = ps.start("fresh", "serve", "--model", model_id, "--layers", "10:20", *join)
    yield ps, model_id, fresh
    ps.stop_all()


def test_fresh_peer_fetches_only_its_span_and_serves_it(torrent_swarm, smollm2_path):
    ps, model_id, fresh = torrent_swarm
    manifest = build_manifest(smollm2_path)
    needed = sum(n for _, n in span_ranges(manifest, 10, 20))
    log = fresh.stderr_text()
    fetched = int(re.search(r"fetched (\d+) bytes of", log).group(1))
    ratio = fetched / needed
    print(f"span 10:20 needs {needed} bytes (header + tensors), downloaded {fetched}: ratio {ratio:.3f}")
    assert needed < manifest.file_size / 2
    assert 1.0 <= ratio <= 1.1
    assert "from 3 peer(s)" in log or "from 2 peer(s)" in log  # the publisher and the seeding span peers

    expected = oracle(smollm2_path, PROMPT, 24, n_ctx=512)
    with Client(model_id, initial_peers=ps.started[0].maddrs) as client:  # knows only the model_id
        got = client.generate(PROMPT, max_new_tokens=24)
    assert got.text == expected
    assert [(h.start, h.end, h.peer_id) for h in got.telemetry.route][1] == (10, 20, fresh.peer_id)


def test_unknown_model_id_is_a_clear_error(torrent_swarm):
    ps, _, _ = torrent_swarm
    bogus = "ab" * 32
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm.cli",
            "chat",
            "--model",
            bogus,
            "--prompt",
            "hi",
            "--initial-peers",
            ps.started[0].maddrs[0],
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"unknown model {bogus[:16]}" in proc.stderr
