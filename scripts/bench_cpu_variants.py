"""Each ggml CPU variant on this machine: does it run, how fast, and does it compute the same numbers.

llama.cpp's releases build every x86 variant of the CPU backend (GGML_BACKEND_DL with
GGML_CPU_ALL_VARIANTS) and load the best one the CPU supports at run time; scripts/setup.sh builds
one portable AVX2 backend instead. This script measures what that choice costs and buys:

  1. builds llama.cpp as llama-cpp-python vendors it, with the project's patches, with all CPU
     variants (the build time answers "would setup stay under 10 minutes?");
  2. for each variant this CPU supports (cpuid flags), in a child process that can load only that
     variant: a prefill of `--prompt-tokens` tokens in 64-row ubatches (the swarm's grid) and
     `--decode` greedy decode steps (as the numeric contract runs them: prefill on 2 threads,
     decode on 1); a crash is reported with its signal;
  3. compares every variant's logits (all prompt and decode rows) with the haswell (AVX2) variant,
     which is what setup's portable build computes: max |logit difference| and the rows whose
     argmax differs.

    python scripts/bench_cpu_variants.py [--models smollm2-135m,qwen2.5-coder-0.5b] [--build-dir DIR]

Prints one JSON object; nothing here is used by the swarm itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CPP_PYTHON = "0.3.36"  # as scripts/setup.sh pins it
# cpuid flags (/proc/cpuinfo) each variant needs, as ggml/src/CMakeLists.txt lists its features
VARIANT_FLAGS = {
    "haswell": {"avx2", "fma", "f16c", "bmi2"},
    "skylakex": {"avx2", "fma", "f16c", "bmi2", "avx512f"},
    "icelake": {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni"},
    "zen4": {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16"},
    "alderlake": {"avx2", "fma", "f16c", "bmi2", "avx_vnni"},
    "sapphirerapids": {
        "avx2",
        "fma",
        "f16c",
        "bmi2",
        "avx512f",
        "avx512vbmi",
        "avx512_vnni",
        "avx512_bf16",
        "amx_tile",
        "amx_int8",
    },
}
REFERENCE = "haswell"


def cpu_flags() -> set[str]:
    """This CPU's feature flags from /proc/cpuinfo."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def build(build_dir: Path) -> float:
    """Build llama.cpp with every CPU variant into build_dir/bin; returns the build's seconds
    (0 when an earlier run's build is there)."""
    if (build_dir / "bin" / "libllama.so").exists():
        return 0.0
    src = build_dir / "src"
    src.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(src),
            f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
        ],
        check=True,
    )
    subprocess.run(
        ["tar", "-xzf", str(src / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"), "-C", str(src)], check=True
    )
    sdist = src / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    (sdist / "vendor/llama.cpp/.git").unlink(missing_ok=True)
    for patch in sorted((ROOT / "patches/llama.cpp").glob("*.patch")):
        subprocess.run(
            ["git", "-C", str(sdist), "apply", "-p1", "--directory=vendor/llama.cpp", str(patch)], check=True
        )
    start = time.monotonic()
    subprocess.run(
        [
            "cmake",
            "-S",
            str(sdist / "vendor/llama.cpp"),
            "-B",
            str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=ON",
            "-DGGML_BACKEND_DL=ON",
            "-DGGML_CPU_ALL_VARIANTS=ON",
            "-DGGML_NATIVE=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_TOOLS=OFF",
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_CURL=OFF",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        ["cmake", "--build", str(build_dir), "-j", str(os.cpu_count()), "--target", "ggml", "llama"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.monotonic() - start


def package_with(build_dir: Path, into: Path) -> None:
    """A copy of the installed llama_cpp package whose libraries are the variant build's."""
    import llama_cpp

    pkg = into / "llama_cpp"
    shutil.copytree(Path(llama_cpp.__file__).parent, pkg)
    for lib in (pkg / "lib").iterdir():
        lib.unlink()
    for lib in (build_dir / "bin").glob("lib*.so*"):
        if not lib.name.startswith("libggml-cpu-"):
            shutil.copy2(lib, pkg / "lib" / lib.name, follow_symlinks=False)


def child(model: str, prompt_tokens: int, decode: int, out: str) -> None:
    """Run in a process that finds one CPU variant (its working directory holds only that one)."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(
        model,
        n_ctx=2048,
        n_threads=1,
        n_threads_batch=2,
        n_batch=64,
        n_ubatch=64,
        logits_all=True,
        verbose=False,
    )
    tokens = llm.tokenize((ROOT / "docs/architecture.md").read_bytes())[:prompt_tokens]
    start = time.perf_counter()
    llm.eval(tokens)
    prefill_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    for _ in range(decode):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    decode_tps = decode / (time.perf_counter() - start)
    np.save(out, np.asarray(llm.scores[: llm.n_tokens], dtype=np.float32))
    print(
        json.dumps(
            {
                "prefill_ms": round(prefill_ms, 1),
                "decode_tokens_per_s": round(decode_tps, 1),
                "system_info": llama_cpp.llama_print_system_info().decode().strip(),
            }
        )
    )


def measure(build_dir: Path, pkg_dir: Path, variant: str, model: str, args, work: Path) -> dict:
    """One variant on one model, in its own process; logits saved under work."""
    here = work / variant
    here.mkdir(exist_ok=True)
    shutil.copy2(build_dir / "bin" / f"libggml-cpu-{variant}.so", here)
    out = work / f"{variant}-{Path(model).stem}.npy"
    env = dict(os.environ, PYTHONPATH=str(pkg_dir))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", model, str(args.prompt_tokens), str(args.decode), str(out)],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        why = signal.Signals(-proc.returncode).name if proc.returncode < 0 else f"exit {proc.returncode}"
        return {"crashed": why, "stderr_tail": proc.stderr[-300:]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "logits": str(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--build-dir", type=Path, default=Path(tempfile.gettempdir()) / "swarm-cpu-variants")
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument(
        "--child", nargs=4, metavar=("MODEL", "PROMPT", "DECODE", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        model, prompt, decode, out = args.child
        return child(model, int(prompt), int(decode), out)

    import numpy as np

    sys.path.insert(0, str(ROOT))
    from scripts.bench_swarm import machine
    from swarm.models import resolve_model

    build_s = build(args.build_dir)
    flags = cpu_flags()
    variants = [v for v, need in VARIANT_FLAGS.items() if need <= flags]
    report = {
        "cpu": machine()["cpu"],
        "build_s": round(build_s, 1),
        "variants_this_cpu_runs": variants,
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        package_with(args.build_dir, work / "pkg")
        for name in args.models.split(","):
            model = str(resolve_model(name))
            rows = {v: measure(args.build_dir, work / "pkg", v, model, args, work) for v in variants}
            ref = np.load(rows[REFERENCE]["logits"]) if "logits" in rows.get(REFERENCE, {}) else None
            for row in rows.values():
                if ref is not None and "logits" in row:
                    got = np.load(row["logits"])
                    row["max_abs_logit_diff_vs_haswell"] = float(np.abs(got - ref).max())
                    row["rows_argmax_differs"] = f"{int((got.argmax(1) != ref.argmax(1)).sum())} / {len(ref)}"
                row.pop("logits", None)
            report["models"][name] = rows
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
