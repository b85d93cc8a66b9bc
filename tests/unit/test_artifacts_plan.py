"""Unit tests for swarm.artifacts.plan: span -> byte ranges -> pieces -> tensors (no I/O)."""

import pytest

from swarm.artifacts.plan import (
    merge_ranges,
    pieces_bytes,
    pieces_for_ranges,
    span_byte_ranges,
    span_tensors,
    tensors_in_pieces,
    tensors_touching_piece,
)
from swarm.errors import ArtifactError
from swarm.manifest import Manifest, TensorInfo


def _manifest(tied: bool) -> Manifest:
    """A 3-layer model: header [0, 100), token_embd, 2 tensors per block, output_norm[, output]."""
    tensors, off = [], 100

    def add(name, n, layer=None):
        nonlocal off
        tensors.append(TensorInfo(name, 0, (n,), off, n, "0" * 64, layer))
        off += n

    add("token_embd.weight", 400)  # [100, 500)
    for i in range(3):
        add(f"blk.{i}.attn_q.weight", 60, i)  # blk0: [500, 560) [560, 600)
        add(f"blk.{i}.ffn_up.weight", 40, i)  # blk1: [600, 700)  blk2: [700, 800)
    add("output_norm.weight", 20)  # [800, 820)
    if not tied:
        add("output.weight", 180)  # [820, 1000)
    return Manifest(
        arch="llama",
        n_layers=3,
        n_embd=8,
        n_vocab=50,
        hparams={},
        tokenizer_sha256="0" * 64,
        header_sha256="0" * 64,
        file_size=off,
        data_offset=100,
        tensors=tuple(tensors),
    )


def test_middle_span_is_header_plus_its_blocks_and_the_globals():
    # output_norm is a global tensor: every span file carries it, so every span fetches it
    m = _manifest(tied=False)
    assert span_byte_ranges(m, 1, 2, need_embd=False, need_head=False) == [(0, 100), (600, 100), (800, 20)]


def test_embd_and_head_are_added_and_adjacent_ranges_merge():
    m = _manifest(tied=False)
    assert span_byte_ranges(m, 0, 1, need_embd=True, need_head=False) == [(0, 600), (800, 20)]
    assert span_byte_ranges(m, 2, 3, need_embd=False, need_head=True) == [(0, 100), (700, 300)]


def test_a_global_tensor_between_blocks_is_fetched_by_every_span():
    m = _manifest(tied=False)
    rope = TensorInfo("rope_freqs.weight", 0, (4,), 1000, 16, "0" * 64, None)  # after output, say
    m = Manifest(**{**m.__dict__, "tensors": m.tensors + (rope,), "file_size": 1016})
    for start, end in ((0, 1), (1, 2), (2, 3)):
        names = [t.name for t in span_tensors(m, start, end, need_embd=False, need_head=end == 3)]
        assert "rope_freqs.weight" in names and "output_norm.weight" in names
        assert "token_embd.weight" not in names
        assert ("output.weight" in names) == (end == 3)


def test_tied_head_fetches_token_embd():
    m = _manifest(tied=True)
    names = [t.name for t in span_tensors(m, 2, 3, need_embd=False, need_head=True)]
    assert names == ["token_embd.weight", "blk.2.attn_q.weight", "blk.2.ffn_up.weight", "output_norm.weight"]


def test_bad_span_and_missing_head_raise():
    m = _manifest(tied=False)
    with pytest.raises(ArtifactError, match="not inside"):
        span_byte_ranges(m, 2, 4, need_embd=False, need_head=False)
    with pytest.raises(ArtifactError, match="not inside"):
        span_byte_ranges(m, 1, 1, need_embd=False, need_head=False)
    kept = tuple(t for t in m.tensors if t.name != "output_norm.weight")
    no_norm = Manifest(**{**m.__dict__, "tensors": kept})
    with pytest.raises(ArtifactError, match="output_norm"):
        span_tensors(no_norm, 2, 3, need_embd=False, need_head=True)


def test_merge_ranges():
    assert merge_ranges([(10, 5), (0, 10), (30, 0), (12, 10), (40, 1)]) == [(0, 22), (40, 1)]
    with pytest.raises(ArtifactError):
        merge_ranges([(-1, 4)])


def test_pieces_for_ranges_covers_partial_pieces_only_once():
    assert pieces_for_ranges([(0, 100), (600, 100)], 64, 1000) == [0, 1, 9, 10]
    assert pieces_for_ranges([(64, 64)], 64, 1000) == [1]
    with pytest.raises(ArtifactError, match="past the file"):
        pieces_for_ranges([(990, 20)], 64, 1000)
    with pytest.raises(ArtifactError, match="piece size"):
        pieces_for_ranges([(0, 1)], 0, 1000)


def test_pieces_bytes_counts_short_last_piece():
    assert pieces_bytes([0, 15, 15], 64, 1000) == 64 + (1000 - 15 * 64)


def test_tensors_in_pieces_needs_every_byte():
    m = _manifest(tied=False)
    # pieces of 64: blk.1 = [600, 700) lies in pieces 9 [576, 640) and 10 [640, 704)
    complete = [t.name for t in tensors_in_pieces(m, [9, 10], 64)]
    assert complete == ["blk.1.attn_q.weight", "blk.1.ffn_up.weight"]
    assert "blk.1.ffn_up.weight" not in [t.name for t in tensors_in_pieces(m, [9], 64)]


def test_tensors_touching_piece_names_header_and_tensors():
    m = _manifest(tied=False)
    assert tensors_touching_piece(m, 1, 64) == ["<header>", "token_embd.weight"]
    assert tensors_touching_piece(m, 9, 64) == ["blk.0.ffn_up.weight", "blk.1.attn_q.weight"]
