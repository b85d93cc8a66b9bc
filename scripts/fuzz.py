"""Run the parser fuzz targets of tests/unit/test_fuzz_parsers.py longer, with fresh randomness.

    .venv/bin/python scripts/fuzz.py --examples 20000            # every target
    .venv/bin/python scripts/fuzz.py --examples 5000 --target gguf --target wire

Prints one JSON object per target ({"target", "examples", "ok", "seconds", "failure"}) and exits 1
if any target broke its contract; hypothesis prints the falsifying input above it. Keep such an
input as an `examples=` entry of its target once the parser is fixed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_targets():
    sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location(
        "test_fuzz_parsers", ROOT / "tests/unit/test_fuzz_parsers.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000, help="examples per target (default 2000)")
    ap.add_argument("--target", action="append", default=[], help="run only this target (repeatable)")
    args = ap.parse_args(argv)
    fuzz = _load_targets()
    names = {t.name for t in fuzz.TARGETS}
    unknown = set(args.target) - names
    if unknown:
        ap.error(f"unknown target(s) {sorted(unknown)}; known: {sorted(names)}")
    failed = False
    for target in fuzz.TARGETS:
        if args.target and target.name not in args.target:
            continue
        test = fuzz.build_test(target, args.examples, derandomize=False)
        t0 = time.perf_counter()
        failure = None
        try:
            test()
        except Exception as e:  # noqa: BLE001 - report every target, then exit non-zero
            traceback.print_exception(e, file=sys.stderr)  # with hypothesis's falsifying example
            failure = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            failed = True
        print(
            json.dumps(
                {
                    "target": target.name,
                    "examples": args.examples,
                    "ok": failure is None,
                    "seconds": round(time.perf_counter() - t0, 1),
                    "failure": failure,
                }
            ),
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
