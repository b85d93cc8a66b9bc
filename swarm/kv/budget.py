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

This module does not: hold state, read GGUF files, or know about sessions.
"""

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
