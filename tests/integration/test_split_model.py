"""A split GGUF through the swarm: SmolLM2 cut into 3 shards by the `gguf` package serves, seeds and
answers exactly like the whole file.

A publisher seeds the split model (given its first shard) and a peer serves 0:15 from it; a fresh
peer that knows only the model_id fetches span 15:30 (only its bytes) from them; a client that
knows only the model_id, and `swarm chat` given the first shard, route through both. A second
swarm of one peer serves the split model without `--layers`. The oracle is llama-cpp-python's
whole-model greedy output on the unsplit file.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet
from tests.helpers.synthetic import write_split

from swarm import Client
from swarm.artifacts.distribute import span_ranges
from swarm.manifest import build_manifest

PROMPT = "The capital of France is"
_JOIN = ("--threads", "1", "--cache-tokens", "1024")


@pytest.fixture(scope="module")
def smol_shards(smollm2_path, tmp_path_factory):
    return write_split(smollm2_path, tmp_path_factory.mktemp("smol_split"), 3)


@pytest.fixture(scope="module")
def split_swarm(smol_shards, smollm2_path, tmp_path_factory):
    ps = PeerSet(tmp_path_factory.mktemp("split_swarm"))
    pub = ps.start("publisher", "publish", str(smol_shards[0]), "--new-swarm", ready_marker="publishing")
    join = ("--initial-peers", pub.maddrs[0], *_JOIN)
    head = ps.start("head", "serve", "--model", str(smol_shards[0]), "--layers", "0:15", *join)
    # the shards merge into the whole file's bytes, so the split model has the whole file's model_id
    model_id = build_manifest(smollm2_path).model_id
    fresh = ps.start("fresh", "serve", "--model", model_id, "--layers", "15:30", *join)
    yield ps, head, fresh, model_id
    ps.stop_all()


def test_split_model_is_the_whole_file_to_the_swarm(split_swarm, smollm2_path):
    ps, head, fresh, model_id = split_swarm
    needed = sum(n for _, n in span_ranges(build_manifest(smollm2_path), 15, 30))
    fetched = int(re.search(r"fetched (\d+) bytes of", fresh.stderr_text()).group(1))
    assert 1.0 <= fetched / needed <= 1.1
    expected = oracle(smollm2_path, PROMPT, 24, n_ctx=512)
    with Client(model_id, initial_peers=ps.started[0].maddrs) as client:  # knows only the model_id
        got = client.generate(PROMPT, max_new_tokens=24)
    assert got.text == expected
    assert [(h.start, h.end, h.peer_id) for h in got.telemetry.route] == [
        (0, 15, head.peer_id), (15, 30, fresh.peer_id)
    ]


def test_swarm_chat_given_the_first_shard_answers_like_the_whole_file(split_swarm, smol_shards, smollm2_path):
    ps, _, _, _ = split_swarm
    proc = subprocess.run(
        [sys.executable, "-m", "swarm.cli", "chat", "--model", str(smol_shards[0]), "--raw", "--prompt", PROMPT,
         "--max-new-tokens", "24", "--initial-peers", ps.started[0].maddrs[0]],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == oracle(smollm2_path, PROMPT, 24, n_ctx=512) + "\n"


def test_split_model_served_without_layers(smol_shards, smollm2_path, tmp_path):
    ps = PeerSet(tmp_path)
    try:
        solo = ps.start("solo", "serve", "--model", str(smol_shards[0]), "--new-swarm", *_JOIN)
        with Client(str(smol_shards[0]), initial_peers=solo.maddrs) as client:
            got = client.generate(PROMPT, max_new_tokens=24)
    finally:
        ps.stop_all()
    assert got.text == oracle(smollm2_path, PROMPT, 24, n_ctx=512)
    assert [(h.start, h.end) for h in got.telemetry.route] == [(0, 30)]
