"""What a test costs, as pytest markers: the rule that gives every collected test at least one.

Markers (declared in pyproject.toml):
- `quick`: no model and no peers; the unit and simulator tests (seconds for all of them).
- `model`: loads a real or synthetic GGUF model in this process (tests/model, tests/parity, and any
  test that asks for a real model's fixture, e.g. for its llama.cpp oracle).
- `peers`: starts peers on 127.0.0.1: `swarm` processes or in-process DHT, libp2p and BitTorrent
  nodes (tests/integration); or builds the network lab of namespaces and runs processes and peers
  in it (tests/lab, which also carry `lab`, and skip where the lab cannot run: sim/netlab.py).
- `slow`: needs a larger model (Qwen 0.5B, Gemma 270M). Tests that load one without asking for
  its fixture or naming it in a parameter carry `@pytest.mark.slow` themselves.

`quick` is given only to tests that get none of the others, so `-m quick`, `-m "not peers"` and no
`-m` are the three tiers of scripts/test.sh. This module decides; tests/conftest.py applies it.
"""

from __future__ import annotations

from collections.abc import Iterable

COSTS = ("model", "peers", "slow")
BY_DIRECTORY = {"model": "model", "parity": "model", "integration": "peers", "lab": "peers"}
MODEL_FIXTURES = frozenset({"smollm2_path", "qwen_path", "gemma_path"})
LARGE_MODELS = frozenset({"qwen_path", "gemma_path", "qwen2.5-coder-0.5b", "gemma3-270m"})


def cost_markers(
    directory: str, fixtures: Iterable[str], params: Iterable[object], marked: Iterable[str]
) -> set[str]:
    """The cost markers a test gets.

    Args:
        directory: the test file's directory under tests/ ("unit", "parity", ...).
        fixtures: the names of every fixture the test uses, directly or through other fixtures.
        params: the test's parameter values (a model's name or fixture name among them marks it).
        marked: the markers it already carries (its own, its class's and its module's).
    Returns:
        the markers it gets in all: `marked`'s costs plus those found here, or {"quick"} when none.
    """
    fixtures = set(fixtures)
    names = {p for p in params if isinstance(p, str)}
    costs = {m for m in marked if m in COSTS}
    if directory in BY_DIRECTORY:
        costs.add(BY_DIRECTORY[directory])
    if fixtures & MODEL_FIXTURES or names & LARGE_MODELS:
        costs.add("model")
    if (fixtures | names) & LARGE_MODELS:
        costs.add("slow")
    return costs or {"quick"}
