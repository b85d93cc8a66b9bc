"""Shared fixtures (the real models, fetched once into the user's model cache and verified; one span
cache for every peer process) and the hook that marks each test with its cost (tests/helpers/markers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.models import resolve_model
from tests.helpers.markers import cost_markers


@pytest.fixture(scope="session", autouse=True)
def shared_span_cache(tmp_path_factory):
    """Every peer process of the session slices each (model, span) once: they share one span cache
    (`SWARM_SPAN_CACHE`), as peers on one machine may."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SWARM_SPAN_CACHE", str(tmp_path_factory.mktemp("shared_spans")))
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
