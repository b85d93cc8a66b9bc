"""A split GGUF is one model: its first shard resolves to the merged GGUF of every shard, a later
shard names the first, and a missing shard is named. A synthetic llama GGUF split into 3 shards by
the `gguf` package's writer (llama.cpp's `split.*` keys)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from swarm.errors import ModelError
from swarm.manifest import read_manifest
from swarm.models import resolve_model
from tests.helpers.synthetic import write_split, write_synthetic


@pytest.fixture(scope="module")
def split_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    whole = write_synthetic("llama", root / "llama.gguf")
    return whole, write_split(whole, root / "shards", 3)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_MODELS", str(tmp_path / "models"))
    return tmp_path / "models"


def test_first_shard_resolves_to_the_whole_model(split_model, cache):
    whole, shards = split_model
    merged = resolve_model(str(shards[0]))
    assert merged.is_relative_to(cache / "merged")
    # the gguf writer's split undone: the same bytes, so the same manifest and model_id as the whole file
    assert merged.read_bytes() == whole.read_bytes()
    manifest = read_manifest(merged)
    assert manifest.model_id == read_manifest(whole).model_id
    assert len(manifest.tensors) == len(read_manifest(whole).tensors)
    assert {t.layer for t in manifest.tensors if t.layer is not None} == set(range(manifest.n_layers))


def test_merged_file_is_reused_while_the_shards_are_unchanged(split_model, cache):
    _, shards = split_model
    first = resolve_model(str(shards[0]))
    stamp = first.stat().st_mtime_ns
    again = resolve_model(str(shards[0]))
    assert (again, again.stat().st_mtime_ns) == (first, stamp)


def test_a_later_shard_names_the_first(split_model, cache):
    _, shards = split_model
    with pytest.raises(ModelError, match=f"shard 2 of 3 .*give its first shard, {shards[0]}"):
        resolve_model(str(shards[1]))


def test_a_missing_shard_is_named(split_model, tmp_path, cache):
    _, shards = split_model
    for s in shards[:2]:
        shutil.copy(s, tmp_path / s.name)
    missing = tmp_path / shards[2].name
    with pytest.raises(ModelError, match=f"missing shard\\(s\\): {missing}$"):
        resolve_model(str(tmp_path / shards[0].name))
    assert not (cache / "merged").exists()


def test_a_shard_whose_keys_disagree_with_its_name_is_named(split_model, tmp_path, cache):
    _, shards = split_model
    shutil.copy(shards[0], tmp_path / shards[0].name)
    shutil.copy(shards[2], tmp_path / shards[1].name)  # shard 3's bytes under shard 2's name
    shutil.copy(shards[2], tmp_path / shards[2].name)
    with pytest.raises(ModelError, match=f"{tmp_path / shards[1].name}: its split keys say shard 2 of 3"):
        resolve_model(str(tmp_path / shards[0].name))


def test_models_info_on_the_first_shard_reports_the_whole_model(split_model, cache):
    whole, shards = split_model
    out = subprocess.run([sys.executable, "-m", "swarm.cli", "models", "info", str(shards[0])],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    fields = dict(line.split(None, 1) for line in out.splitlines() if line.strip() and "  " in line)
    manifest = read_manifest(whole)
    assert fields["model_id"].strip() == manifest.model_id
    assert fields["tensors"].strip() == str(len(manifest.tensors))
    assert fields["layers"].strip() == str(manifest.n_layers)


def test_the_command_line_names_the_first_shard_without_a_traceback(split_model, cache):
    _, shards = split_model
    proc = subprocess.run([sys.executable, "-m", "swarm.cli", "models", "info", str(shards[2])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"give its first shard, {shards[0]}" in proc.stderr
