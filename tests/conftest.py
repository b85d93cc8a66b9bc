"""Shared fixtures (the real models, fetched once into the user's model cache and verified; the span
and oracle caches every process of the run shares) and the hook that marks each test with its cost (tests/helpers/markers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from swarm.models import resolve_model
from tests.helpers.markers import cost_markers


@pytest.fixture(scope="session", autouse=True)
def shared_caches(tmp_path_factory):
    """Caches shared by every process of the run: one span cache for every peer process
    (`SWARM_SPAN_CACHE`: each (model, span) is sliced once, as peers on one machine may share it) and
    the oracles' answers (`SWARM_ORACLE_CACHE`, tests/helpers/oracle.py: each computed once by the
    pytest-xdist workers together)."""
    base = tmp_path_factory.getbasetemp()
    run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # a worker's is popen-gwN in it
    mp = pytest.MonkeyPatch()
    for var, name in (("SWARM_SPAN_CACHE", "shared_spans"), ("SWARM_ORACLE_CACHE", "oracles")):
        (run / name).mkdir(exist_ok=True)
        mp.setenv(var, str(run / name))
    yield
    mp.undo()


def _model(name: str) -> Path:
    return resolve_model(name, fetch=True)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama arch, 30 layers, hidden 576, tied head)."""
    return _model("smollm2-135m")


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2 arch, 24 layers, hidden 896)."""
    return _model("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma-3-270M Q4_K_M (gemma3 arch, 18 layers, hidden 640, sliding-window attention)."""
    return _model("gemma3-270m")


def pytest_collection_modifyitems(config, items):
    """Mark every test with what it costs (tests/helpers/markers.py), for `-m` and scripts/test.sh."""
    tests_dir = Path(__file__).parent
    for item in items:
        directory = item.path.relative_to(tests_dir).parts[0] if item.path.is_relative_to(tests_dir) else ""
        params = item.callspec.params.values() if hasattr(item, "callspec") else ()
        marked = {m.name for m in item.iter_markers()}
        for name in cost_markers(directory, item.fixturenames, params, marked) - marked:
            item.add_marker(name)
