"""The CPU variants setup builds keep one numeric contract across x86 peers.

scripts/setup.sh builds ggml's CPU backend as run-time variants (GGML_BACKEND_DL), only haswell
(AVX2) and alderlake (AVX2 + AVX-VNNI), and ggml loads the best one the CPU supports from the
package's own lib directory (patches/llama.cpp/0003). A peer on a CPU with AVX-VNNI and one without
must compute the same logits bit for bit, or failover replay and the last hop's token checks
(README "When peers lie") would differ between machines; the AVX-512 variants, which compute other
numbers, are not built (docs/benchmarks.md "CPU variants").
"""

from __future__ import annotations

import platform
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from tests.helpers.cpu_variants import cpu_flags, loaded_variant, package_with, run_variant

BUILT = ("haswell", "alderlake")  # as scripts/setup.sh's GGML_CPU_VARIANTS
PROMPT_TOKENS = 300  # past 256 cached tokens, where decode's attention view grows to 512 cells
DECODE = 8

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the CPU variants are x86's")


def test_the_best_built_variant_is_loaded(smollm2_path):
    llama_cpp.llama_backend_init()
    want = "alderlake" if "avx_vnni" in cpu_flags() else "haswell"
    assert loaded_variant() == want


def test_built_variants_compute_the_same_logits(smollm2_path, tmp_path):
    if "avx_vnni" not in cpu_flags():
        pytest.skip("this CPU lacks AVX-VNNI: only the haswell variant can run here")
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    logits = {}
    for variant in BUILT:
        pythonpath = package_with(lib_dir, variant, tmp_path / variant)
        out = tmp_path / f"{variant}.npy"
        ran = run_variant(pythonpath, smollm2_path, PROMPT_TOKENS, DECODE, out)
        assert ran.get("variant") == variant, ran
        logits[variant] = np.load(out)
    assert logits["haswell"].shape[0] == PROMPT_TOKENS + DECODE
    np.testing.assert_array_equal(logits["alderlake"], logits["haswell"])
