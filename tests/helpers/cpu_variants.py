"""Running llama.cpp on one chosen ggml CPU variant, in a child process.

Setup builds the CPU backend as run-time variants (GGML_BACKEND_DL; scripts/setup.sh) and ggml loads
the best one the CPU supports from the directory of libggml (patches/llama.cpp/0003). To run a
given variant, a copy of the llama_cpp package is made whose lib directory holds only that one, and
a child process imports that copy. Used by tests/model/test_cpu_variants.py (the variants setup
builds compute the same logits) and scripts/bench_cpu_variants.py (every variant llama.cpp has).

Child: python -m tests.helpers.cpu_variants MODEL PROMPT_TOKENS DECODE_STEPS OUT.npy
prints one JSON line (prefill_ms, decode_tokens_per_s, the variant loaded, ggml's CPU features)
and saves the logits of every row, `[PROMPT_TOKENS + DECODE_STEPS, n_vocab]` float32, to OUT.npy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPT_TEXT = ROOT / "tests" / "data" / "contract_prompt.txt"
VARIANT_LIB = re.compile(r"libggml-cpu-([\w.]+)\.so")


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo's names: avx2, avx_vnni, avx512f, ...)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def loaded_variant() -> str | None:
    """The ggml CPU variant this process has loaded (its library's name in /proc/self/maps), or
    None when the CPU backend is built in (a build without GGML_BACKEND_DL) or not loaded."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        found = VARIANT_LIB.search(line)
        if found:
            return found.group(1)
    return None


def package_with(lib_dir: Path, variant: str, into: Path) -> Path:
    """A copy of the installed llama_cpp package under `into` whose libraries are those of
    `lib_dir` with only one CPU variant, `variant`; returns the directory to put on PYTHONPATH."""
    import llama_cpp

    pkg = into / "llama_cpp"
    shutil.copytree(Path(llama_cpp.__file__).parent, pkg, ignore=shutil.ignore_patterns("lib"))
    (pkg / "lib").mkdir()
    for lib in lib_dir.glob("lib*.so*"):
        if VARIANT_LIB.fullmatch(lib.name) and lib.name != f"libggml-cpu-{variant}.so":
            continue
        shutil.copy2(lib, pkg / "lib" / lib.name, follow_symlinks=False)
    return into


def run_variant(pythonpath: Path, model: Path, prompt_tokens: int, decode: int, out: Path) -> dict:
    """Run the child on the package copy at `pythonpath`; returns its JSON, or {"crashed": why}."""
    env = dict(os.environ, PYTHONPATH=f"{pythonpath}{os.pathsep}{ROOT}")
    child = [sys.executable, "-m", "tests.helpers.cpu_variants", str(model), str(prompt_tokens), str(decode)]
    proc = subprocess.run([*child, str(out)], cwd=pythonpath, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        why = signal.Signals(-proc.returncode).name if proc.returncode < 0 else f"exit {proc.returncode}"
        return {"crashed": why, "stderr_tail": proc.stderr[-300:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child(model: str, prompt_tokens: int, decode: int, out: str) -> None:
    """The numeric contract's run (swarm/numeric.py): 64-row ubatches, prompt on 2 threads, each
    greedy decode step on 1."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model, n_ctx=2048, n_threads=1, n_threads_batch=2, n_batch=64, n_ubatch=64,
                          flash_attn=True, logits_all=True, verbose=False)
    tokens = llm.tokenize(PROMPT_TEXT.read_bytes())[:prompt_tokens]
    start = time.perf_counter()
    llm.eval(tokens)
    prefill_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    for _ in range(decode):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    decode_tps = decode / (time.perf_counter() - start)
    np.save(out, np.asarray(llm.scores[: llm.n_tokens], dtype=np.float32))
    print(json.dumps({"prefill_ms": round(prefill_ms, 1), "decode_tokens_per_s": round(decode_tps, 1),
                      "variant": loaded_variant(),
                      "system_info": llama_cpp.llama_print_system_info().decode().strip()}))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
