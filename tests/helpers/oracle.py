"""The oracles: llama.cpp's ordinary whole-model path (llama-cpp-python `Llama`), the reference every
swarm, span chain and local backend output is compared with.

Every oracle runs under the numeric contract (swarm/numeric.py): flash attention, one sequence, the
prompt in ubatches of `UBATCH_TOKENS` rows from position 0 (llama.cpp n_ubatch), each generated token
decoded alone on 1 thread (llama.cpp n_threads = 1; the prompt's ubatches run on n_threads_batch).
Three kinds, each computed once per session for the same inputs, each loading a model once (the text
and token oracles once per run: the pytest-xdist workers share them through `$SWARM_ORACLE_CACHE`):
- `oracle(path, prompt, n)`: the greedy completion text (`create_completion`, temperature 0).
- `logits_oracle(path)`: logits of every prompt token, then N_DECODE greedy steps (the parity tests').
- `contract_tokens(path, prompt_ids, n, temperature, seed)`: the token ids a generation gives, greedy
  or sampled with `swarm.sampling` (seeded per position, as every backend samples).

A cached `Llama` is `reset()` before every completion, so no run reuses another's KV cache: each
answer is the one a freshly loaded model gives. This module does not start peers or build spans.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from swarm.numeric import UBATCH_TOKENS
from swarm.sampling import SamplingParams, sample

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


def _run_cache(fn):
    """`functools.cache`, shared with the run's other processes (pytest-xdist workers) through files in
    `$SWARM_ORACLE_CACHE` when it is set (tests/conftest.py): the first process to ask computes the
    answer holding a lock on its entry, the others wait for it and read it. The key is the function,
    its JSON arguments (the model's path first) and the model file's size and mtime; the answer is
    JSON (a text, or token ids given back as a tuple)."""

    @functools.cache
    def cached(*args):
        root = os.environ.get("SWARM_ORACLE_CACHE")
        if not root:
            return fn(*args)
        st = os.stat(args[0])
        key = hashlib.sha256(json.dumps([fn.__name__, st.st_size, st.st_mtime_ns, *args]).encode()).hexdigest()
        entry = Path(root) / f"{key}.json"
        with open(entry.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if entry.exists():
                value = json.loads(entry.read_text())
            else:
                value = fn(*args)
                part = entry.with_suffix(".part")
                part.write_text(json.dumps(value))
                os.replace(part, entry)
        return tuple(value) if isinstance(value, list) else value

    return cached


@functools.cache
def _llama(path: str, n_ctx: int, n_threads: int) -> llama_cpp.Llama:
    """One loaded model per (file, context, prompt threads) for the session; held until the process
    ends. One-token ubatches run on 1 thread (n_threads), longer ones on `n_threads` (n_threads_batch)."""
    return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=1, n_threads_batch=n_threads,
                           n_ubatch=UBATCH_TOKENS, flash_attn=True, verbose=False)


@_run_cache
def _completion(path: str, prompt: str, n: int, n_ctx: int, n_threads: int) -> str:
    llm = _llama(path, n_ctx, n_threads)
    llm.reset()  # no prefix reuse: the prompt is evaluated from position 0, as by a fresh model
    return llm.create_completion(prompt, max_tokens=n, temperature=0.0)["choices"][0]["text"]


def oracle(path: Path | str, prompt: str, n: int, *, n_ctx: int = 1024, n_threads: int = N_THREADS) -> str:
    """llama.cpp's greedy completion of `prompt`: `n` new tokens at most, as text.

    Args:
        path: the whole model's GGUF file.
        prompt: the text to complete (tokenized by llama.cpp, with BOS where the model adds one).
        n: max new tokens.
        n_ctx, n_threads: the `Llama` settings; n_threads serves the prompt's ubatches, each new token
            runs on 1 thread (flash attention is always on, as in the span executors).
    Returns:
        the completion text; the same call later in the session returns the cached text.
    """
    return _completion(str(path), prompt, n, n_ctx, n_threads)


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
    """Prompt + greedy decode on llama.cpp's whole model, token input (prompt on N_THREADS threads,
    decode steps on 1, flash attention, otherwise default settings), on a model loaded for this run
    only: no cache (see `logits_oracle`).

    Raises:
        AssertionError: the prompt is shorter than 64 tokens (the parity tests cut prefills there).
    """
    llm = llama_cpp.Llama(str(model_path), n_ctx=256, n_threads=1, n_threads_batch=N_THREADS,
                          n_ubatch=UBATCH_TOKENS, logits_all=True, flash_attn=True, verbose=False)
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


@functools.cache
def _logits_oracle(path: str, text: str) -> Oracle:
    return run_oracle(Path(path), text)


def logits_oracle(model_path: Path | str, text: str = PROMPT) -> Oracle:
    """`run_oracle`, computed once per (model, text) per session."""
    return _logits_oracle(str(model_path), text)


@_run_cache
def _contract_tokens(path: str, prompt: tuple[int, ...], n: int, temperature: float, seed: int) -> tuple[int, ...]:
    llm = _llama(path, 2048, N_THREADS)
    llm.reset()
    params = SamplingParams(temperature=temperature, seed=seed)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    llm.eval(list(prompt))
    out: list[int] = []
    while len(out) < n:
        # the last evaluated row's logits (the `Llama` keeps `scores` only with logits_all)
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()
        token = sample(logits, params, position=llm.n_tokens).token
        out.append(token)
        if llama_cpp.llama_vocab_is_eog(vocab, token) or len(out) == n:
            break
        llm.eval([token])
    return tuple(out)


def contract_tokens(
    model_path: Path | str, prompt: list[int], n: int, temperature: float = 0.0, seed: int = 0
) -> list[int]:
    """The token ids llama.cpp's whole model generates after `prompt` under the numeric contract.

    Args:
        model_path: the whole model's GGUF file.
        prompt: prompt token ids (BOS included where the model wants it), at most 2,048 - n.
        n: most tokens to generate; fewer when an end-of-generation token comes (it is included).
        temperature, seed: `swarm.sampling` parameters (0: greedy); the draw for the token at
            position p is seeded by (seed, p), as every backend draws.
    Returns:
        the generated ids; the same call later in the session returns the cached list.
    """
    return list(_contract_tokens(str(model_path), tuple(prompt), n, float(temperature), seed))
