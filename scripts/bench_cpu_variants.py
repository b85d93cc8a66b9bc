"""Each ggml CPU variant on this machine: does it run, how fast, and does it compute the same numbers.

llama.cpp's releases build every x86 variant of the CPU backend (GGML_BACKEND_DL with
GGML_CPU_ALL_VARIANTS) and load the best one the CPU supports at run time; scripts/setup.sh builds
only the variants that compute the same numbers. This script measures why:

  1. builds llama.cpp as llama-cpp-python vendors it, with the project's patches, with all CPU
     variants (the build time answers "would setup stay under 10 minutes?");
  2. for each variant this CPU supports (cpuid flags), in a child process that can load only that
     variant (tests/helpers/cpu_variants.py): a prefill of `--prompt-tokens` tokens and `--decode`
     greedy decode steps as the numeric contract runs them (64-row ubatches, prompt on 2 threads,
     decode on 1); a crash is reported with its signal;
  3. compares every variant's logits (all prompt and decode rows) with the haswell (AVX2) one, and
     groups the variants whose logits agree bit for bit.

    python scripts/bench_cpu_variants.py [--models smollm2-135m,qwen2.5-coder-0.5b] [--build-dir DIR]

Prints one JSON object; nothing here is used by the swarm itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from scripts.bench_swarm import machine  # noqa: E402
from swarm.models import resolve_model  # noqa: E402
from tests.helpers.cpu_variants import cpu_flags, package_with, run_variant  # noqa: E402

LLAMA_CPP_PYTHON = "0.3.36"  # as scripts/setup.sh pins it
# cpuid flags (/proc/cpuinfo) each variant needs, as ggml/src/CMakeLists.txt lists its features
VARIANT_FLAGS = {
    "haswell": {"avx2", "fma", "f16c", "bmi2"},
    "skylakex": {"avx2", "fma", "f16c", "bmi2", "avx512f"},
    "icelake": {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni"},
    "zen4": {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16"},
    "alderlake": {"avx2", "fma", "f16c", "bmi2", "avx_vnni"},
    "sapphirerapids": {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16",
                       "amx_tile", "amx_int8"},
}
REFERENCE = "haswell"


def build(build_dir: Path) -> float:
    """Build llama.cpp with every CPU variant into build_dir/bin; returns the build's seconds
    (0 when an earlier run's build is there)."""
    if (build_dir / "bin" / "libllama.so").exists():
        return 0.0
    src = build_dir / "src"
    src.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    "-d", str(src), f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=True)
    subprocess.run(["tar", "-xzf", str(src / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"), "-C", str(src)],
                   check=True)
    sdist = src / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    (sdist / "vendor/llama.cpp/.git").unlink(missing_ok=True)
    for patch in sorted((ROOT / "patches/llama.cpp").glob("*.patch")):
        subprocess.run(["git", "-C", str(sdist), "apply", "-p1", "--directory=vendor/llama.cpp", str(patch)],
                       check=True)
    start = time.monotonic()
    subprocess.run(["cmake", "-S", str(sdist / "vendor/llama.cpp"), "-B", str(build_dir),
                    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON",
                    "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DLLAMA_CURL=OFF",
                    # as the wheel links them: each library finds the others beside it, so a copy
                    # of the libraries holding one variant loads only that one
                    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build_dir), "-j", str(os.cpu_count()), "--target", "ggml",
                    "llama"], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def compare(rows: dict[str, dict], logits: dict[str, Path]) -> list[list[str]]:
    """Add each variant's difference from the reference to its row; returns the classes of
    variants whose logits agree bit for bit (peers on one class compute alike)."""
    got = {v: np.load(path) for v, path in logits.items()}
    ref = got.get(REFERENCE)
    classes: list[list[str]] = []
    for variant, values in got.items():
        if ref is not None:
            rows[variant]["max_abs_logit_diff_vs_haswell"] = float(np.abs(values - ref).max())
            differs = int((values.argmax(1) != ref.argmax(1)).sum())
            rows[variant]["rows_argmax_differs"] = f"{differs} / {len(ref)}"
        same = next((c for c in classes if np.array_equal(got[c[0]], values)), None)
        if same is None:
            classes.append([variant])
        else:
            same.append(variant)
    return classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--build-dir", type=Path, default=Path(tempfile.gettempdir()) / "swarm-cpu-variants")
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--decode", type=int, default=32)
    args = parser.parse_args()

    build_s = build(args.build_dir)
    flags = cpu_flags()
    variants = [v for v, need in VARIANT_FLAGS.items() if need <= flags]
    report = {"cpu": machine()["cpu"], "build_s": round(build_s, 1), "variants_this_cpu_runs": variants,
              "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        packages = {v: package_with(args.build_dir / "bin", v, work / v) for v in variants}
        for name in args.models.split(","):
            model = resolve_model(name)
            rows, logits = {}, {}
            for variant in variants:
                out = work / f"{variant}-{name}.npy"
                rows[variant] = run_variant(packages[variant], model, args.prompt_tokens, args.decode, out)
                if "crashed" not in rows[variant]:
                    logits[variant] = out
            report["models"][name] = {"variants": rows, "bit_equal_classes": compare(rows, logits)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
