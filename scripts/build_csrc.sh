#!/usr/bin/env bash
# Build csrc/swarm_span.c into swarm/ggml_bridge/libswarm_span.so against the llama.cpp that
# llama-cpp-python installed (its headers in site-packages/include, its libraries in
# site-packages/llama_cpp/lib), with an rpath so the process loads one llama.cpp/ggml; and the
# test-only csrc/mtp_oracle.c (whole-model MTP reference) into tests/helpers/libswarm_mtp_oracle.so.
# Usage: scripts/build_csrc.sh [python]   (default: .venv/bin/python, else python3)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${1:-}"
if [[ -z "$py" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then py="$root/.venv/bin/python"; else py="python3"; fi
fi
site="$("$py" - <<'PY'
import os, llama_cpp
print(os.path.dirname(os.path.dirname(os.path.abspath(llama_cpp.__file__))))
PY
)"
inc="$site/include"
lib="$site/llama_cpp/lib"
for f in "$inc/llama.h" "$inc/ggml.h" "$lib/libllama.so" "$lib/libggml-base.so"; do
    [[ -e "$f" ]] || { echo "build_csrc: missing $f (is llama-cpp-python installed?)" >&2; exit 1; }
done
out="$root/swarm/ggml_bridge/libswarm_span.so"
tmp="$out.tmp.$$"
${CC:-gcc} -O2 -std=c11 -Wall -Wextra -Werror -shared -fPIC \
    -I"$inc" "$root/csrc/swarm_span.c" -o "$tmp" \
    -L"$lib" -lllama -lggml-base -lggml -Wl,-rpath,"$lib"
mv -f "$tmp" "$out"
echo "$out"
oracle="$root/tests/helpers/libswarm_mtp_oracle.so"
tmp="$oracle.tmp.$$"
${CC:-gcc} -O2 -std=c11 -Wall -Wextra -Werror -shared -fPIC \
    -I"$inc" "$root/csrc/mtp_oracle.c" -o "$tmp" \
    -L"$lib" -lllama -lggml-base -lggml -Wl,-rpath,"$lib"
mv -f "$tmp" "$oracle"
echo "$oracle"
