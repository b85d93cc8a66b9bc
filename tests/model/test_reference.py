"""The PyTorch reference (dequantized weights, its own process) against llama.cpp's greedy tokens."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from swarm import Client


@pytest.mark.parametrize(
    "fixture, prompt",
    [
        ("smollm2_path", "The three primary colors are"),  # llama: adjacent-pair rotary embedding
        ("qwen_path", "def quicksort(arr):"),  # qwen2: NEOX rotary embedding, q/k/v bias
    ],
)
def test_reference_greedy_tokens_equal_llama_cpp(fixture, prompt, request):
    path = request.getfixturevalue(fixture)
    local = Client(str(path), local=True, n_ctx=256, n_threads=1)
    prompt_ids = local.tokenizer.encode(prompt)
    expected = local.generate(prompt, max_new_tokens=16).tokens
    assert len(expected) == 16
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm.reference",
            "--model",
            str(path),
            "--tokens",
            ",".join(map(str, prompt_ids)),
            "--steps",
            "16",
            "--threads",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["tokens"] == expected


def test_reference_refuses_unimplemented_architecture(gemma_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm.reference",
            "--model",
            str(gemma_path),
            "--tokens",
            "2",
            "--steps",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "does not implement architecture 'gemma3'" in proc.stderr
