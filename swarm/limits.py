"""Product-wide limits, in one place so that every check quotes the same number."""

MAX_CONTEXT_TOKENS = 131_072
"""Hard cap on tokens per session (prompt + generated), whatever the model supports."""

MAX_GGUF_KV = 4096
"""Most metadata keys a GGUF header may hold (real models have 30-60)."""

MAX_GGUF_TENSORS = 65_536
"""Most tensors a GGUF may hold (a 61-layer mixture of experts has about 1,100)."""

MAX_GGUF_ARRAY_LEN = 1 << 22
"""Most elements of one GGUF metadata array (vocabularies and merge lists have up to ~300,000)."""

MAX_GGUF_TENSOR_DIMS = 4
"""ggml's GGML_MAX_DIMS."""
