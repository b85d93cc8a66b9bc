"""Lines per module, flagging modules over the soft cap of house style (~400 lines); prints, never fails."""

from __future__ import annotations

import sys
from pathlib import Path

SOFT_CAP_LINES = 400


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    rows = []
    for path in sorted([*root.glob("swarm/**/*.py"), *root.glob("sim/**/*.py"), *root.glob("csrc/*.[ch]")]):
        n = sum(1 for _ in path.open(encoding="utf-8"))
        rows.append((n, path.relative_to(root)))
    for n, rel in sorted(rows, reverse=True):
        flag = "  <-- over the soft cap" if n > SOFT_CAP_LINES else ""
        print(f"{n:6d}  {rel}{flag}")
    print(f"{sum(n for n, _ in rows):6d}  total in {len(rows)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
