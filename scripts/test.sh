#!/usr/bin/env bash
# The test command of README.md, in three tiers; each runs the tiers before it too:
#   scripts/test.sh quick   unit + simulator: no model, no peers (`-m quick`)
#   scripts/test.sh model   + models in-process: tests/model and tests/parity (`-m "not peers"`)
#   scripts/test.sh [all]   + real peers on 127.0.0.1: tests/integration; the default, what CI runs
# The markers come from tests/helpers/markers.py. Further arguments go to pytest
# (scripts/test.sh model -x -k chain); test paths among them (scripts/test.sh all tests/unit/x.py)
# run instead of the whole tests/ tree. The 25 slowest test phases are printed before pytest's summary
# line, the wall time after it.
# Test files run on SWARM_TEST_WORKERS pytest-xdist workers (default 2; 0 runs them in this process):
# most of a peer test's time is spent waiting (DHT joins, dials, expiries), so two files at once
# keep two cores busy. A file stays on one worker (--dist loadfile): its module fixtures' peers
# serve only its own tests; session fixtures (smol_swarm, the span cache) are one per worker.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
tier=all
case "${1:-}" in quick | model | all) tier=$1 && shift ;; esac
case $tier in
quick) select=(-m quick) ;;
model) select=(-m "not peers") ;;
all) select=() ;;
esac
# tests/ only when no test path is given: pytest would run a named file and then the whole tree
paths=(tests)
for arg in "$@"; do
  case $arg in tests/* | ./tests/*) paths=() ;; esac
done
workers=${SWARM_TEST_WORKERS:-2}
parallel=()
[ "$workers" -gt 0 ] && parallel=(-n "$workers" --dist loadfile)
start=$SECONDS
rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 ${parallel[@]+"${parallel[@]}"} ${select[@]+"${select[@]}"} "$@" ${paths[@]+"${paths[@]}"} || rc=$?
took=$((SECONDS - start))
echo "scripts/test.sh $tier: wall time $((took / 60)) min $((took % 60)) s"
exit $rc
