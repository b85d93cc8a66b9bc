"""The `swarm` command line: argument parsing and output only; the work lives in the packages.

Every `SwarmError` becomes one line on stderr and exit status 1; argument errors exit 2.

Files (one per command; each has `register(sub)`, which adds its parser and sets its handler):
    __init__.py  `main` (the console script) and the parser wiring, in `swarm --help` order
    __main__.py  `python -m swarm.cli`
    args.py      shared argument types (`A:B` layers, sizes, positive ints) and the peer network options
    models.py    `swarm models list|fetch|info`
    chat.py      `swarm chat`: one-shot or a REPL, on the swarm or --local; `print_stream`
    serve.py     `swarm serve`: a span peer
    dht.py       `swarm dht`: a DHT-only peer
    publish.py   `swarm publish`: seed a model file and publish its manifest
    demo.py      `swarm demo`: a local swarm answers one prompt
    status.py    `swarm status`: who serves what, is there a route (`NO_ROUTE_EXIT`)
    api.py       `swarm api`: the OpenAI-compatible HTTP API
    testclock.py a test hook: a skewed wall clock for one process (SWARM_TEST_CLOCK_SKEW_FILE only)

Command modules import their packages inside the handler, so `swarm --help` loads neither llama.cpp
nor hivemind, and `main` sets the environment they read first.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

from swarm.cli import api, chat, demo, dht, models, publish, serve, status, testclock
from swarm.errors import SwarmError

COMMANDS = (models, chat, serve, dht, publish, demo, status, api)
"""Command modules in the order `swarm --help` lists them."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `swarm` console script. Returns the process exit status."""
    testclock.install_from_env()  # a test hook; before any command imports hivemind
    # Read by libgomp when it loads, so set before any command imports llama.cpp: spinning OpenMP
    # threads of one peer starve co-located peers' compute (shared NOTES: 0.47x vs 0.81-0.87x).
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")
    if isinstance(sys.stdout, io.TextIOWrapper):
        # A path that is not UTF-8 (argv decodes its bytes to surrogates) prints back as its bytes.
        sys.stdout.reconfigure(errors="surrogateescape")
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args) or 0
    except SwarmError as e:
        print(f"swarm: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="swarm", description="Serve and use GGUF language models split across peers."
    )
    sub = p.add_subparsers(metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return p
