#!/usr/bin/env bash
# One setup for users and CI: a virtual environment with swarm and everything it needs, the C
# executor library built against llama-cpp-python's llama.cpp, and the default model fetched and
# verified. Safe to rerun; later runs reuse what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip wheel setuptools
# torch first and pinned: hivemind needs it, and an unpinned one is a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
# llama-cpp-python ships only as source: the first build compiles llama.cpp (4-6 min on 2 cores).
# On x86 the CPU backend is built as run-time variants (GGML_BACKEND_DL, as llama.cpp's releases do),
# but only the two that compute the same numbers: haswell (AVX2) and alderlake (AVX2 with AVX-VNNI,
# whose integer dot products are exact either way; 1.09-1.23x faster prefill), and each machine loads
# the best it can run. Every x86 peer so keeps one numeric contract (README "The numeric contract"):
# the AVX-512 variants compute other logits (up to 1.9 apart) and the AMX one (sapphirerapids) dies of
# SIGILL at its first tile instruction on this machine kind; measured by scripts/bench_cpu_variants.py
# (docs/benchmarks.md "CPU variants"). A CPU without AVX2 loads no CPU backend and cannot serve.
# The wheel is kept in our own cache, keyed by its flags: pip's own wheel cache would hand back a
# native wheel built earlier from the same sdist.
LLAMA_CPP_PYTHON=0.3.36
if [ "$(uname -m)" = x86_64 ]; then
  LLAMA_FLAGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_CPU_VARIANTS=haswell;alderlake"
  FLAVOUR=x86-avx2-variants
else
  LLAMA_FLAGS=""
  FLAVOUR=native
fi
# The llama.cpp it vendors gets the project's patches first (patches/llama.cpp, applied in name
# order; what they add: docs/layer-range.md), and llama-cpp-python's own build its patches
# (patches/llama-cpp-python); the wheel is keyed by their hash too.
PATCHES=$(ls patches/llama.cpp/*.patch)
PACKAGE_PATCHES=$(ls patches/llama-cpp-python/*.patch)
PATCH_HASH=$(cat $PATCHES $PACKAGE_PATCHES | sha256sum | cut -c1-12)
FLAVOUR="$FLAVOUR-$PATCH_HASH"
WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/swarm/wheels/llama-cpp-python-$LLAMA_CPP_PYTHON-$FLAVOUR"
if [ "$(cat .venv/.llama-flavour 2>/dev/null)" != "$LLAMA_CPP_PYTHON-$FLAVOUR" ]; then
  if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $LLAMA_CPP_PYTHON ($FLAVOUR): 4-6 minutes on 2 cores" >&2
    SRC=$(mktemp -d)
    trap 'rm -rf "$SRC"' EXIT
    .venv/bin/python -m pip download --quiet --no-deps --no-binary :all: -d "$SRC" \
      "llama-cpp-python==$LLAMA_CPP_PYTHON"
    tar -xzf "$SRC"/llama_cpp_python-"$LLAMA_CPP_PYTHON".tar.gz -C "$SRC"
    SDIST="$SRC/llama_cpp_python-$LLAMA_CPP_PYTHON"
    # from the sdist's root (it ships a .git of its own, where git apply skips paths outside the
    # working directory); vendor/llama.cpp/.git is a submodule link to nothing
    rm -f "$SDIST/vendor/llama.cpp/.git"
    for p in $PATCHES; do
      git -C "$SDIST" apply -p1 --directory=vendor/llama.cpp "$PWD/$p"
    done
    for p in $PACKAGE_PATCHES; do
      git -C "$SDIST" apply -p1 "$PWD/$p"
    done
    CMAKE_ARGS="$LLAMA_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
      .venv/bin/python -m pip wheel --quiet --no-deps --no-cache-dir -w "$WHEELS.tmp" "$SDIST"
    mv "$WHEELS.tmp" "$WHEELS"
  fi
  .venv/bin/python -m pip install --quiet --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl
  echo "$LLAMA_CPP_PYTHON-$FLAVOUR" > .venv/.llama-flavour
fi
.venv/bin/python -m pip install --quiet -e ".[test]"
if [ -f scripts/build_csrc.sh ]; then
  bash scripts/build_csrc.sh
fi
.venv/bin/swarm models fetch "${SWARM_DEFAULT_MODEL:-smollm2-135m}" >/dev/null
echo "setup done: .venv/bin/swarm is ready" >&2
