"""The PyTorch reference (dequantized float32 weights, its own process) against llama.cpp.

llama.cpp multiplies quantized weights with 8-bit-quantized activations, the reference in float32,
so logits differ by a few tenths (shared NOTES: ~0.4); greedy tokens agree except where llama.cpp's
own top two candidates are closer than that.
"""

from __future__ import annotations

import json
import subprocess
import sys

import llama_cpp
import numpy as np

from swarm import Client

NEAR_TIE = 0.5
"""Logit margin under which the reference may pick the runner-up (its known error, see above)."""


def reference(path, prompt_ids: list[int], *extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "swarm.reference", "--model", str(path), "--tokens",
         ",".join(map(str, prompt_ids)), "--threads", "2", *extra],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_qwen_reference_greedy_tokens_equal_llama_cpp(qwen_path):
    """Free-running: 16 greedy steps of the reference equal llama.cpp's (qwen2: NEOX rotary, q/k/v bias)."""
    local = Client(str(qwen_path), local=True, n_ctx=256, n_threads=1)
    prompt_ids = local.tokenizer.encode("def quicksort(arr):")
    expected = local.generate("def quicksort(arr):", max_new_tokens=16).tokens
    assert len(expected) == 16
    assert reference(qwen_path, prompt_ids, "--steps", "16")["tokens"] == expected


def test_smollm2_reference_logits_track_llama_cpp(smollm2_path):
    """Teacher-forced on llama.cpp's greedy continuation (llama: adjacent-pair rotary, tied head)."""
    llm = llama_cpp.Llama(model_path=str(smollm2_path), n_ctx=256, n_threads=2, logits_all=True,
                          flash_attn=True, verbose=False)
    prompt_ids = llm.tokenize(b"The three primary colors are", add_bos=True, special=True)
    llm.eval(prompt_ids)
    continuation = []
    for _ in range(16):
        continuation.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([continuation[-1]])
    ours = np.asarray(llm.scores[len(prompt_ids) - 1: len(prompt_ids) + 15])
    ref = np.asarray(reference(smollm2_path, prompt_ids, "--teacher", ",".join(map(str, continuation)))["logits"])
    assert ref.shape == ours.shape
    assert np.abs(ref - ours).max() < 1.5
    for step, (r, o) in enumerate(zip(ref, ours)):
        pick = int(np.argmax(r))
        assert pick == continuation[step] or o[continuation[step]] - o[pick] < NEAR_TIE, step


def test_reference_refuses_unimplemented_architecture(gemma_path):
    proc = subprocess.run([sys.executable, "-m", "swarm.reference", "--model", str(gemma_path), "--tokens", "2",
                           "--steps", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "does not implement architecture 'gemma3'" in proc.stderr
    assert "Traceback" not in proc.stderr
