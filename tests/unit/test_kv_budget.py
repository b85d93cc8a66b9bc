"""swarm.kv.budget: KV bytes per token against llama.cpp's own sizes for the real models."""

import pytest

from swarm.errors import RequestError
from swarm.kv.budget import kv_bytes_per_token, tokens_that_fit

MiB = 1024 * 1024


def test_qwen_0_5b_matches_llama_cpp_kv_size():
    # qwen2.5 0.5B: 24 layers, 2 KV heads of 64; llama.cpp logs a 384 MiB f16 cache at n_ctx 32768.
    per_token = kv_bytes_per_token(24, 2, 64, 64)
    assert per_token == 12_288
    assert per_token * 32_768 == 384 * MiB


def test_span_scales_with_layers_and_elem_size():
    # SmolLM2: 3 KV heads of 64 -> 768 B per layer per token in f16; a [0, 10) span holds 10 of them.
    assert kv_bytes_per_token(10, 3, 64, 64) == 7_680
    assert kv_bytes_per_token(30, 3, 64, 64) * 4096 == 90 * MiB  # llama.cpp: 90.00 MiB at n_ctx 4096
    assert kv_bytes_per_token(30, 3, 64, 64, bytes_per_elem=4) == 46_080
    # gemma3 270M: 1 KV head, k and v of 256 (counted as full-context layers: conservative).
    assert kv_bytes_per_token(18, 1, 256, 256) * 4096 == (12 + 60) * MiB  # llama.cpp: non-SWA + SWA


def test_different_k_and_v_head_sizes():
    assert kv_bytes_per_token(2, 4, 192, 128) == 2 * 4 * 320 * 2


def test_tokens_that_fit_rounds_down():
    assert tokens_that_fit(384 * MiB, 12_288) == 32_768
    assert tokens_that_fit(384 * MiB - 1, 12_288) == 32_767
    assert tokens_that_fit(0, 12_288) == 0


@pytest.mark.parametrize(
    "args",
    [
        (0, 2, 64, 64),
        (24, 0, 64, 64),
        (24, 2, -1, 64),
        (24, 2, 64, 64, 0),
        (24, 2.0, 64, 64),
        (True, 2, 64, 64),
    ],
)
def test_bad_hyperparameters_raise(args):
    with pytest.raises(RequestError):
        kv_bytes_per_token(*args)


@pytest.mark.parametrize("args", [(-1, 10), (10, 0), (10.5, 10), (10, None)])
def test_bad_budget_raises(args):
    with pytest.raises(RequestError):
        tokens_that_fit(*args)
