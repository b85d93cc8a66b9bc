"""Every byte a peer loads is verified: a span file built from a model fetched by model_id holds only
bytes whose sha256 the manifest vouches for, global tensors included.

Real libtorrent sessions on 127.0.0.1 (DHT/LSD/UPnP off) move a synthetic llama GGUF whose global
`rope_freqs.weight` lies between blocks 1 and 2 (every span needs it: llama.cpp reads it in every
layer). The fetch plan is the peer's own (`distribute.span_ranges`); 16 KiB pieces, so a tensor the
plan leaves out is not fetched by accident with a neighbouring piece.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
from gguf import GGUFReader

from swarm.artifacts.distribute import span_ranges
from swarm.artifacts.session import ArtifactSession
from swarm.artifacts.torrent import make_torrent
from swarm.ggml_bridge.slicing import build_span
from swarm.manifest import build_manifest
from tests.helpers.synthetic import write_synthetic

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_synthetic("llama", tmp_path_factory.mktemp("synthetic") / "llama.gguf")
    manifest = build_manifest(path)
    torrent = make_torrent(path, manifest, piece_size=16 << 10)
    with ArtifactSession() as seeder:
        seeder.seed(path, torrent.data)
        yield path, manifest, torrent, seeder


@pytest.mark.parametrize("start,end", [(3, 5), (0, 2), (2, 4)])
def test_synthetic_span_from_fetched_model_holds_only_vouched_bytes(model, start, end, tmp_path):
    path, manifest, torrent, seeder = model
    names = [t.name for t in manifest.tensors]
    blk2 = names.index("blk.2.attn_norm.weight")
    assert names[blk2 - 1] == "rope_freqs.weight"  # the global sits between blocks 1 and 2
    with ArtifactSession() as ses:
        result = ses.fetch(torrent.data, manifest, tmp_path / "model.gguf", span_ranges(manifest, start, end),
                           [seeder.address], timeout_s=120, progress=False)
    span = build_span(result.path, start, end, cache_dir=tmp_path / "spans", model_id=manifest.model_id)
    vouched = {t.name: t.sha256 for t in manifest.tensors}
    checked, unverified = 0, []
    for t in GGUFReader(span).tensors:
        data = np.asarray(t.data).tobytes()
        m = _BLOCK.match(t.name)
        source = f"blk.{int(m.group(1)) + start}.{m.group(2)}" if m else t.name
        if source == "token_embd.weight":
            # not a source byte (the model has an output head, and spans take hidden states): a
            # one-row dummy on a non-final span, a zero table of the source's shape on the final one
            assert data == bytes(len(data))
            rows = manifest.n_vocab if end == manifest.n_layers else 1
            assert t.n_elements == manifest.n_embd * rows
            continue
        if hashlib.sha256(data).hexdigest() != vouched[source]:
            unverified.append(source)
        checked += 1
    assert unverified == []
    assert "rope_freqs.weight" in {t.name for t in GGUFReader(span).tensors}
    assert checked == len(GGUFReader(span).tensors) - 1
