"""Safe typed wrapper over libswarm_span: run layers [a, b) of a model for many sequences.

One `SpanExecutor` owns one llama.cpp model + context loaded from a span file (see `slicing`).
Every sequence (session) is a llama.cpp sequence id with a KV stream of its own: the context's
`n_ctx_tokens` cells are split evenly, `n_ctx_seq_tokens` per sequence, so a sequence's results do
not depend on what the other sequences hold, and no sequence holds more than `n_ctx_seq_tokens`.
Inputs are checked here (shapes, dtypes, finiteness, ids) and C status codes become
`ExecutorError`; a refused call leaves every sequence as it was (a failed deepseek4 step may empty
its sequence: `forward`), and the executor keeps serving.

Threading: ctypes releases the GIL during each C call, but one executor must be driven from one
thread at a time (the peer runs one executor thread per span). Different executors may run on
different threads.

A final span whose file holds multi-token-prediction blocks (`slicing.span_has_mtp`) also runs the
model's MTP head: every step feeds it too (so steps carry token ids), and `mtp_draft` gives the
head's logits for the token after the one a caller is about to feed, for speculative decoding.

This module does not decide session policy (admission, eviction, ids): see `swarm.kv.sessions`.
It stays one file past the house's ~400 lines: it is the one typed wrapper of one C handle, whose
every call checks its input and maps the C statuses the same way; the MTP head's calls are calls of
that handle.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from swarm.arch import arch_row
from swarm.errors import ExecutorError, ExecutorInterrupted
from swarm.ggml_bridge import _lib
from swarm.ggml_bridge.slicing import build_span, read_span_layers, span_has_mtp, span_reads_token_ids
from swarm.limits import MTP_MAX_DRAFTS, MTP_TRUNCATE_ROWS


@dataclass(frozen=True)
class ExecutorConfig:
    """How to open a span.

    Attributes:
        n_ctx_tokens: KV cells (tokens) in all; each sequence gets n_ctx_tokens / n_seq_max of them
            (llama.cpp rounds; `SpanExecutor.n_ctx_seq_tokens` is the result).
        n_seq_max: sequences (sessions) the executor holds at once, 1..256; ids are 0..n_seq_max-1.
        n_threads: CPU threads for llama.cpp's multi-row ubatches (prefill, batched steps); a
            one-row ubatch (a decode step) runs on 1 thread, as the numeric contract wants
            (swarm/numeric.py: flash attention's one-row sums depend on the thread count).
        is_last: the span ends at the model's last layer: forward returns logits.
        capture_name: boundary tensor name from the arch row (non-last spans).
        capture_layer: block index inside the span file whose output is captured (n_layers_in_span-1).
        n_batch: max tokens per llama_decode; longer steps are split into chunks of this size.
        n_ubatch: llama.cpp physical batch, <= n_batch.
        flash_attn: llama.cpp flash attention. On (default), as in every parity reference, which
            must use the same setting (llama-cpp-python: `Llama(flash_attn=True)`).
        require_token_ids: every step must carry its rows' token ids (the span holds layers that
            read them: the arch row's `token_ids` sideband, e.g. deepseek4's hash-routed layers).
        mtp: last span only: also run the file's multi-token-prediction head (one MTP block, kept in
            the final span's file by slicing), reading `ArchRow.mtp_input` for every row: "h_nextn"
            (llama.cpp's output-normed residual) or "residual" (the last block's output named by
            capture_name / capture_layer); steps must then carry token ids. "": no head.
        interruptible: `interrupt` may stop a step: the span's cache drops a stopped step's positions
            exactly (`ArchRow.rollback_exact`). False (the default, for hybrid and compressed
            caches, and for a span with an MTP head): `interrupt` does nothing.
        mtp_truncate: with `mtp`, the span's cache truncates exactly (`ArchRow.rollback_exact`): the
            head remembers what it was fed at each sequence's last MTP_TRUNCATE_ROWS positions and
            `truncate` cuts that far back (`SpanExecutor.truncate_depth`). False: no truncation into
            a sequence.
    """

    n_ctx_tokens: int
    n_seq_max: int
    n_threads: int
    is_last: bool
    capture_name: str
    capture_layer: int
    n_batch: int = 512
    n_ubatch: int = 512
    flash_attn: bool = True
    require_token_ids: bool = False
    mtp: str = ""
    interruptible: bool = False
    mtp_truncate: bool = False


_MTP_MODES = {"": 0, "residual": 1, "h_nextn": 2}
"""`ExecutorConfig.mtp` -> swarm_span_params.mtp (csrc/swarm_span.h)."""


@dataclass(frozen=True)
class BatchStep:
    """One sequence's step in `SpanExecutor.forward_batch`.

    Attributes:
        seq_id: sequence id in [0, n_seq_max).
        pos0: position of the first row; pos_max(seq_id) + 1.
        hidden: [n, n_embd] float32 (float16 accepted), n >= 1, finite.
        all_logits: last span only: logits of every row instead of the last.
        token_ids: [n] token id of each row (int, in [0, n_vocab)); needed by a span that
            `needs_token_ids`, ignored by the others.
    """

    seq_id: int
    pos0: int
    hidden: np.ndarray
    all_logits: bool = False
    token_ids: np.ndarray | None = None


class SpanExecutor:
    """Runs one span file's layers on hidden states, one llama.cpp sequence per session."""

    def __init__(self, span_path: Path, config: ExecutorConfig):
        """Load the span file and create its context.

        Raises:
            ExecutorError: bad config, library missing, llama.cpp failed to load or allocate.
        """
        if (not (1 <= config.n_seq_max <= 256) or config.n_ctx_tokens < 1 or config.n_threads < 1
                or config.mtp not in _MTP_MODES):
            raise ExecutorError(f"bad executor config: {config}")
        self._so = _lib.lib()
        self._config = config
        self._span_path = Path(span_path)
        params = _lib.SpanParams(
            model_path=str(span_path).encode(),
            n_ctx=config.n_ctx_tokens,
            n_seq_max=config.n_seq_max,
            n_threads=config.n_threads,
            n_batch=config.n_batch,
            n_ubatch=config.n_ubatch,
            flash_attn=1 if config.flash_attn else 0,
            capture_name=config.capture_name.encode(),
            capture_layer=config.capture_layer,
            is_last=1 if config.is_last else 0,
            require_token_ids=1 if config.require_token_ids else 0,
            mtp=_MTP_MODES[config.mtp],
            mtp_truncate=1 if config.mtp and config.mtp_truncate else 0,
        )
        handle = ctypes.c_void_p()
        rc = self._so.swarm_span_open(ctypes.byref(params), ctypes.byref(handle))
        if rc != _lib.SWARM_OK:
            raise ExecutorError(f"cannot open span {span_path}: {self._status(rc)}")
        self._h: ctypes.c_void_p | None = handle
        self._n_embd = int(self._so.swarm_span_n_embd(handle))
        self._n_vocab = int(self._so.swarm_span_n_vocab(handle))
        self._n_ctx_tokens = int(self._so.swarm_span_n_ctx(handle))
        self._n_ctx_seq_tokens = int(self._so.swarm_span_n_ctx_seq(handle))

    @classmethod
    def for_span(cls, model_path: Path, start: int, end: int, *, n_ctx_tokens: int, n_seq_max: int,
                 n_threads: int, model_id: str | None = None, cache_dir: Path | None = None,
                 n_batch: int = 512, flash_attn: bool = True) -> SpanExecutor:
        """Build (or reuse) the span file for global layers [start, end) and open it.

        The capture tensor comes from the architecture's row; the span is last iff end == n_layers, and
        a last span whose file keeps the model's MTP blocks runs the MTP head too.

        Raises:
            ValueError: start/end outside the model; UnsupportedArchitecture; ModelError; ExecutorError.
        """
        arch, n_layers = read_span_layers(model_path)
        row = arch_row(arch)
        span = build_span(model_path, start, end, cache_dir=cache_dir, model_id=model_id)
        is_last = end == n_layers
        mtp = is_last and span_has_mtp(span)
        config = ExecutorConfig(n_ctx_tokens=n_ctx_tokens, n_seq_max=n_seq_max, n_threads=n_threads,
                                is_last=is_last, capture_name=row.capture_name,
                                capture_layer=end - start - 1, n_batch=n_batch,
                                n_ubatch=n_batch, flash_attn=flash_attn,
                                require_token_ids=span_reads_token_ids(span),
                                mtp=row.mtp_input if mtp else "",
                                # a stopped step's rows would have to come out of the head too
                                interruptible=row.rollback_exact and not mtp,
                                mtp_truncate=mtp and row.rollback_exact)
        return cls(span, config)

    @property
    def span_path(self) -> Path:
        """The span file this executor runs."""
        return self._span_path

    @property
    def config(self) -> ExecutorConfig:
        """How it was opened."""
        return self._config

    @property
    def n_embd(self) -> int:
        """Width of every hidden-state row in and of non-last outputs: the model's hidden size times
        its row's `boundary_width` (deepseek4: 4 hyper-connection streams)."""
        return self._n_embd

    @property
    def needs_token_ids(self) -> bool:
        """Every step must carry its rows' token ids (`BatchStep.token_ids`): the span's layers or
        its MTP head read them."""
        return self._config.require_token_ids or self.has_mtp

    @property
    def has_mtp(self) -> bool:
        """The span runs the model's multi-token-prediction head (`mtp_draft`)."""
        return bool(self._config.mtp)

    @property
    def n_vocab(self) -> int:
        """Vocabulary size (width of logits) on the last span; 1 elsewhere."""
        return self._n_vocab

    @property
    def is_last(self) -> bool:
        """True when forward returns logits."""
        return self._config.is_last

    @property
    def n_threads(self) -> int:
        """llama.cpp compute threads of this executor's multi-row ubatches (one-row ones run on 1)."""
        return self._config.n_threads

    @property
    def n_batch(self) -> int:
        """Most rows one llama_decode call takes: a `forward` step longer than this is split into
        chunks of n_batch rows; a `forward_batch` holds at most this many rows in all."""
        return self._config.n_batch

    @property
    def n_seq_max(self) -> int:
        """Sequence ids are 0..n_seq_max-1."""
        return self._config.n_seq_max

    @property
    def n_ctx_tokens(self) -> int:
        """KV cells (tokens) of all sequences together, after llama.cpp's rounding."""
        return self._n_ctx_tokens

    @property
    def n_ctx_seq_tokens(self) -> int:
        """KV cells (tokens) of one sequence's stream: the most positions one sequence can hold.
        A step that would pass it fails with "KV cache full" and leaves the sequence as it was."""
        return self._n_ctx_seq_tokens

    def forward(self, seq_id: int, pos0: int, hidden: np.ndarray, *, all_logits: bool = False,
                token_ids: np.ndarray | None = None) -> np.ndarray:
        """Run the span's layers on `n` new tokens of sequence `seq_id`.

        Args:
            seq_id: sequence (session) id in [0, n_seq_max).
            pos0: position of the first row; must equal pos_max(seq_id) + 1 (0 for an empty sequence).
            hidden: [n, n_embd] float32 (float16 accepted, converted), n >= 1, all finite.
            all_logits: last span only: logits for every row instead of the last one.
            token_ids: [n] the rows' token ids; required when `needs_token_ids`, else ignored.
        Returns:
            non-last span: [n, n_embd] float32 hidden states after the span's last block;
            last span: [1, n_vocab] float32 logits of the last row, or [n, n_vocab] with all_logits.
        Raises:
            ExecutorInterrupted: `interrupt` stopped the step (the sequence as after any error).
            ExecutorError: bad shape/dtype/values, unknown seq id, non-contiguous position, KV cache
                full, llama.cpp failure. The sequence is unchanged after any error, or empty where
                llama.cpp cannot drop the step's positions again (deepseek4's compressed cache, after
                a step that failed past its first n_batch rows).
        """
        out, step, _x, _ids = self._prepare(BatchStep(seq_id, pos0, hidden, all_logits, token_ids))
        rc = self._so.swarm_span_execute(self._handle(), ctypes.byref(step))
        if rc == _lib.SWARM_ERR_INTERRUPTED:
            raise ExecutorInterrupted(
                f"sequence {seq_id}: forward of {step.n_tokens} tokens at {pos0} interrupted")
        if rc != _lib.SWARM_OK:
            raise self._step_error(rc, seq_id, pos0, step.n_tokens)
        return out

    @property
    def interruptible(self) -> bool:
        """`interrupt` can stop a step (`ExecutorConfig.interruptible`)."""
        return self._config.interruptible

    @property
    def can_truncate(self) -> bool:
        """`truncate` can cut the sequence back to any earlier position: the architecture's cache
        rolls back exactly (`ArchRow.rollback_exact`) and the span serves no MTP head, recorded as
        `ExecutorConfig.interruptible`, which needs the same. False for a recurrent or compressed
        state or a span with a head (see `truncate_depth`)."""
        return self._config.interruptible

    @property
    def truncate_depth(self) -> int | None:
        """How many positions back from a sequence's end `truncate` can cut it: None, any
        (`can_truncate`); MTP_TRUNCATE_ROWS for a span with an MTP head on a cache that truncates
        exactly (the head goes on from the h it was fed at the cut, which it remembers that far
        back: two verify passes of the most rows); 0 for a recurrent or compressed state, or a head
        on one (only a clear)."""
        if self.can_truncate:
            return None
        return MTP_TRUNCATE_ROWS if self.has_mtp and self._config.mtp_truncate else 0

    def interrupt(self, on: bool = True) -> None:
        """Ask a `forward` running on another thread to stop (on=True), or let forwards run again.

        While on, a running or later `forward` stops at its next graph node (ggml-cpu asks after
        each) and raises ExecutorInterrupted with its sequence as before the call; the request stays
        until `interrupt(False)`. `forward_batch` and every other call ignore it. Safe from any
        thread. A no-op on a closed executor, and on one that is not `interruptible`: where the
        cache cannot drop a stopped step's positions, the sequence would end empty instead
        (csrc/swarm_span.h, swarm_span_interrupt), so a rerun could not continue it.
        """
        if self._h is not None and self._config.interruptible:
            self._so.swarm_span_interrupt(self._h, int(bool(on)))

    def forward_batch(self, steps: Sequence[BatchStep]) -> list[np.ndarray]:
        """Run one step of each of several sequences together.

        The weights are read once per ubatch for all its rows, which is what makes batching decode
        steps of many sessions cheaper than running them one after another. Steps run in seq-id
        order; each run of consecutive seq ids with equal row counts is one ubatch (llama.cpp
        batches only consecutive per-sequence KV streams together).

        Args:
            steps: 1..n_seq_max steps of distinct sequences; their rows together at most n_batch.
        Returns:
            One array per step, in order, shaped as `forward` returns it for that step alone.
        Raises:
            ExecutorError: bad input (as `forward`), a repeated seq id, too many rows, or a failure
                of llama.cpp; every sequence of the batch is unchanged after any error (or empty, as
                for `forward`).
        """
        if not 1 <= len(steps) <= self._config.n_seq_max:
            raise ExecutorError(f"a batch holds 1..{self._config.n_seq_max} steps, got {len(steps)}")
        if len({st.seq_id for st in steps}) != len(steps):
            raise ExecutorError("a batch holds at most one step per sequence")
        if sum(int(st.hidden.shape[0]) for st in steps) > self.n_batch:
            raise ExecutorError(f"a batch holds at most {self.n_batch} rows")
        prepared = [self._prepare(st) for st in steps]  # keeps every input/output array alive
        arr = (_lib.SpanStep * len(steps))(*(p[1] for p in prepared))
        rc = self._so.swarm_span_execute_batch(self._handle(), arr, len(steps))
        if rc != _lib.SWARM_OK:
            first = steps[0]
            raise self._step_error(rc, first.seq_id, first.pos0, sum(p[1].n_tokens for p in prepared),
                                   batch=len(steps))
        return [p[0] for p in prepared]

    def _prepare(self, st: BatchStep) -> tuple[np.ndarray, _lib.SpanStep, np.ndarray, np.ndarray | None]:
        """Check one step; return its output array, its C descriptor and the contiguous float32
        input and int32 token ids the descriptor points to (the caller keeps all four alive through
        the C call)."""
        self._handle()
        self._check_seq(st.seq_id)
        x = self._check_hidden(st.hidden)
        if isinstance(st.pos0, bool) or not isinstance(st.pos0, (int, np.integer)) or st.pos0 < 0:
            raise ExecutorError(f"pos0 must be a non-negative int, got {st.pos0!r}")
        n = x.shape[0]
        ids = self._check_token_ids(st.token_ids, n) if self.needs_token_ids else None
        if self.is_last:
            out = np.empty((n if st.all_logits else 1, self._n_vocab), dtype=np.float32)
        else:
            out = np.empty((n, self._n_embd), dtype=np.float32)
        step = _lib.SpanStep(
            seq_id=st.seq_id, pos0=int(st.pos0), n_tokens=n,
            embd=x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            out=out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            out_cap=out.size, all_logits=1 if st.all_logits else 0,
            token_ids=None if ids is None else ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        )
        return out, step, x, ids

    def _step_error(self, rc: int, seq_id: int, pos0: int, n: int, batch: int = 1) -> ExecutorError:
        if rc == _lib.SWARM_ERR_POS and batch == 1:
            expected = self.pos_max(seq_id) + 1
            return ExecutorError(f"sequence {seq_id}: step starts at position {pos0}, expected {expected}")
        what = f"batch of {batch} steps ({n} tokens)" if batch > 1 else f"forward of {n} tokens at {pos0}"
        return ExecutorError(f"sequence {seq_id}: {what} failed: {self._status(rc)}")

    def mtp_draft(self, seq_id: int, token: int, pos: int | None = None) -> np.ndarray:
        """The MTP head's logits for the token after `token`: `mtp_drafts(seq_id, token, 1, pos)[0]`.

        Returns:
            [n_vocab] float32 logits; argmax is the head's greedy draft.
        Raises:
            ExecutorError: as `mtp_drafts`.
        """
        return self.mtp_drafts(seq_id, token, 1, pos)[0]

    def mtp_drafts(self, seq_id: int, token: int, n: int, pos: int | None = None) -> np.ndarray:
        """The MTP head's logits for the token after `token`, where `token` is the one the caller
        feeds at `pos` (default pos_max + 1, the next position), and for up to n - 1 tokens after
        that: row i + 1 drafts after row i's greedy token (first maximum), which the head feeds at the
        next position with its own h_nextn, as llama.cpp's common/speculative.cpp chains one head.
        The head reads h of pos - 1 (the tensor `ArchRow.mtp_input` names) and its own cache up to
        it; it is left holding the sequence's positions as before (the next step feeds the head its
        real row), so a draft may be asked again or not at all. A `pos` inside the sequence drafts as
        if it ended at pos - 1 (a verify pass whose rows from pos on are rejected); the head
        remembers its last `MTP_MAX_DRAFTS` (8) positions for that (MTP_TRUNCATE_ROWS, 128, on a
        cache that truncates: `truncate_depth`), and the entries it holds for pos.. afterwards are
        recomputed ones (csrc/swarm_span.h `swarm_span_mtp_draft_at`).

        Args:
            seq_id: a sequence holding at least one position.
            token: int in [0, n_vocab).
            n: drafts to chain, 1..MTP_MAX_DRAFTS.
            pos: 1..pos_max + 1, or None: pos_max + 1.
        Returns:
            [m, n_vocab] float32 logits, 1 <= m <= n: fewer where the session's KV stream has no cell
            left for the later drafts.
        Raises:
            ExecutorError: no MTP head, unknown seq id, empty sequence, token or n out of range, a
                pos the head does not remember (before the last 8 or 128, or before a state
                import), no KV cell left for the first draft's position, llama.cpp failure.
        """
        h = self._handle()
        self._check_seq(seq_id)
        if not self.has_mtp:
            raise ExecutorError("this span runs no multi-token-prediction head")
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or \
                not 0 <= token < self._n_vocab:
            raise ExecutorError(f"token must be an int in [0, {self._n_vocab}), got {token!r:.40}")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MTP_MAX_DRAFTS:
            raise ExecutorError(f"drafts must be an int in [1, {MTP_MAX_DRAFTS}], got {n!r:.40}")
        last = self.pos_max(seq_id)
        if last < 0:
            raise ExecutorError(f"sequence {seq_id} is empty: the MTP head drafts after a position")
        at = last + 1 if pos is None else pos
        if isinstance(at, bool) or not isinstance(at, (int, np.integer)) or not 1 <= at <= last + 1:
            raise ExecutorError(f"draft position must be an int in [1, {last + 1}], got {pos!r:.40}")
        out = np.empty((n, self._n_vocab), dtype=np.float32)
        made = ctypes.c_int32(0)
        rc = self._so.swarm_span_mtp_draft_at(h, seq_id, int(token), int(at), int(n),
                                              out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size,
                                              ctypes.byref(made))
        self._call(rc, f"MTP draft of sequence {seq_id} at {at}")
        return out[:made.value]

    def truncate(self, seq_id: int, pos: int) -> None:
        """Drop positions >= pos of `seq_id` (rollback); pos_max becomes min(pos_max, pos - 1).
        A span with an MTP head drops positions only as far back as `truncate_depth` (the head goes on
        from the h it was fed at pos), or all of them (pos 0).

        Raises:
            ExecutorError: unknown seq id, negative pos, a rollback the span's cache or head cannot do.
        """
        self._check_seq(seq_id)
        rc = self._so.swarm_span_truncate(self._handle(), seq_id, int(pos))
        self._call(rc, f"truncate {seq_id} at {pos}")

    def clear(self, seq_id: int) -> None:
        """Drop every position of `seq_id`.

        Raises:
            ExecutorError: unknown seq id.
        """
        self._check_seq(seq_id)
        self._call(self._so.swarm_span_clear(self._handle(), seq_id), f"clear {seq_id}")

    def pos_max(self, seq_id: int) -> int:
        """Largest position held by `seq_id`, -1 when empty.

        Raises:
            ExecutorError: unknown seq id.
        """
        self._check_seq(seq_id)
        return int(self._so.swarm_span_seq_pos_max(self._handle(), seq_id))

    def export_seq(self, seq_id: int) -> bytes:
        """The KV state of `seq_id` as opaque bytes (llama.cpp's sequence state format; with an MTP
        head, a frame holding the span's and the head's states and the head's last h).

        Raises:
            ExecutorError: unknown seq id, llama.cpp failed.
        """
        h = self._handle()
        self._check_seq(seq_id)
        cap = int(self._so.swarm_span_state_size(h, seq_id))
        buf = (ctypes.c_uint8 * cap)()
        written = ctypes.c_size_t(0)
        rc = self._so.swarm_span_state_get(h, seq_id, buf, cap, ctypes.byref(written))
        self._call(rc, f"export {seq_id}")
        return ctypes.string_at(buf, written.value)  # one copy (slicing a ctypes array builds a list)

    def import_seq(self, seq_id: int, data: bytes) -> None:
        """Load bytes from `export_seq` of an executor on the same span file into an empty `seq_id`.

        Raises:
            ExecutorError: unknown seq id, sequence not empty, empty or malformed bytes (the
                sequence stays empty).
        """
        h = self._handle()
        self._check_seq(seq_id)
        if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) == 0:
            raise ExecutorError("import_seq needs non-empty bytes")
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        self._call(self._so.swarm_span_state_set(h, seq_id, buf, len(data)), f"import into {seq_id}")

    def close(self) -> None:
        """Free the context and model; later calls raise ExecutorError. Idempotent."""
        if self._h is not None:
            self._so.swarm_span_close(self._h)
            self._h = None

    def __enter__(self) -> SpanExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _handle(self) -> ctypes.c_void_p:
        if self._h is None:
            raise ExecutorError("executor is closed")
        return self._h

    def _check_seq(self, seq_id: int) -> None:
        if isinstance(seq_id, bool) or not isinstance(seq_id, (int, np.integer)) or \
                not 0 <= seq_id < self._config.n_seq_max:
            raise ExecutorError(f"sequence id {seq_id!r} is outside [0, {self._config.n_seq_max})")

    def _check_hidden(self, hidden: np.ndarray) -> np.ndarray:
        if not isinstance(hidden, np.ndarray):
            raise ExecutorError(f"hidden must be a numpy array, got {type(hidden).__name__}")
        if hidden.ndim != 2 or hidden.shape[0] < 1 or hidden.shape[1] != self._n_embd:
            raise ExecutorError(f"hidden must be [n >= 1, {self._n_embd}], got {list(hidden.shape)}")
        if hidden.dtype not in (np.float32, np.float16):
            raise ExecutorError(f"hidden must be float32 (or float16), got {hidden.dtype}")
        x = np.ascontiguousarray(hidden, dtype=np.float32)
        if not np.isfinite(x).all():
            raise ExecutorError("hidden holds NaN or infinite values")
        return x

    def _check_token_ids(self, token_ids: np.ndarray | None, n: int) -> np.ndarray:
        if token_ids is None:
            raise ExecutorError("this span reads token ids: the step must carry them")
        ids = np.asarray(token_ids)
        if ids.shape != (n,) or ids.dtype.kind not in "iu":
            raise ExecutorError(f"token_ids must be [{n}] integers, got {ids.dtype} {list(ids.shape)}")
        if n and (int(ids.min()) < 0 or int(ids.max()) >= self._n_vocab):
            raise ExecutorError(f"token ids must lie in [0, {self._n_vocab})")
        return np.ascontiguousarray(ids, dtype=np.int32)

    def _call(self, rc: int, what: str) -> None:
        if rc != _lib.SWARM_OK:
            raise ExecutorError(f"{what} failed: {self._status(rc)}")

    def _status(self, rc: int) -> str:
        return f"{self._so.swarm_status_str(rc).decode()} (status {rc})"
