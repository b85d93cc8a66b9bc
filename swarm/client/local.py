"""Whole-model generation in this process on llama.cpp: the `local=True` backend.

The model runs through llama-cpp-python's bindings to the same llama.cpp that the peers use;
sampling is `swarm.sampling`, the same code the last span of a swarm route runs, so a local and a
swarm generation with the same seed draw the same tokens.

Numbers follow the numeric contract (swarm/numeric.py): a prompt is computed in ubatches of
`UBATCH_TOKENS` rows from position 0 (llama.cpp n_ubatch; batches of `PREFILL_BATCH_TOKENS`, a
multiple of it, per llama_decode) on `n_threads` threads, each generated token alone on 1 thread
(llama.cpp's n_threads = 1, n_threads_batch = n_threads), and each session's KV cells start at cell 0
of a KV cache of its own. So a local generation equals a swarm route's, and llama.cpp's whole model
run on one sequence with n_ubatch = UBATCH_TOKENS and one-row steps on 1 thread.

Several sessions at once: each session gets a llama.cpp context of its own (one sequence, KV cells
for its reserved tokens rounded up to `CONTEXT_CELL_STEP`), all sharing the loaded weights. In one
context shared by several sequences, a session's cells would land after or between the others'
and its logits would depend on them (measured on a unified cache: a 64-row ubatch at cell offset
1, 3 or 32 differs by up to 1.3 logits). A closed session's context is kept for the next session
that fits in it (clearing a context is cheap; building one costs ~10-140 ms on SmolLM2, mostly
zeroing its KV cache), as long as all contexts together stay within the cache budget.

One lock serialises every call into llama.cpp (the sessions share the cores), so sessions take
turns step by step.

This module does not: batch steps of different sessions into one llama_decode, evict idle
sessions, or let one session be driven from two threads at once.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import llama_cpp
import llama_cpp._internals as llama_internals
import numpy as np

from swarm.client.generate import StepResult
from swarm.client.telemetry import GenerationTelemetry
from swarm.client.tokenizer import context_length, load_llama
from swarm.errors import Busy, ExecutorError, ModelError, RequestError
from swarm.limits import MAX_CONTEXT_TOKENS
from swarm.numeric import UBATCH_TOKENS, check_chunk_tokens
from swarm.sampling import SamplingParams, sample

DEFAULT_MAX_SESSIONS = 4
"""Concurrent local sessions by default."""

PREFILL_BATCH_TOKENS = 512
"""Prompt tokens per llama_decode call (a multiple of the ubatch grid: llama.cpp cuts it into
ubatches of UBATCH_TOKENS rows from its start, so every ubatch stays on the grid)."""

CONTEXT_CELL_STEP = 256
"""A session's context holds its reserved tokens rounded up to this many KV cells: llama.cpp's own
padding of a KV stream, so the attention sees as many cells as in the oracle's and the peers'."""

_SCRATCH_CTX_TOKENS = 256
"""Cells of the throwaway context `llama_cpp.Llama` insists on building (llama.cpp's minimum)."""


def default_threads() -> int:
    """Threads for llama.cpp compute: every core this process may use."""
    return len(os.sched_getaffinity(0))


def open_local_model(path: Path, n_threads: int | None = None) -> llama_cpp.Llama:
    """Load the whole model (weights and vocabulary) for a `LocalEngine`.

    Args:
        path: a `.gguf` file.
        n_threads: threads for the prompt's multi-row ubatches; default all usable cores. Each
            generated token runs on 1 thread whatever this says (swarm/numeric.py: a one-row step's
            logits depend on its thread count).
    Returns:
        llama_cpp.Llama: the model and its vocabulary; `LocalEngine` builds the sessions' contexts
            from its `context_params` (threads, flash attention). Use it through `LocalEngine` and
            `swarm.client.tokenizer.Tokenizer`, not through its own completion methods.
    Raises:
        ModelError: llama.cpp refused the file.
        RequestError: n_threads out of range.
    """
    if n_threads is not None and (not isinstance(n_threads, int) or not 1 <= n_threads <= 1024):
        raise RequestError(f"n_threads must be an integer in [1, 1024], got {n_threads!r:.40}")
    threads = n_threads or default_threads()
    # llama_cpp.Llama always builds a context: a minimal one (1-token batches, so no real compute
    # buffer) that no session uses. Flash attention and threads as on the peers' executors and in
    # the oracle: llama.cpp runs a one-token ubatch on n_threads, a longer one on n_threads_batch.
    return load_llama(
        path,
        n_ctx=_SCRATCH_CTX_TOKENS,
        n_batch=1,
        n_ubatch=1,
        n_threads=1,
        n_threads_batch=threads,
        flash_attn=True,
    )


def _cells(n_tokens: int) -> int:
    return -(-n_tokens // CONTEXT_CELL_STEP) * CONTEXT_CELL_STEP


class LocalEngine:
    """`swarm.client.generate.Engine` over the whole model: one llama.cpp context per session.

    Thread-safe: sessions may be opened, stepped and closed from any thread (one session from one
    thread at a time). A session reserves its declared `n_tokens` of the cache budget when it opens,
    so an admitted session can always run to its end.

    Args:
        llama: from `open_local_model`.
        n_ctx: KV-cache tokens shared by all sessions (the sum of their reservations), also the most
            one session may hold. Default the model's training context, capped at 131,072.
        max_sessions: sessions that may be open at once, >= 1.
    Attributes:
        context_limit: tokens one session may hold (prompt + generated).
        cache_tokens: KV-cache tokens all open sessions may reserve together.
        max_sessions: sessions that may be open at once.
    Raises:
        RequestError: n_ctx or max_sessions out of range.
    """

    def __init__(self, llama: llama_cpp.Llama, n_ctx: int | None = None,
                 max_sessions: int = DEFAULT_MAX_SESSIONS):
        if not isinstance(max_sessions, int) or not 1 <= max_sessions <= 256:
            raise RequestError(f"max_sessions must be an integer in [1, 256], got {max_sessions!r:.40}")
        if n_ctx is not None and (not isinstance(n_ctx, int) or not 1 <= n_ctx <= MAX_CONTEXT_TOKENS):
            raise RequestError(f"n_ctx must be in [1, {MAX_CONTEXT_TOKENS}], got {n_ctx!r:.40}")
        check_chunk_tokens(PREFILL_BATCH_TOKENS, "PREFILL_BATCH_TOKENS")
        self._llama = llama  # keeps the model alive while contexts use it
        self._n_vocab = llama.n_vocab()
        self.cache_tokens = n_ctx or min(context_length(llama), MAX_CONTEXT_TOKENS)
        self.context_limit = min(self.cache_tokens, MAX_CONTEXT_TOKENS)
        self.max_sessions = max_sessions
        params = llama_cpp.llama_context_params.from_buffer_copy(llama.context_params)
        params.n_batch, params.n_ubatch = PREFILL_BATCH_TOKENS, UBATCH_TOKENS
        params.n_seq_max = 1
        self._params = params
        # Guards every llama.cpp call and the tables below. Re-entrant: the cyclic GC may finalise an
        # abandoned stream (closing its session) inside a locked section.
        self._lock = threading.RLock()
        self._open = 0
        self._reserved_tokens = 0  # reserved by open sessions
        self._idle: list[llama_internals.LlamaContext] = []  # contexts of closed sessions, for reuse
        self._cells = 0  # KV cells of every context, open or idle

    def session_room(self) -> int:
        """Tokens a session may hold: `context_limit` (Busy, not a shorter session, when the
        shared cache is taken)."""
        return self.context_limit

    def open_session(
        self, n_tokens: int, sampling: SamplingParams, telemetry: GenerationTelemetry
    ) -> LocalSession:
        """Reserve `n_tokens` of the cache budget and a context for a new session.

        Args:
            n_tokens: prompt + max_new_tokens, 1..context_limit.
            sampling: how the session turns logits into tokens.
            telemetry: unused here (the local backend has no hops to report).
        Returns:
            LocalSession: starts at position 0 on an empty context.
        Raises:
            RequestError: n_tokens out of range.
            Busy: max_sessions sessions are open, or the budget lacks n_tokens free tokens; the
                message names the numbers. Close (or finish) another stream first.
            ModelError: llama.cpp could not build the context (memory).
        """
        if not isinstance(n_tokens, int) or not 1 <= n_tokens <= self.context_limit:
            raise RequestError(f"a session must hold 1..{self.context_limit} tokens, got {n_tokens!r}")
        try:
            return self._admit(n_tokens, sampling)
        except Busy:
            # A stream dropped without close() is a reference cycle (the generator's frame holds the
            # stream): it releases its session only when the cyclic GC finalises it. Do that now.
            gc.collect()
            return self._admit(n_tokens, sampling)

    def _admit(self, n_tokens: int, sampling: SamplingParams) -> LocalSession:
        with self._lock:
            if self._open >= self.max_sessions:
                raise Busy(
                    f"all {self.max_sessions} local sessions are in use; "
                    "finish or close a stream before opening another"
                )
            free = self.cache_tokens - self._reserved_tokens
            if n_tokens > free:
                raise Busy(
                    f"session needs {n_tokens} KV tokens but only {free} of the {self.cache_tokens} "
                    f"shared by all local sessions are free ({self._reserved_tokens} reserved by "
                    f"{self._open} open sessions)"
                )
            ctx = self._context(n_tokens)
            self._open += 1
            self._reserved_tokens += n_tokens
        return LocalSession(self, ctx, n_tokens, sampling)

    def _context(self, n_tokens: int) -> llama_internals.LlamaContext:
        """An empty context of at least n_tokens cells: the smallest idle one that fits, else a new
        one (idle ones are freed first while all contexts would pass the budget). Call locked."""
        fits = [c for c in self._idle if c.n_ctx() >= n_tokens]
        if fits:
            ctx = min(fits, key=lambda c: c.n_ctx())
            self._idle.remove(ctx)
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx.ctx), False)
            return ctx
        cells = _cells(n_tokens)
        # open contexts' cells stay within reservations rounded up: cache_tokens plus one step each
        budget = self.cache_tokens + CONTEXT_CELL_STEP * self.max_sessions
        while self._idle and self._cells + cells > budget:
            self._drop(max(self._idle, key=lambda c: c.n_ctx()))
        params = llama_cpp.llama_context_params.from_buffer_copy(self._params)
        params.n_ctx = cells
        try:
            # Registers its own release with the model, so it is freed before the model is.
            ctx = llama_internals.LlamaContext(model=self._llama._model, params=params, verbose=False)  # noqa: SLF001
        except ValueError as e:
            raise ModelError(f"llama.cpp cannot build a {cells}-token context: {e}") from e
        self._cells += ctx.n_ctx()
        return ctx

    def _drop(self, ctx: llama_internals.LlamaContext) -> None:
        self._idle.remove(ctx)
        self._cells -= ctx.n_ctx()
        ctx.close()

    def _release(self, ctx: llama_internals.LlamaContext, n_tokens: int) -> None:
        """Give a closed session's reservation back and keep its context for the next session."""
        with self._lock:
            self._open -= 1
            self._reserved_tokens -= n_tokens
            self._idle.append(ctx)

    def _forward(self, session: LocalSession, tokens: Sequence[int], want_logits: bool) -> np.ndarray | None:
        """Decode `tokens` at the session's next positions in one llama_decode; advance the session.

        Args:
            session: an open session of this engine.
            tokens: 1..PREFILL_BATCH_TOKENS token ids.
            want_logits: return the last token's logits.
        Returns:
            The last token's logits, [n_vocab] float32 (a copy), when want_logits; else None.
        Raises:
            RequestError: the session is closed, or the step passes its reserved tokens.
            Busy: llama.cpp found no free KV cells (status 1).
            ExecutorError: llama_decode failed otherwise.
        """
        n, pos0 = len(tokens), session.pos
        batch = llama_cpp.llama_batch_init(n, 0, 1)
        try:
            for i, token in enumerate(tokens):
                batch.token[i] = token
                batch.pos[i] = pos0 + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 0
            batch.logits[n - 1] = int(want_logits)
            batch.n_tokens = n
            with self._lock:
                session.check_step(n)
                ctx = session.ctx.ctx
                rc = llama_cpp.llama_decode(ctx, batch)
                if rc == 1:
                    raise Busy(f"the session's KV cache ({session.ctx.n_ctx()} tokens) has no room left")
                if rc != 0:
                    raise ExecutorError(f"llama_decode failed with status {rc} at position {pos0}")
                session.pos = pos0 + n
                if not want_logits:
                    return None
                ptr = llama_cpp.llama_get_logits_ith(ctx, n - 1)
                if not ptr:
                    raise ExecutorError(f"llama.cpp returned no logits at position {pos0 + n - 1}")
                return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()
        finally:
            llama_cpp.llama_batch_free(batch)


class LocalSession:
    """One session of a `LocalEngine`: a llama.cpp context of its own and the positions filled in it.

    Args:
        engine: the engine that admitted it.
        ctx: the empty context it owns until `close` (sequence 0, at least n_tokens cells).
        n_tokens: tokens reserved; positions stay below this.
        sampling: how logits become tokens.
    Attributes:
        pos: next position to compute (tokens already in the context).
    """

    def __init__(self, engine: LocalEngine, ctx: llama_internals.LlamaContext, n_tokens: int,
                 sampling: SamplingParams):
        self._engine, self.ctx, self.reserved_tokens = engine, ctx, n_tokens
        self._sampling = sampling
        self.pos = 0
        self._closed = False

    def prefill(self, tokens: Sequence[int]) -> StepResult:
        """Run the prompt from position 0 in batches of PREFILL_BATCH_TOKENS tokens (ubatches of
        UBATCH_TOKENS inside, on the grid); sample the next token.

        Raises:
            RequestError: the session is closed or already started, the prompt is empty, or it
                passes the reserved tokens.
            ExecutorError: llama.cpp failed.
        """
        if self.pos != 0:
            raise RequestError(f"prefill on a session already at position {self.pos}")
        if not tokens:
            raise RequestError("empty prompt")
        self.check_step(len(tokens))
        step = PREFILL_BATCH_TOKENS
        logits = None
        for i in range(0, len(tokens), step):
            last = i + step >= len(tokens)
            logits = self._engine._forward(self, tokens[i : i + step], want_logits=last)  # noqa: SLF001
        assert logits is not None
        return self._sample(logits)

    def decode(self, token: int, follow: Callable[[int], bool] | None = None) -> StepResult:
        """Append one token at the next position and sample the token after it. (`follow` is
        ignored: with no round trip to hide, nothing is computed ahead.)

        Raises:
            RequestError: the session is closed, or the step passes the reserved tokens.
            ExecutorError: llama.cpp failed.
        """
        logits = self._engine._forward(self, [token], want_logits=True)  # noqa: SLF001
        assert logits is not None
        return self._sample(logits)

    def settle(self) -> None:
        """Nothing to settle: this process computed every token itself."""

    def close(self) -> None:
        """Give the context and the reserved tokens back to the engine (idempotent)."""
        with self._engine._lock:  # noqa: SLF001 - not while a step of this session holds the context
            if self._closed:
                return
            self._closed = True
            self._engine._release(self.ctx, self.reserved_tokens)  # noqa: SLF001

    def check_step(self, n_tokens: int) -> None:
        """Check that n_tokens more positions may run on this session.

        Raises:
            RequestError: the session is closed, or the step passes the reserved tokens.
        """
        if self._closed:
            raise RequestError("the session is closed")
        if self.pos + n_tokens > self.reserved_tokens:
            raise RequestError(
                f"step to position {self.pos + n_tokens} passes the session's "
                f"{self.reserved_tokens} reserved tokens"
            )

    def _sample(self, logits: np.ndarray) -> StepResult:
        r = sample(logits, self._sampling, position=self.pos)
        return StepResult(token=r.token, logprob=r.logprob, top=r.top)
