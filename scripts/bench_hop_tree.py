"""Whole model vs a 3-peer loopback swarm at 1 thread per peer, for the source tree on PYTHONPATH.

The 1-thread part of `bench_swarm.py`, so that two trees (e.g. a `git archive` of an older commit
with its own `scripts/build_csrc.sh` build, and the working tree) can be measured side by side, one
after the other, with the same prompt and steps. Prints one JSON object: the whole model's and the
swarm's decode tokens/s, their ratio, and the swarm's per-hop overhead.

    PYTHONPATH=/tmp/old  .venv/bin/python scripts/bench_hop_tree.py qwen2.5-coder-0.5b
    PYTHONPATH=$PWD      .venv/bin/python scripts/bench_hop_tree.py qwen2.5-coder-0.5b
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

tree = Path(os.environ.get("PYTHONPATH", "").split(":")[0] or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(tree / "scripts"))

import bench_swarm as bs  # noqa: E402 - from the tree under test
import llama_cpp  # noqa: E402

import swarm  # noqa: E402
from swarm.manifest import build_manifest  # noqa: E402
from swarm.models import resolve_model  # noqa: E402


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b"
    decode = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    path = resolve_model(model)
    n_layers = build_manifest(path).n_layers
    tok = llama_cpp.Llama(model_path=str(path), n_ctx=256, vocab_only=True, verbose=False)
    prompt = bs.make_prompt(tok, 128)
    del tok
    out = {"tree": str(tree), "swarm_pkg": swarm.__file__, "model": model}
    out["whole_1"] = bs.bench_whole(path, prompt, decode, 1, 2)
    with tempfile.TemporaryDirectory(prefix="bench-hop-") as tmp:
        ps = bs.start_swarm(Path(tmp), path, n_layers, 1, None)
        try:
            out["swarm_1"] = bs.bench_swarm(path, prompt, decode, ps, 2)
        finally:
            ps.stop_all()
    out["ratio"] = round(out["swarm_1"]["decode_tok_s"] / out["whole_1"]["decode_tok_s"], 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
