"""`python -m swarm.cli ARGS`: the `swarm` command without the console script (tests, benchmarks)."""

import sys

from swarm.cli import main

sys.exit(main())
