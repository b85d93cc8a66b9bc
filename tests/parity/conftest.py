"""Fixtures for parity tests: the C library, a shared span cache, and one whole-model oracle per model.

The oracle (`tests.helpers.oracle.logits_oracle`) is llama.cpp's ordinary whole-model path
(llama-cpp-python `Llama`, token input, default settings except flash attention on, as the span
executors use it; 2 threads): logits of every prompt token, then 32 greedy decode steps.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from swarm.ggml_bridge import _lib
from tests.helpers.oracle import logits_oracle

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def span_library() -> Path:
    """libswarm_span.so (and the test-only MTP oracle library), rebuilt when missing or older than
    their C sources."""
    sources = [ROOT / "csrc" / name for name in ("swarm_span.c", "swarm_span.h", "mtp_oracle.c")]
    lib = _lib.LIB_PATH
    newest = max(src.stat().st_mtime for src in sources)
    built = [lib, ROOT / "tests" / "helpers" / "libswarm_mtp_oracle.so"]
    if any(not b.exists() or b.stat().st_mtime < newest for b in built):
        subprocess.run(["bash", str(ROOT / "scripts" / "build_csrc.sh"), sys.executable], check=True)
    return lib


@pytest.fixture(scope="session")
def span_cache(tmp_path_factory) -> Path:
    """One span-file cache for the whole session, so each (model, start, end) is sliced once."""
    return tmp_path_factory.mktemp("spans")


@pytest.fixture(scope="session")
def oracle_for():
    """Function (model_path, text=PROMPT) -> Oracle, computed once per model and text per session."""
    return logits_oracle
