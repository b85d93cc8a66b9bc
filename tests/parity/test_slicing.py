"""Span files (slicing), the architecture table, and exact token embeddings, on the real models."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

from swarm.arch import arch_row, supported_architectures
from swarm.errors import ExecutorError, UnsupportedArchitecture
from swarm.errors import ModelError
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.ggml_bridge.gguf_header import scan
from swarm.ggml_bridge.slicing import arch_metadata, build_span, default_cache_dir, read_span_layers
from swarm.models import resolve_model


def fields(r: GGUFReader) -> dict:
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.") or
            k == "tokenizer.ggml.model"}


def tensor_names(r: GGUFReader) -> set[str]:
    return {t.name for t in r.tensors}


def test_arch_rows():
    assert {"gemma3", "llama", "qwen2"} <= set(supported_architectures())
    assert arch_row("llama").capture_name == "l_out"
    assert arch_row("gemma3").embedding_scale == "sqrt_hidden"
    assert arch_row("qwen2").embedding_scale is None
    with pytest.raises(UnsupportedArchitecture, match="'mamba'"):
        arch_row("mamba")
    swa = arch_row("gemma3").swa_pattern
    assert swa.flags(8, 6) == [True] * 5 + [False] + [True] * 2


def test_non_final_span_has_renumbered_blocks_and_no_vocab(tmp_path):
    path = resolve_model("smollm2-135m")
    span = build_span(path, 10, 20, cache_dir=tmp_path, model_id="ab" * 32)
    assert span == tmp_path / f"{'ab' * 8}-10-20.gguf"
    reader = GGUFReader(span)
    meta = fields(reader)
    assert meta["llama.block_count"] == 10
    assert meta["tokenizer.ggml.model"] == "no_vocab"
    assert meta["llama.vocab_size"] == 1
    assert (meta["swarm.span.start"], meta["swarm.span.end"], meta["swarm.span.n_layers"]) == (10, 20, 30)
    names = tensor_names(reader)
    assert {f"blk.{i}.attn_q.weight" for i in range(10)} <= names
    assert "blk.10.attn_q.weight" not in names
    src = {t.name: t for t in GGUFReader(path).tensors}
    out = {t.name: t for t in reader.tensors}
    assert np.array_equal(np.asarray(out["blk.0.ffn_down.weight"].data),
                          np.asarray(src["blk.10.ffn_down.weight"].data))
    assert list(out["token_embd.weight"].shape) == [576, 1]
    assert read_span_layers(span) == ("llama", 10)


def test_final_span_keeps_vocab_and_head(tmp_path):
    path = resolve_model("smollm2-135m")
    span = build_span(path, 25, 30, cache_dir=tmp_path)
    reader = GGUFReader(span)  # seconds per read: the reader parses the whole vocabulary
    meta = fields(reader)
    assert meta["llama.block_count"] == 5
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert {"output_norm.weight", "token_embd.weight"} <= tensor_names(reader)  # tied head: token_embd is the head
    assert list({t.name: t for t in reader.tensors}["token_embd.weight"].shape) == [576, 49152]


def test_cache_reuse_and_bad_spans(tmp_path):
    path = resolve_model("smollm2-135m")
    first = build_span(path, 0, 3, cache_dir=tmp_path)
    mtime = first.stat().st_mtime_ns
    assert build_span(path, 0, 3, cache_dir=tmp_path) == first
    assert first.stat().st_mtime_ns == mtime
    for start, end in ((-1, 3), (3, 3), (5, 2), (0, 31)):
        with pytest.raises(ValueError, match="inside the model's 30 layers"):
            build_span(path, start, end, cache_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]


@pytest.mark.slow
def test_gemma_sliding_window_pattern_written_per_layer(tmp_path):
    path = resolve_model("gemma3-270m")
    span = build_span(path, 4, 11, cache_dir=tmp_path)
    pattern = fields(GGUFReader(span))["gemma3.attention.sliding_window_pattern"]
    # whole model: layer il is sliding iff il % 6 < 5; layers 5 and 11 are global
    assert pattern == [True, False, True, True, True, True, True]


def test_slicing_reads_only_the_span_tensors(tmp_path):
    """A sparse copy holding only the header and the span's tensors slices to the same bytes."""
    path = resolve_model("smollm2-135m")
    reader = GGUFReader(path)
    sparse = tmp_path / "sparse.gguf"
    with open(path, "rb") as src, open(sparse, "wb") as dst:
        dst.write(src.read(reader.data_offset))
        for t in reader.tensors:
            if t.name.startswith(("blk.2.", "blk.3.", "blk.4.", "output_norm")):
                src.seek(t.data_offset)
                dst.seek(t.data_offset)
                dst.write(src.read(t.n_bytes))
        dst.truncate(os.path.getsize(path))
    assert os.stat(sparse).st_blocks * 512 < os.path.getsize(path) // 4
    a = build_span(path, 2, 5, cache_dir=tmp_path / "a", model_id="0" * 64)
    b = build_span(sparse, 2, 5, cache_dir=tmp_path / "b", model_id="0" * 64)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_token_embedder_rows_are_exact(model):
    path = resolve_model(model)
    emb = TokenEmbedder(path)
    ids = [0, 1, 2, 1000, emb.n_vocab - 1, 2]
    reader = GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    expected = dequantize(np.asarray(t.data)[ids], t.tensor_type).astype(np.float32)
    if arch_row(reader.fields["general.architecture"].contents()).embedding_scale:
        expected = expected * np.sqrt(np.float32(emb.n_embd))
    got = emb.embed(ids)
    assert got.shape == (len(ids), emb.n_embd) and got.dtype == np.float32
    assert np.array_equal(got, expected)
    for bad in ([], [emb.n_vocab], [-1], [1.5]):
        with pytest.raises(ExecutorError):
            emb.embed(bad)


def test_header_scan_matches_gguf_reader(tmp_path):
    path = resolve_model("smollm2-135m")
    header = scan(path)
    reader = GGUFReader(path)
    assert header.scalars["llama.block_count"] == 30
    assert header.array_lengths["tokenizer.ggml.tokens"] == 49152
    assert len(header.tensors) == len(reader.tensors)
    for t in reader.tensors:
        entry = header.tensors[t.name]
        assert (entry.offset, entry.ggml_type, entry.dims) == (t.data_offset, int(t.tensor_type),
                                                               tuple(int(d) for d in t.shape))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(ModelError, match="malformed"):
        scan(cut)
    with pytest.raises(ModelError):
        TokenEmbedder(cut)


def test_arch_metadata_from_the_header_scan_equals_gguf_reader():
    """The fast scan gives span_rules the same `<arch>.*` values as gguf's reader (scalars, and
    numeric arrays up to 4,096 elements; the real models have no such arrays: the synthetic ones'
    per-layer arrays are checked through their split rules in test_synthetic_parity.py)."""
    path = resolve_model("smollm2-135m")
    reader = GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    want = {}
    for key, field in reader.fields.items():
        if not key.startswith(f"{arch}."):
            continue
        if field.types[0] != GGUFValueType.ARRAY:
            want[key] = field.contents()
        elif field.types[1] != GGUFValueType.STRING and len(field.data) <= 4096:
            want[key] = list(field.contents())
    got = arch_metadata(scan(path), arch)
    assert got == want and f"{arch}.block_count" in got


def test_span_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SWARM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SWARM_SPAN_CACHE", raising=False)
    assert default_cache_dir() == tmp_path / "home" / "spans"
    monkeypatch.setenv("SWARM_SPAN_CACHE", str(tmp_path / "shared"))
    assert default_cache_dir() == tmp_path / "shared"
