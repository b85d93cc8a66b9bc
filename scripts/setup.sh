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
# Build it portable, not -march=native: on CPUs with AMX (Sapphire Rapids and later) a native build
# runs ggml's AMX matmul kernels, which crash with SIGSEGV on this machine kind on any prompt past a
# few dozen tokens. The wheel is kept in our own cache, keyed by its flags: pip's own wheel cache
# would hand back a native wheel built earlier from the same sdist.
LLAMA_CPP_PYTHON=0.3.36
if [ "$(uname -m)" = x86_64 ]; then
  LLAMA_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  FLAVOUR=avx2
else
  LLAMA_FLAGS=""
  FLAVOUR=native
fi
# The llama.cpp it vendors gets the project's patches first (patches/llama.cpp, applied in name
# order; what they add: docs/layer-range.md); the wheel is keyed by their hash too.
PATCHES=$(ls patches/llama.cpp/*.patch)
PATCH_HASH=$(cat $PATCHES | sha256sum | cut -c1-12)
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
