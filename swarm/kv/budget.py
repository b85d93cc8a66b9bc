"""KV-cache arithmetic for a layer span: bytes per token and tokens that fit a byte budget.

llama.cpp's KV cache (`llama_kv_cache` in src/llama-kv-cache.cpp of the vendored llama.cpp,
lines ~209-234) allocates per layer one K tensor of `n_embd_k_gqa × kv_size` and one V tensor of
`n_embd_v_gqa × kv_size` elements, where n_embd_k_gqa = n_head_kv × head_dim_k (likewise for V),
and the default cache type is f16 (`type_k = type_v = GGML_TYPE_F16` in llama_context_default_params),
so one token costs (n_embd_k_gqa + n_embd_v_gqa) × 2 bytes per layer.

Checked against llama.cpp's own log (`llama_kv_cache: size = ...`): Qwen2.5 0.5B at n_ctx 32768
384.00 MiB (= 12,288 B/token), SmolLM2 135M at 4096 90.00 MiB (23,040 B/token), Gemma3 270M at
4096 12 + 60 MiB (18,432 B/token).

Sliding-window layers (gemma3's local layers): llama.cpp can keep them in a smaller SWA cache
(about window + ubatch cells instead of n_ctx). We count every layer as a full-context layer: this
is exact when the SWA cache is full-size (what llama-cpp-python's defaults gave in the Gemma3
measurement above: "using full-size SWA cache") and otherwise overstates bytes per token, which
understates the tokens a budget fits — the conservative side (a peer never admits more than it holds).

`SpanBudget` adds the span's weights to its KV cache: how many layers a peer with a given amount of
memory can serve, from the manifest's per-block tensor sizes.

This module does not: hold state, read GGUF files, or know about sessions.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from swarm.errors import RequestError


def _positive(name: str, v: object) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise RequestError(f"{name} must be a positive integer, got {v!r}")
    return v


def kv_bytes_per_token(
    n_layers_in_span: int, n_head_kv: int, head_dim_k: int, head_dim_v: int, bytes_per_elem: int = 2
) -> int:
    """KV-cache bytes one token occupies across the layers of a span.

    Args:
        n_layers_in_span: layers the peer runs (end - start).
        n_head_kv: key/value heads per layer (GQA).
        head_dim_k, head_dim_v: key and value head sizes, in elements.
        bytes_per_elem: bytes per cache element; 2 for llama.cpp's default f16 cache.
    Returns:
        int: bytes per token = n_layers × n_head_kv × (head_dim_k + head_dim_v) × bytes_per_elem.
    Raises:
        RequestError: an argument is not a positive integer.
    """
    n = _positive("n_layers_in_span", n_layers_in_span)
    per_layer = _positive("n_head_kv", n_head_kv) * (
        _positive("head_dim_k", head_dim_k) + _positive("head_dim_v", head_dim_v)
    )
    return n * per_layer * _positive("bytes_per_elem", bytes_per_elem)


def tokens_that_fit(budget_bytes: int, bytes_per_token: int) -> int:
    """How many tokens of KV cache fit in a byte budget (rounded down).

    Args:
        budget_bytes: bytes the peer gives to its KV cache, >= 0.
        bytes_per_token: from `kv_bytes_per_token`, > 0.
    Returns:
        int: floor(budget_bytes / bytes_per_token), >= 0.
    Raises:
        RequestError: budget_bytes negative or bytes_per_token not positive (or not integers).
    """
    if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes < 0:
        raise RequestError(f"budget_bytes must be an integer >= 0, got {budget_bytes!r}")
    return budget_bytes // _positive("bytes_per_token", bytes_per_token)


@dataclass(frozen=True)
class SpanBudget:
    """Which spans fit in the memory a peer gives: weights of the span + its KV cache + the head.

    A span [start, end) costs sum(layer_bytes[start:end]) + kv_tokens × kv_bytes_per_layer_token ×
    (end - start) bytes, plus head_bytes when end == n_layers (the last span carries the output norm
    and head, `swarm.artifacts.distribute.span_ranges`). Compute buffers and the runtime are not
    counted: `memory_bytes` is what the operator gives to weights and cache.

    Attributes:
        memory_bytes: bytes the peer gives, >= 0.
        layer_bytes: weight bytes of each block, `[n_layers]`.
        head_bytes: weight bytes of the output norm and head.
        kv_bytes_per_layer_token: KV bytes one token costs in one layer (`kv_bytes_per_token(1, ...)`).
        kv_tokens: KV-cache tokens the peer reserves for all its sessions.
        max_layers: an operator's cap on span length (None: memory alone decides).
    """

    memory_bytes: int
    layer_bytes: tuple[int, ...]
    head_bytes: int
    kv_bytes_per_layer_token: int
    kv_tokens: int
    max_layers: int | None = None
    _prefix: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # prefix[i] = bytes of layers [0, i) including their KV: span cost is a difference
        per_kv = self.kv_bytes_per_layer_token * self.kv_tokens
        object.__setattr__(self, "_prefix", (0, *itertools.accumulate(b + per_kv for b in self.layer_bytes)))

    @property
    def n_layers(self) -> int:
        """Layers in the model."""
        return len(self.layer_bytes)

    def span_bytes(self, start: int, end: int) -> int:
        """Bytes the span [start, end) needs: weights, KV cache, and the head on the last span."""
        head = self.head_bytes if end == self.n_layers else 0
        return self._prefix[end] - self._prefix[start] + head

    def fits(self, start: int, end: int) -> bool:
        """Whether [start, end) fits the memory and the layer cap."""
        if self.max_layers is not None and end - start > self.max_layers:
            return False
        return self.span_bytes(start, end) <= self.memory_bytes

    def longest_end(self, start: int) -> int:
        """The largest end such that [start, end) fits; `start` itself when not even one layer fits."""
        limit = self.memory_bytes + self._prefix[start]
        end = bisect.bisect_right(self._prefix, limit) - 1  # the head is checked below
        if self.max_layers is not None:
            end = min(end, start + self.max_layers)
        end = min(end, self.n_layers)
        if end == self.n_layers and not self.fits(start, end):
            end -= 1
        return max(start, end)


def span_budget(manifest, memory_bytes: int, kv_tokens: int, max_layers: int | None = None) -> SpanBudget:
    """The `SpanBudget` of a model from its manifest (`swarm.manifest.Manifest`).

    KV per layer and token comes from `<arch>.attention.head_count_kv`, `key_length` and
    `value_length` (default: embedding_length / head_count, as llama.cpp's hparams loader), f16.

    Raises:
        RequestError: memory_bytes or kv_tokens negative, or the manifest lacks the attention keys.
    """
    if (
        not isinstance(memory_bytes, int)
        or memory_bytes < 0
        or not isinstance(kv_tokens, int)
        or kv_tokens < 0
    ):
        raise RequestError(
            f"memory_bytes and kv_tokens must be integers >= 0, got {memory_bytes}, {kv_tokens}"
        )
    hp, arch = manifest.hparams, manifest.arch
    try:
        n_head = _first(hp[f"{arch}.attention.head_count"])
        n_head_kv = _first(hp.get(f"{arch}.attention.head_count_kv", n_head))
        head_k = int(hp.get(f"{arch}.attention.key_length", manifest.n_embd // n_head))
        head_v = int(hp.get(f"{arch}.attention.value_length", manifest.n_embd // n_head))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise RequestError(f"model {manifest.model_id[:16]}… has no usable attention shape: {e}") from None
    layer_bytes = [0] * manifest.n_layers
    head_bytes = 0
    for t in manifest.tensors:
        if t.layer is not None and 0 <= t.layer < manifest.n_layers:
            layer_bytes[t.layer] += t.nbytes
        elif t.name in ("output_norm.weight", "output.weight"):
            head_bytes += t.nbytes
    head_names = set()
    if not any(t.name == "output.weight" for t in manifest.tensors):  # tied head: token_embd
        head_names.add("token_embd.weight")
    # a served multi-token-prediction head lives on the last span too (its blocks, maybe token_embd)
    head_names.update(t.name for t in manifest.mtp_head_tensors())
    head_bytes += sum(t.nbytes for t in manifest.tensors if t.name in head_names)
    return SpanBudget(
        memory_bytes=memory_bytes,
        layer_bytes=tuple(layer_bytes),
        head_bytes=head_bytes,
        kv_bytes_per_layer_token=kv_bytes_per_token(1, n_head_kv, head_k, head_v),
        kv_tokens=kv_tokens,
        max_layers=max_layers,
    )


def _first(v) -> int:
    """A per-layer hparam may be an array (e.g. head counts that vary by layer): take the largest."""
    return int(max(v)) if isinstance(v, (list, tuple)) else int(v)
