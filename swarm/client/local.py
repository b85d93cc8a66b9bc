"""Whole-model generation in this process on llama.cpp: the `local=True` backend.

The model runs through llama-cpp-python's bindings to the same llama.cpp that the peers use;
sampling is `swarm.sampling`, the same code the last span of a swarm route runs, so a local and a
swarm generation with the same seed draw the same tokens. One session at a time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from swarm.client.generate import StepResult
from swarm.client.telemetry import GenerationTelemetry
from swarm.client.tokenizer import context_length, load_llama
from swarm.errors import ExecutorError
from swarm.limits import MAX_CONTEXT_TOKENS
from swarm.sampling import SamplingParams, sample


def default_threads() -> int:
    """Threads for llama.cpp compute: every core this process may use."""
    return len(os.sched_getaffinity(0))


def open_local_model(
    path: Path, n_ctx: int | None = None, n_threads: int | None = None, n_batch: int = 512
) -> llama_cpp.Llama:
    """Load the whole model for local generation.

    Args:
        n_ctx: KV-cache tokens; default the model's training context, capped at 131,072.
        n_threads: compute threads; default all usable cores.
    Raises:
        ModelError: llama.cpp refused the file.
    """
    if n_ctx is None:
        probe = load_llama(path, vocab_only=True)
        n_ctx = min(context_length(probe), MAX_CONTEXT_TOKENS)
        del probe
    threads = n_threads or default_threads()
    # Flash attention as on the peers' executors, so local and swarm generations agree bit for bit.
    return load_llama(
        path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_batch, flash_attn=True
    )


class LocalEngine:
    """`swarm.client.generate.Engine` over one whole-model llama.cpp context (sequence 0)."""

    def __init__(self, llama: llama_cpp.Llama):
        self._llama = llama
        self._ctx = llama.ctx
        self._n_batch = llama.n_batch
        self._n_vocab = llama.n_vocab()
        self.context_limit = min(llama.n_ctx(), MAX_CONTEXT_TOKENS)
        self._pos = 0
        self._sampling = SamplingParams()

    def begin(self, n_tokens: int, sampling: SamplingParams, telemetry: GenerationTelemetry) -> None:
        """Clear the KV cache for a new session."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)
        self._pos = 0
        self._sampling = sampling

    def prefill(self, tokens: Sequence[int]) -> StepResult:
        """Run the prompt in chunks of n_batch tokens; sample the next token."""
        for i in range(0, len(tokens), self._n_batch):
            self._decode(tokens[i : i + self._n_batch])
        return self._sample()

    def decode(self, token: int) -> StepResult:
        """Append one token and sample the next."""
        self._decode([token])
        return self._sample()

    def end(self) -> None:
        """Nothing to release: the next `begin` clears the cache."""

    def _decode(self, tokens: Sequence[int]) -> None:
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        # llama_batch_get_one: positions continue the sequence, logits for the last token only.
        rc = llama_cpp.llama_decode(self._ctx, llama_cpp.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise ExecutorError(f"llama_decode failed with status {rc} at position {self._pos}")
        self._pos += len(tokens)

    def _sample(self) -> StepResult:
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))
        r = sample(logits, self._sampling, position=self._pos)
        return StepResult(token=r.token, logprob=r.logprob, top=r.top)
