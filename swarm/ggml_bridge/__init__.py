"""The bridge to llama.cpp: run a layer span of a GGUF model on unmodified llama.cpp.

Files:
    gguf_header.py fast header-only scan of a GGUF: scalar metadata and the tensor table
    gguf_raw.py copy a GGUF's metadata arrays and tensors as raw bytes into a gguf.GGUFWriter
    slicing.py  build (and cache) the GGUF holding one span's blocks, renumbered, with cut metadata
    span_metadata.py the span file's metadata: per-layer arrays cut, derived arrays written, its place
    _lib.py     ctypes declarations for csrc/swarm_span.h (libswarm_span.so, built by scripts/build_csrc.sh)
    executor.py SpanExecutor: hidden states in, hidden states or logits out, one sequence per session
    embed.py    TokenEmbedder: exact token-embedding rows (ggml's own dequantizer) with the arch's scale

Flow: slicing.build_span -> SpanExecutor(span file) -> _lib -> libswarm_span.so -> libllama.so.
This package does not decide sessions, routing or sampling.
"""
