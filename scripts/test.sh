#!/usr/bin/env bash
# The test command of README.md: the whole suite (unit, parity, integration, simulator).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
