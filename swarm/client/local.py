"""Whole-model generation in this process on llama.cpp: the `local=True` backend.

The model runs through llama-cpp-python's bindings to the same llama.cpp that the peers use;
sampling is `swarm.sampling`, the same code the last span of a swarm route runs, so a local and a
swarm generation with the same seed draw the same tokens.

Several sessions at once, as on a peer: the context holds `max_sessions` llama.cpp sequences in one
unified KV cache of n_ctx cells, and each session owns one seq id while it is open. With flash
attention a sequence's attention skips the other sequences' cells, so concurrent sessions (threads,
or interleaved iterators in one thread) each give exactly their solo output, on one condition: each
sequence's cells stay in position order, because the CPU kernel accumulates over cells in cell
order. llama.cpp places new tokens in the first free cell from its search head, and clearing a
sequence moves that head back to the hole it leaves, so a running session's next tokens would land
below its earlier ones (measured: logits off by ~1e-2 from that step on, greedy tokens differ a
dozen steps later). So a session that closes while others run hands its cells to one extra
"retired" sequence instead of freeing them: no hole opens. The cache is cleared when the last
session closes; retired cells count against the shared cache meanwhile, and are freed early only
when a new session needs the room (then later tokens may fill the holes: still correct, but no
longer bit-identical to a solo run).

One lock serialises every call into the context (llama_decode writes the one logits buffer the
context has), so sessions take turns step by step.

This module does not: batch steps of different sessions into one llama_decode, evict idle
sessions, or let one session be driven from two threads at once.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import llama_cpp._internals as llama_internals
import numpy as np

from swarm.client.generate import StepResult
from swarm.client.telemetry import GenerationTelemetry
from swarm.client.tokenizer import context_length, load_llama
from swarm.errors import Busy, ExecutorError, ModelError, RequestError
from swarm.limits import MAX_CONTEXT_TOKENS
from swarm.sampling import SamplingParams, sample

DEFAULT_MAX_SESSIONS = 4
"""Concurrent local sessions (llama.cpp sequences) by default."""

_SCRATCH_CTX_TOKENS = 256
"""Cells of the throwaway context `llama_cpp.Llama` insists on building (llama.cpp's minimum)."""


def default_threads() -> int:
    """Threads for llama.cpp compute: every core this process may use."""
    return len(os.sched_getaffinity(0))


def open_local_model(
    path: Path,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_batch: int = 512,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
) -> llama_cpp.Llama:
    """Load the whole model with a context of `max_sessions` sequences in one unified KV cache.

    Args:
        path: a `.gguf` file.
        n_ctx: KV-cache tokens, shared by all sessions; also the most one session may hold.
            Default the model's training context, capped at 131,072.
        n_threads: compute threads; default all usable cores.
        n_batch: prompt tokens per llama_decode call (also the physical batch).
        max_sessions: sessions that may be open at once, 1..llama.cpp's maximum - 1; the context
            has one more sequence (n_seq_max = max_sessions + 1) that holds retired cells.
    Returns:
        llama_cpp.Llama: the model, its vocabulary and (`.ctx`) the multi-sequence context; use it
            through `LocalEngine` and `swarm.client.tokenizer.Tokenizer`, not through its own
            completion methods (they assume the single sequence of a default context).
    Raises:
        ModelError: llama.cpp refused the file or could not build the context.
        RequestError: max_sessions, n_ctx or n_threads out of range.
    """
    max_seq = llama_cpp.llama_max_parallel_sequences()
    if not isinstance(max_sessions, int) or not 1 <= max_sessions < max_seq:
        raise RequestError(f"max_sessions must be an integer in [1, {max_seq - 1}], got {max_sessions!r}")
    if n_ctx is not None and not 1 <= n_ctx <= MAX_CONTEXT_TOKENS:
        raise RequestError(f"n_ctx must be in [1, {MAX_CONTEXT_TOKENS}], got {n_ctx!r}")
    if n_threads is not None and (not isinstance(n_threads, int) or not 1 <= n_threads <= 1024):
        raise RequestError(f"n_threads must be an integer in [1, 1024], got {n_threads!r:.40}")
    threads = n_threads or default_threads()
    # llama_cpp.Llama cannot ask for several sequences or a unified KV cache, and it always builds a
    # context: load with a minimal one (1-token batches, so no real compute buffer), then replace it.
    # Flash attention as on the peers' executors, so local and swarm generations agree bit for bit,
    # and so that sequences sharing the unified cache stay independent.
    llama = load_llama(
        path,
        n_ctx=_SCRATCH_CTX_TOKENS,
        n_batch=1,
        n_ubatch=1,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,
    )
    if n_ctx is None:
        n_ctx = min(context_length(llama), MAX_CONTEXT_TOKENS)
    params = llama_cpp.llama_context_params.from_buffer_copy(llama.context_params)
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = min(n_ctx, n_batch)
    params.n_seq_max = max_sessions + 1  # the last one holds retired cells (see the module docstring)
    params.kv_unified = True
    try:
        # Registers its own release with the model, so it is freed before the model is.
        ctx = llama_internals.LlamaContext(model=llama._model, params=params, verbose=False)  # noqa: SLF001
    except ValueError as e:
        raise ModelError(f"llama.cpp cannot build a {n_ctx}-token context for {path}: {e}") from e
    scratch, llama._ctx = llama._ctx, ctx  # noqa: SLF001 - see above
    scratch.close()
    llama.context_params, llama.n_batch = params, params.n_batch
    return llama


class LocalEngine:
    """`swarm.client.generate.Engine` over a whole-model context of several sequences.

    Thread-safe: sessions may be opened, stepped and closed from any thread (one session from one
    thread at a time). A session reserves its declared `n_tokens` of the shared KV cache when it
    opens, so an admitted session can always run to its end.

    Args:
        llama: from `open_local_model` (or any `llama_cpp.Llama`: with a default context of one
            sequence it runs one session at a time).
    Attributes:
        context_limit: tokens one session may hold (prompt + generated).
        cache_tokens: KV-cache cells shared by all sessions (llama.cpp n_ctx).
        max_sessions: sessions that may be open at once (llama.cpp n_seq_max - 1, or 1).
    """

    def __init__(self, llama: llama_cpp.Llama):
        self._llama = llama  # keeps the model and its context alive
        self._ctx = llama.ctx
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._n_batch = int(llama_cpp.llama_n_batch(self._ctx))
        self._n_vocab = llama.n_vocab()
        self.cache_tokens = int(llama_cpp.llama_n_ctx(self._ctx))
        n_seq = int(llama_cpp.llama_n_seq_max(self._ctx))
        self.max_sessions = max(n_seq - 1, 1)
        self._retired_seq_id = n_seq - 1 if n_seq > 1 else None
        self.context_limit = min(int(llama_cpp.llama_n_ctx_seq(self._ctx)), MAX_CONTEXT_TOKENS)
        # Guards every llama.cpp call on the context and the slot table below. Re-entrant: the cyclic
        # GC may finalise an abandoned stream (closing its session) inside a locked section.
        self._lock = threading.RLock()
        self._free_seq_ids = set(range(self.max_sessions))
        self._reserved_tokens = 0  # reserved by open sessions
        self._retired_tokens = 0  # cells held by the retired sequence

    def session_room(self) -> int:
        """Tokens a session may hold: `context_limit` (Busy, not a shorter session, when the
        shared cache is taken)."""
        return self.context_limit

    def open_session(
        self, n_tokens: int, sampling: SamplingParams, telemetry: GenerationTelemetry
    ) -> LocalSession:
        """Take a free sequence and reserve `n_tokens` KV cells for a new session.

        Args:
            n_tokens: prompt + max_new_tokens, 1..context_limit.
            sampling: how the session turns logits into tokens.
            telemetry: unused here (the local backend has no hops to report).
        Returns:
            LocalSession: starts at position 0 on an empty sequence.
        Raises:
            RequestError: n_tokens out of range.
            Busy: every sequence is in use, or the shared cache lacks n_tokens free cells; the
                message names the numbers. Close (or finish) another stream first.
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
            if not self._free_seq_ids:
                raise Busy(
                    f"all {self.max_sessions} local sessions are in use; "
                    "finish or close a stream before opening another"
                )
            if n_tokens > self.cache_tokens - self._reserved_tokens - self._retired_tokens:
                self._free_retired()
            free = self.cache_tokens - self._reserved_tokens
            if n_tokens > free:
                raise Busy(
                    f"session needs {n_tokens} KV tokens but only {free} of the {self.cache_tokens} "
                    f"shared by all local sessions are free ({self._reserved_tokens} reserved by "
                    f"{self.max_sessions - len(self._free_seq_ids)} open sessions)"
                )
            seq_id = min(self._free_seq_ids)
            if not llama_cpp.llama_memory_seq_rm(self._mem, seq_id, -1, -1):
                raise ExecutorError(f"llama.cpp could not clear sequence {seq_id}")
            self._free_seq_ids.remove(seq_id)
            self._reserved_tokens += n_tokens
        return LocalSession(self, seq_id, n_tokens, sampling)

    def _release(self, seq_id: int, n_tokens: int) -> None:
        """Give a closed session's seq id and reservation back; retire its cells if others run."""
        with self._lock:
            self._free_seq_ids.add(seq_id)
            self._reserved_tokens -= n_tokens
            if len(self._free_seq_ids) == self.max_sessions:  # the last open session: start afresh
                llama_cpp.llama_memory_clear(self._mem, False)
                self._retired_tokens = 0
                return
            if self._retired_seq_id is not None:
                n_cells = int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id)) + 1
                llama_cpp.llama_memory_seq_cp(self._mem, seq_id, self._retired_seq_id, -1, -1)
                self._retired_tokens += max(n_cells, 0)
            llama_cpp.llama_memory_seq_rm(self._mem, seq_id, -1, -1)

    def _free_retired(self) -> None:
        """Free the retired cells (holes open under running sessions: see the module docstring)."""
        if self._retired_seq_id is not None and self._retired_tokens:
            llama_cpp.llama_memory_seq_rm(self._mem, self._retired_seq_id, -1, -1)
            self._retired_tokens = 0

    def _forward(self, session: LocalSession, tokens: Sequence[int], want_logits: bool) -> np.ndarray | None:
        """Decode `tokens` at the session's next positions in one llama_decode; advance the session.

        Args:
            session: an open session of this engine.
            tokens: 1..n_batch token ids.
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
                batch.seq_id[i][0] = session.seq_id
                batch.logits[i] = 0
            batch.logits[n - 1] = int(want_logits)
            batch.n_tokens = n
            with self._lock:
                # Checked under the lock: a closed session's seq id may already serve another session.
                session.check_step(n)
                rc = llama_cpp.llama_decode(self._ctx, batch)
                if rc == 1:
                    raise Busy(f"the local KV cache ({self.cache_tokens} tokens) has no room left")
                if rc != 0:
                    raise ExecutorError(f"llama_decode failed with status {rc} at position {pos0}")
                session.pos = pos0 + n
                if not want_logits:
                    return None
                ptr = llama_cpp.llama_get_logits_ith(self._ctx, n - 1)
                if not ptr:
                    raise ExecutorError(f"llama.cpp returned no logits at position {pos0 + n - 1}")
                # Copied under the lock: the next llama_decode of any session overwrites the buffer.
                return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()
        finally:
            llama_cpp.llama_batch_free(batch)


class LocalSession:
    """One session of a `LocalEngine`: a llama.cpp sequence id and the positions filled in it.

    Args:
        engine: the engine that admitted it.
        seq_id: the sequence it owns until `close`.
        n_tokens: tokens reserved; positions stay below this.
        sampling: how logits become tokens.
    Attributes:
        pos: next position to compute (tokens already in the sequence).
    """

    def __init__(self, engine: LocalEngine, seq_id: int, n_tokens: int, sampling: SamplingParams):
        self._engine, self.seq_id, self.reserved_tokens = engine, seq_id, n_tokens
        self._sampling = sampling
        self.pos = 0
        self._closed = False

    def prefill(self, tokens: Sequence[int]) -> StepResult:
        """Run the prompt from position 0 in chunks of n_batch tokens; sample the next token.

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
        step = self._engine._n_batch  # noqa: SLF001 - the session is part of its engine
        logits = None
        for i in range(0, len(tokens), step):
            last = i + step >= len(tokens)
            logits = self._engine._forward(self, tokens[i : i + step], want_logits=last)  # noqa: SLF001
        assert logits is not None
        return self._sample(logits)

    def decode(self, token: int) -> StepResult:
        """Append one token at the next position and sample the token after it.

        Raises:
            RequestError: the session is closed, or the step passes the reserved tokens.
            ExecutorError: llama.cpp failed.
        """
        logits = self._engine._forward(self, [token], want_logits=True)  # noqa: SLF001
        assert logits is not None
        return self._sample(logits)

    def close(self) -> None:
        """Clear the sequence and give its seq id and reserved tokens back (idempotent)."""
        with self._engine._lock:  # noqa: SLF001 - not while a step of this session holds the context
            if self._closed:
                return
            self._closed = True
            self._engine._release(self.seq_id, self.reserved_tokens)  # noqa: SLF001

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
