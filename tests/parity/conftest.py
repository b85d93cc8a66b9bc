"""Fixtures for parity tests: the C library, a shared span cache, and one whole-model oracle per model.

The oracle is llama.cpp's ordinary whole-model path (llama-cpp-python `Llama`, token input,
default settings except flash attention on, as the span executors use it; 2 threads): logits
of every prompt token, then 32 greedy decode steps.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from swarm.ggml_bridge import _lib

ROOT = Path(__file__).resolve().parents[2]
N_THREADS = 2
N_DECODE = 32
PROMPT = (
    "def fibonacci(n):\n"
    '    """Return the n-th Fibonacci number, computed iteratively."""\n'
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n\n"
    "class Stack:\n"
    '    """A last-in, first-out container backed by a Python list."""\n'
    "    def __init__(self):\n"
)


@pytest.fixture(scope="session", autouse=True)
def span_library() -> Path:
    """libswarm_span.so, rebuilt when missing or older than its C source."""
    src = ROOT / "csrc" / "swarm_span.c"
    hdr = ROOT / "csrc" / "swarm_span.h"
    lib = _lib.LIB_PATH
    newest = max(src.stat().st_mtime, hdr.stat().st_mtime)
    if not lib.exists() or lib.stat().st_mtime < newest:
        subprocess.run(["bash", str(ROOT / "scripts" / "build_csrc.sh"), sys.executable], check=True)
    return lib


@pytest.fixture(scope="session")
def span_cache(tmp_path_factory) -> Path:
    """One span-file cache for the whole session, so each (model, start, end) is sliced once."""
    return tmp_path_factory.mktemp("spans")


@dataclass(frozen=True)
class Oracle:
    """Whole-model reference run.

    Attributes:
        prompt: token ids of the prompt (with BOS where the model adds one).
        prefill_logits: [len(prompt), n_vocab] float32, logits of every prompt token.
        tokens: the N_DECODE greedy tokens that follow the prompt.
        step_logits: [N_DECODE, n_vocab] float32; row i = logits after feeding tokens[i].
    """

    prompt: list[int]
    prefill_logits: np.ndarray
    tokens: list[int]
    step_logits: np.ndarray


def run_oracle(model_path: Path, text: str = PROMPT) -> Oracle:
    """Prompt + greedy decode on llama.cpp's whole model, token input."""
    import llama_cpp

    llm = llama_cpp.Llama(str(model_path), n_ctx=256, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                          logits_all=True, flash_attn=True, verbose=False)
    try:
        prompt = llm.tokenize(text.encode(), add_bos=True)
        assert len(prompt) >= 64, len(prompt)
        llm.eval(prompt)
        prefill = np.array(llm.scores[: len(prompt)], dtype=np.float32)
        tokens, steps = [], []
        nxt = int(np.argmax(prefill[-1]))
        for _ in range(N_DECODE):
            tokens.append(nxt)
            llm.eval([nxt])
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            steps.append(row)
            nxt = int(np.argmax(row))
        return Oracle(prompt=list(prompt), prefill_logits=prefill, tokens=tokens, step_logits=np.stack(steps))
    finally:
        llm.close()


_ORACLES: dict[Path, Oracle] = {}


@pytest.fixture(scope="session")
def oracle_for():
    """Function model_path -> Oracle, computed once per model per session."""

    def get(model_path: Path, text: str = PROMPT) -> Oracle:
        if model_path not in _ORACLES:
            _ORACLES[model_path] = run_oracle(model_path, text)
        return _ORACLES[model_path]

    return get
