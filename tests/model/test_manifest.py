"""Manifest and model_id: stable, and sensitive to exactly the tensor that changed."""

from __future__ import annotations

import shutil

import pytest

from swarm.errors import ProtocolError
from swarm.manifest import Manifest, build_manifest
from swarm.models import KNOWN_MODELS, sha256_file


def test_model_id_is_stable_and_round_trips(smollm2_path):
    a, b = build_manifest(smollm2_path), build_manifest(smollm2_path)
    assert a.model_id == b.model_id
    assert Manifest.from_bytes(a.to_bytes(), a.model_id) == a
    assert a.n_layers == 30 and a.n_embd == 576 and a.arch == "llama"
    assert sha256_file(smollm2_path) == KNOWN_MODELS["smollm2-135m"].sha256
    by_layer = [t for t in a.tensors if t.layer == 29]
    assert by_layer and all(t.name.startswith("blk.29.") for t in by_layer)
    assert {t.name for t in a.tensors if t.layer is None} == {"token_embd.weight", "output_norm.weight"}
    # Tensors tile the data section without overlap.
    spans = sorted((t.offset, t.offset + t.nbytes) for t in a.tensors)
    assert all(e <= s2 for (_, e), (s2, _) in zip(spans, spans[1:]))
    assert spans[0][0] == a.data_offset and spans[-1][1] <= a.file_size


def test_one_changed_byte_changes_that_tensor_and_model_id_only(smollm2_path, tmp_path):
    original = build_manifest(smollm2_path)
    victim = original.tensor("blk.7.ffn_down.weight")
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    with open(copy, "r+b") as f:
        f.seek(victim.offset + victim.nbytes // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x01]))
    changed = build_manifest(copy)
    assert changed.model_id != original.model_id
    diffs = [(a.name, a.sha256 != b.sha256) for a, b in zip(original.tensors, changed.tensors)]
    assert [name for name, differs in diffs if differs] == [victim.name]
    assert changed.header_sha256 == original.header_sha256
    assert changed.tokenizer_sha256 == original.tokenizer_sha256


def test_manifest_that_does_not_hash_to_its_id_is_refused(smollm2_path):
    m = build_manifest(smollm2_path)
    data = m.to_bytes()
    with pytest.raises(ProtocolError, match="does not hash"):
        Manifest.from_bytes(data.replace(b'"n_layers":30', b'"n_layers":31'), m.model_id)
    with pytest.raises(ProtocolError):
        Manifest.from_bytes(b"\x00garbage", None)


def test_manifest_cache_follows_file_changes(smollm2_path, tmp_path):
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    first = build_manifest(copy)
    assert build_manifest(copy) == first  # served from the cache
    victim = first.tensor("output_norm.weight")
    with open(copy, "r+b") as f:
        f.seek(victim.offset)
        f.write(b"\x00\x00\x80\x7f")
    changed = build_manifest(copy)  # size unchanged, mtime changed: must be re-hashed
    assert changed.tensor("output_norm.weight").sha256 != victim.sha256
    assert changed.model_id != first.model_id
