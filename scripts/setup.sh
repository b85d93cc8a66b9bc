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
# llama-cpp-python ships only as source: the first install compiles llama.cpp (4-6 min on 2 cores).
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  .venv/bin/python -m pip install --quiet -e ".[test]"
if [ -f scripts/build_csrc.sh ]; then
  bash scripts/build_csrc.sh
fi
.venv/bin/swarm models fetch "${SWARM_DEFAULT_MODEL:-smollm2-135m}" >/dev/null
echo "setup done: .venv/bin/swarm is ready" >&2
