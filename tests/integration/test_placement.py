"""Chain-aware placement, truthful status and rebalancing with real `swarm serve` peers (SmolLM2, 30 layers).

The issue's inputs: 0:12 + 10:30 cover every layer with no route (status must say so and name both
dead ends; the second peer warns at start), and 0:15 followed by four peers that choose their own
12-layer spans (today two of them landed on no complete chain).
"""

from __future__ import annotations

import json
import subprocess
import sys

from swarm import Client

from tests.helpers.oracle import oracle
from tests.helpers.peers import serve_args, wait_for

PROMPT = "The capital of France is"


def status(maddr: str, model) -> tuple[int, dict]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm.cli",
            "status",
            "--model",
            str(model),
            "--json",
            "--initial-peers",
            maddr,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 3), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def auto_args(path, *extra: str) -> tuple[str, ...]:
    """`swarm serve` without --layers: placement chooses."""
    return ("serve", "--model", str(path), "--threads", "1", "--cache-tokens", "1024", *extra)


def test_covered_but_unchainable_spans_are_reported_and_warned(smollm2_path, peers):
    first = peers.start("a", *serve_args(smollm2_path, "0:12", "--new-swarm"))
    second = peers.start("b", *serve_args(smollm2_path, "10:30", "--initial-peers", first.maddrs[0]))
    assert "cannot chain" not in first.stderr_text()  # alone in a new swarm: nothing to chain with yet
    assert (
        "swarm: warning: layers 10:30 cannot chain: 0:12 crosses layer 10 and no announced span ends there"
        in second.stderr_text()
    )
    rc, report = status(first.maddrs[0], smollm2_path)
    assert rc == 3
    assert report["covered"] is True and report["route_exists"] is False
    assert report["best_route"] is None and "no chain of whole spans" in report["no_route"]
    assert sorted((d["start"], d["end"], d["reason"]) for d in report["dead_ends"]) == [
        (0, 12, "no_exit"),
        (10, 30, "unreachable"),
    ]
    human = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm.cli",
            "status",
            "--model",
            str(smollm2_path),
            "--initial-peers",
            first.maddrs[0],
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert human.returncode == 3
    assert "no route: no chain of whole spans joins layer 0 to the last layer" in human.stdout
    assert "dead end: 10:30" in human.stdout and "dead end: 0:12" in human.stdout


def test_peers_choosing_their_spans_after_0_15_all_land_on_the_chain(smollm2_path, peers):
    first = peers.start("f", *serve_args(smollm2_path, "0:15", "--new-swarm"))
    chosen = []
    for i in range(4):
        p = peers.start(
            f"j{i}",
            *auto_args(
                smollm2_path,
                "--max-layers",
                "12",
                "--rebalance-period",
                "0",
                "--initial-peers",
                first.maddrs[0],
            ),
        )
        line = next(x for x in p.stderr_text().splitlines() if x.startswith("serving layers "))
        chosen.append(line.split()[2])
    # 15:27 extends the chain (15:30 does not fit 12 layers) and 27:30 completes it; the others back
    # up whichever span a 12-layer peer can serve has the least measured throughput (0:15 cannot fit;
    # 27:30 carries the output head, so its measured speed decides).
    assert chosen[:2] == ["15:27", "27:30"]
    assert set(chosen[2:]) <= {"15:27", "27:30"}
    rc, report = status(first.maddrs[0], smollm2_path)
    assert rc == 0 and report["route_exists"] is True and report["dead_ends"] == []
    with Client(str(smollm2_path), initial_peers=first.maddrs) as client:
        got = client.generate(PROMPT, max_new_tokens=16)
    assert got.text == oracle(smollm2_path, PROMPT, 16)
    assert [(h.start, h.end) for h in got.telemetry.route] == [(0, 15), (15, 27), (27, 30)]


def test_a_peer_moves_to_the_bottleneck_when_the_swarm_changes(smollm2_path, peers):
    first = peers.start("a", *serve_args(smollm2_path, "0:15", "--new-swarm"))
    mover = peers.start(
        "m",
        *auto_args(
            smollm2_path, "--max-layers", "15", "--rebalance-period", "2", "--initial-peers", first.maddrs[0]
        ),
    )
    assert "serving layers 15:30 " in mover.stderr_text()  # completes the chain
    # 15:30 carries SmolLM2's large output head, so a 0:15 peer runs about twice as fast as a 15:30
    # one: with five peers on 15:30 and one on 0:15, moving one of them to 0:15 raises the routable
    # throughput well past the 20% threshold (staying is bounded by the lone 0:15 peer). The mover
    # prices itself at 0:15 by its 15:30 speed, and each peer measures its speed once, at its start,
    # beside whatever else the machine runs: with only four on 15:30, three of them measuring ~25%
    # slow while the 0:15 peer measured in a quiet moment leaves the remaining 15:30 peers the
    # bottleneck after a move, so the peer rightly stays (the likely cause of one failure in the
    # full suite, where the peer never moved).
    for name in ("c", "d", "e", "f"):
        peers.start(name, *serve_args(smollm2_path, "15:30", "--initial-peers", first.maddrs[0]))
    wait_for(
        mover.stderr_text,
        "the rebalancing peer moved to 0:15",
        120,
        until=lambda text: "moved from layers 15:30 to 0:15" in text,
    )
    _, report = wait_for(
        lambda: status(first.maddrs[0], smollm2_path),
        "the moved peer announced 0:15",
        until=lambda r: [p["start"] for p in r[1]["peers"] if p["peer_id"] == mover.peer_id] == [0],
    )
    assert sorted((p["start"], p["end"]) for p in report["peers"]) == [(0, 15)] * 2 + [(15, 30)] * 4
    with Client(str(smollm2_path), initial_peers=first.maddrs) as client:
        for _ in range(2):  # both 0:15 peers serve exactly
            got = client.generate(PROMPT, max_new_tokens=16)
            assert got.text == oracle(smollm2_path, PROMPT, 16)
