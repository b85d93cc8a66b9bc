"""Draft models for speculative decoding: a GGUF run in the client process on llama.cpp.

A draft model guesses the next tokens by decoding greedily on its own weights; the route's last
span checks every guess (swarm/spec/verify.py), so a draft changes how fast the text comes, never
the text. It pays where a pass through the route costs round trips and the draft guesses the
target's tokens often: the cheapest such draft is the target itself at a lower quantization
(`self_draft`: llama.cpp's quantize API writes it once into the model cache, no second download).

Any GGUF whose tokenizer is the target's may draft (`check_same_tokenizer`: same tokenizer type,
vocabulary and merges, so that token id i is the same token in both); another is refused.

`DraftWeights` is a draft GGUF loaded once for a client; each generation drafts through its own
`DraftModel` (the `swarm.spec.draft.Draft` of that generation), which keeps its KV cache across
calls: it computes only the tokens after the longest prefix it already holds and removes from its
cache the rest (the drafts the route rejected). A closed `DraftModel` leaves its context, with the
tokens in it, to the next generation, which reuses whatever prompt prefix the two share (a chat's
history).

The draft's logits need not be exact: they decide only which guesses are sent. So its steps are
not held to the numeric contract (swarm/numeric.py): any batch, any thread count.

This module does not: verify, sample non-greedily, or touch the route.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import llama_cpp._internals as llama_internals
import numpy as np

from swarm.client.local import default_threads
from swarm.client.tokenizer import load_llama
from swarm.errors import ExecutorError, ModelError
from swarm.ggml_bridge.gguf_header import scan
from swarm.models import cache_dir, check_gguf

SELF_DRAFT_TYPE = "Q3_K_M"
"""Default llama.cpp type of the self-draft: of Q2_K, Q3_K_M and Q4_0 the one whose guesses the
target keeps most often on SmolLM2 and Qwen, at about the same draft time (scripts/bench_draft.py;
figures in docs/speculative.md)."""

SELF_DRAFT_TYPES = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_0", "Q4_K_S", "IQ4_NL")
"""Types a self-draft may be requantized to (llama.cpp `LLAMA_FTYPE_MOSTLY_<type>`): types that need
no importance matrix. llama.cpp quantizes a tensor whose rows are not a multiple of 256 wide to a
fallback type (Q4_0, Q5_0 ... for the K types), so on narrow models such as SmolLM2 (576) most of
the self-draft is Q4_0 whatever the type."""

BATCH_TOKENS = 512
"""Tokens per llama_decode at most when the draft catches up with the text (a prompt, or the tokens
decoded since its last proposal); fewer in a smaller context (llama.cpp caps a batch at n_ctx)."""

CONTEXT_CELL_STEP = 256
"""A draft context holds its generation's tokens rounded up to this many (llama.cpp's own padding),
so that a pooled context fits the next generations of about the same length."""

DRAFT_THREADS = 1
"""Threads of a draft's steps by default. Measured on this machine (2 cores shared with other work),
SmolLM2's Q3_K_M self-draft: a one-token step 14 ms on 1 thread, 29 ms on 2; a 96-token catch-up
0.56 s on 1 thread, 5.1 s on 2 while other processes kept the cores busy (llama.cpp's threads wait
for each other at every op). A client with cores to spare may give more (`Client(draft_threads=)`)."""

IDLE_CONTEXTS = 2
"""Contexts of finished generations a `DraftWeights` keeps for the next ones."""

_TOKENIZER_SCALARS = ("tokenizer.ggml.model",)
_TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


def _tokenizer_identity(path: Path) -> tuple[dict[str, object], dict[str, tuple[int, str]]]:
    """The tokenizer type and (element count, sha256 of the bytes) of the vocabulary and merges.

    Raises:
        ModelError: not a readable GGUF, or it has no vocabulary.
    """
    header = scan(check_gguf(path))
    scalars = {k: header.scalars.get(k) for k in _TOKENIZER_SCALARS}
    arrays: dict[str, tuple[int, str]] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for key in _TOKENIZER_ARRAYS:
            if key in header.array_spans:
                start, end = header.array_spans[key]
                arrays[key] = (header.array_lengths[key], hashlib.sha256(m[start:end]).hexdigest())
    if "tokenizer.ggml.tokens" not in arrays:
        raise ModelError(f"{path} has no vocabulary (tokenizer.ggml.tokens)")
    return scalars, arrays


def check_same_tokenizer(draft: Path, target: Path) -> None:
    """Refuse a draft GGUF whose tokenizer is not the target's.

    Equal means: the same `tokenizer.ggml.model` (llama, gpt2, ...), and byte-equal
    `tokenizer.ggml.tokens` and `tokenizer.ggml.merges` arrays (both without merges counts as equal).
    Only the header is read.

    Raises:
        ModelError: either file is not a GGUF with a vocabulary, or the tokenizers differ (the message
            names what differs).
    """
    d_scalars, d_arrays = _tokenizer_identity(draft)
    t_scalars, t_arrays = _tokenizer_identity(target)
    why = []
    for key in _TOKENIZER_SCALARS:
        if d_scalars[key] != t_scalars[key]:
            why.append(f"{key} {d_scalars[key]!r} vs {t_scalars[key]!r}")
    for key in _TOKENIZER_ARRAYS:
        d, t = d_arrays.get(key), t_arrays.get(key)
        if d == t:
            continue
        if d is None or t is None:
            why.append(f"{key} only in the {'target' if d is None else 'draft'}")
        elif d[0] != t[0]:
            why.append(f"{key}: {d[0]} vs {t[0]} entries")
        else:
            why.append(f"{key}: {d[0]} entries each, not the same")
    if why:
        raise ModelError(
            f"draft model {draft} cannot draft for {target}: its tokenizer differs ({'; '.join(why)}); "
            "a draft model must have the target's tokenizer (vocabulary and merges)"
        )


def self_draft_path(model_id: str, qtype: str, cache: str | os.PathLike | None = None) -> Path:
    """Where the self-draft of the model `model_id` at `qtype` is cached:
    `<models cache>/../drafts/<model_id[:16]>-<qtype>.gguf`, beside the manifests and artifacts."""
    return cache_dir(cache).parent / "drafts" / f"{model_id[:16]}-{qtype}.gguf"


def self_draft(target: Path, model_id: str, qtype: str = SELF_DRAFT_TYPE,
               cache: str | os.PathLike | None = None, n_threads: int | None = None) -> Path:
    """The target requantized to `qtype` with llama.cpp's quantize API, made once and cached.

    The file is written under a temporary name in the drafts directory and renamed into place, so
    the cache never holds a partial draft (two clients making it at once both write, one wins).
    It keeps the target's metadata, tokenizer included.

    Args:
        target: the target's whole GGUF (not a model_id client's sparse file, whose layer bytes
            were never fetched).
        model_id: the target's model_id (names the cached file).
        qtype: one of SELF_DRAFT_TYPES.
        cache: model cache directory override (`swarm.models.cache_dir`).
        n_threads: quantization threads; default all usable cores.
    Returns:
        The cached draft's path.
    Raises:
        ModelError: unknown qtype, or llama.cpp failed.
    """
    if qtype not in SELF_DRAFT_TYPES:
        raise ModelError(f"unknown self-draft type {qtype!r}: one of {', '.join(SELF_DRAFT_TYPES)}")
    dest = self_draft_path(model_id, qtype, cache)
    if dest.exists():
        return check_gguf(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype}")
    params.allow_requantize = True  # the target is usually quantized already
    params.nthread = n_threads or default_threads()
    try:
        rc = llama_cpp.llama_model_quantize(str(target).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise ModelError(f"llama.cpp could not requantize {target} to {qtype} (status {rc})")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def check_draft_option(draft: str) -> None:
    """Refuse a draft option that cannot work, before anything is loaded or joined: an unknown
    self-draft type, or a draft path that is not a GGUF file ("lookup" and "mtp" pass; whether the
    model has an MTP head is known once the swarm's manifest is: `Client`).

    Raises:
        ModelError: as said; the message names the accepted values.
    """
    if draft in ("lookup", "mtp"):
        return
    if draft == "self" or draft.startswith("self:"):
        qtype = draft.partition(":")[2] or SELF_DRAFT_TYPE
        if qtype not in SELF_DRAFT_TYPES:
            raise ModelError(f"unknown self-draft type {qtype!r}: one of {', '.join(SELF_DRAFT_TYPES)}")
        return
    try:
        check_gguf(Path(draft).expanduser())
    except ModelError as e:
        raise ModelError(
            f"draft {draft!r}: {e} (a draft is lookup, mtp, self, self:TYPE or a .gguf path)"
        ) from None


def load_draft(draft: str, target: Path, model_id: str, whole: bool = True,
               n_threads: int | None = None) -> DraftWeights:
    """The draft model a client asked for, loaded.

    Args:
        draft: "self" (the target requantized to SELF_DRAFT_TYPE), "self:TYPE" (to TYPE, one of
            SELF_DRAFT_TYPES), or the path of a draft GGUF with the target's tokenizer.
        target: the target's GGUF as this client holds it (whole, or a model_id's header and
            embeddings: enough for the tokenizer check, not for a self-draft).
        model_id: the target's model_id.
        whole: whether `target` holds the weights (False for a client that joined by model_id).
        n_threads: the draft's llama.cpp threads (`DraftWeights`).
    Raises:
        ModelError: an unknown self-draft type, a missing or non-GGUF draft file, a draft whose
            tokenizer differs from the target's, no target weights for a self-draft, or llama.cpp
            refused to requantize or load it.
    """
    if draft == "self" or draft.startswith("self:"):
        if not whole:
            raise ModelError("a self-draft requantizes the model's weights, and this client holds only "
                             "its tokenizer and embeddings (it joined by model_id): give the model as a "
                             "local .gguf, or a draft .gguf")
        qtype = draft.partition(":")[2] or SELF_DRAFT_TYPE
        path = self_draft(target, model_id, qtype)
    else:
        path = check_gguf(Path(draft).expanduser())
    # a self-draft keeps the target's metadata; checked all the same (a file in the cache could be
    # anything by now), at the cost of hashing two headers
    check_same_tokenizer(path, target)
    return DraftWeights(path, n_threads=n_threads)


class DraftWeights:
    """A draft GGUF loaded once (weights and vocabulary), shared by the drafts of a client's
    generations. Thread-safe: each generation's `DraftModel` has a context of its own.

    Args:
        path: the draft's GGUF (already checked against the target's tokenizer).
        n_threads: llama.cpp threads of the draft's steps (default DRAFT_THREADS).
    Raises:
        ModelError: llama.cpp refused the file.
    """

    def __init__(self, path: Path, n_threads: int | None = None):
        self.path = path
        threads = n_threads or DRAFT_THREADS
        # llama_cpp.Llama builds a context of its own: a minimal one, unused (as in swarm/client/local.py).
        self._llama = load_llama(path, n_ctx=256, n_batch=1, n_ubatch=1, n_threads=threads,
                                 n_threads_batch=threads)
        self.n_vocab = self._llama.n_vocab()
        params = llama_cpp.llama_context_params.from_buffer_copy(self._llama.context_params)
        params.n_batch = params.n_ubatch = BATCH_TOKENS
        params.n_seq_max = 1
        self._params = params
        self._lock = threading.Lock()
        self._idle: list[tuple[llama_internals.LlamaContext, list[int]]] = []

    def draft(self, n_tokens: int) -> DraftModel:
        """A draft for one generation of at most `n_tokens` tokens (prompt + generated)."""
        return DraftModel(self, n_tokens)

    def _context(
        self, n_tokens: int, tokens: Sequence[int]
    ) -> tuple[llama_internals.LlamaContext, list[int]]:
        """An idle context of at least `n_tokens` cells (the one holding the longest prefix of
        `tokens`) with the tokens in its cache, else a new empty one.

        Raises:
            ModelError: llama.cpp could not build the context (memory).
        """
        with self._lock:
            fits = [c for c in self._idle if c[0].n_ctx() >= n_tokens]
            if fits:
                best = max(fits, key=lambda c: (_common_prefix(c[1], tokens), -c[0].n_ctx()))
                self._idle.remove(best)
                return best
        params = llama_cpp.llama_context_params.from_buffer_copy(self._params)
        params.n_ctx = -(-n_tokens // CONTEXT_CELL_STEP) * CONTEXT_CELL_STEP
        try:
            model = self._llama._model  # noqa: SLF001 - the context registers its release with the model
            return llama_internals.LlamaContext(model=model, params=params, verbose=False), []
        except ValueError as e:
            raise ModelError(f"llama.cpp cannot build a {n_tokens}-token draft context: {e}") from e

    def _give_back(self, ctx: llama_internals.LlamaContext, tokens: list[int]) -> None:
        with self._lock:
            self._idle.append((ctx, tokens))
            while len(self._idle) > IDLE_CONTEXTS:
                self._idle.pop(0)[0].close()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0])


class DraftModel:
    """The draft of one generation (`swarm.spec.draft.Draft`): greedy tokens of a local model.

    Its context is taken from `weights` on the first proposal (a finished generation's, reusing the
    prompt prefix both share, or a new one) and given back by `close`.

    Args:
        weights: the loaded draft GGUF.
        n_tokens: prompt + generated tokens of the generation at most (>= 1): the context's size.
    """

    def __init__(self, weights: DraftWeights, n_tokens: int):
        if n_tokens < 1:
            raise ValueError(f"a draft holds >= 1 tokens, got {n_tokens}")
        self._weights, self._n_tokens = weights, n_tokens
        self._ctx: llama_internals.LlamaContext | None = None
        self._cached: list[int] = []
        """The tokens in the context's KV cache, at positions 0.."""
        self._batch: llama_internals.LlamaBatch | None = None

    @property
    def cached(self) -> list[int]:
        """The tokens in the draft's KV cache (positions 0..), a copy."""
        return list(self._cached)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """The `k` tokens greedy decoding on the draft model continues `tokens` with (fewer where
        the context would overflow; [] for k < 1 or no tokens).

        Raises:
            ExecutorError: llama.cpp failed a step.
            ModelError: no memory for the context.
        """
        n = len(tokens)
        k = min(k, self._n_tokens - n + 1)
        if k < 1 or n == 0:
            return []
        if self._ctx is None:
            self._ctx, self._cached = self._weights._context(self._n_tokens, tokens)  # noqa: SLF001
            self._batch = llama_internals.LlamaBatch(n_tokens=BATCH_TOKENS, embd=0, n_seq_max=1,
                                                     verbose=False)
        # The last token's logits are needed even when it is cached: compute it again.
        keep = min(_common_prefix(self._cached, tokens), n - 1)
        if keep < len(self._cached):
            # drop the rejected drafts (and anything else past the common prefix) from the cache
            if not self._ctx.kv_cache_seq_rm(0, keep, -1):
                self._ctx.kv_cache_clear()  # a cache that cannot cut a sequence short (recurrent)
                keep = 0
            del self._cached[keep:]
        out = [self._step(tokens[keep:])]
        for _ in range(k - 1):
            out.append(self._step(out[-1:]))
        return out

    def _step(self, tokens: Sequence[int]) -> int:
        """Append `tokens` to the cache (batches of at most BATCH_TOKENS) and return the argmax after
        them."""
        ctx = self._ctx
        step = min(BATCH_TOKENS, llama_cpp.llama_n_batch(ctx.ctx))
        for i in range(0, len(tokens), step):
            chunk, pos = list(tokens[i : i + step]), len(self._cached)
            self._batch.set_batch(chunk, n_past=pos, logits_all=False)
            rc = llama_cpp.llama_decode(ctx.ctx, self._batch.batch)
            if rc != 0:
                self._cached.clear()  # what the failed step left in the cache is unknown
                ctx.kv_cache_clear()
                raise ExecutorError(
                    f"the draft model's llama_decode failed with status {rc} at position {pos}"
                )
            self._cached.extend(chunk)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx.ctx, -1),
                                       shape=(self._weights.n_vocab,))
        return int(np.argmax(logits))

    def close(self) -> None:
        """Give the context, with the tokens in its cache, back for the next generation (idempotent;
        a later proposal takes a context again)."""
        if self._ctx is not None:
            self._weights._give_back(self._ctx, self._cached)  # noqa: SLF001
            self._batch.close()
            self._ctx, self._batch, self._cached = None, None, []
