"""Speculative decoding over the route: decode tokens/s with and without it, acceptance rate, tokens
per verify pass and passes in flight, per task, at each round-trip time.

Tasks (greedy; the text with speculation must equal the text without, and the script checks it):
  copy:  a code file and the start of its copy (a plain prompt): prompt-lookup drafts find most
         tokens in the prompt where the model copies (Qwen does; SmolLM2-135M explains the code);
  edit:  a chat request, in the model's chat template, to print a given code file again with a
         comment added at its top: the answer copies the file (both models; asked to rename a class
         instead, Qwen 0.5B rewrites more than it copies, SmolLM2 copies it unchanged);
  novel: free prose, where prompt lookup finds little and a draft model must guess.
Drafts (`--drafts`): `lookup` (prompt lookup), `self` (the model requantized to Q3_K_M and run in the
client process, swarm/client/draftmodel.py; `self:TYPE` for another type), or a draft GGUF's path;
one client per draft, with its own plain rows. Each (draft, task, k) runs `--repeats` times after a
warm-up, with k fixed and adaptive (swarm/spec/policy.py: 0..k per pass as measured, 0 being plain
decoding), each with one verify pass in flight and pipelined (`--pipeline off on`: up to two in
flight, the next pass sent before the last one is back where it is likely to be used;
`Speculation.pipeline`). The repeats go round plain and every mode in turn; figures are medians.
`passes_in_flight` is the most passes in flight (1 or 2); `ahead_used` / `ahead_sent` count the
passes sent ahead that were used. `speedup` is the ratio of the medians; `speedup_paired` the median
of each repeat's ratio to the plain run of the same repeat, which a drift of the machine's speed
between repeats moves less.

RTT modes: `--rtt 0` (the default) runs a loopback swarm on 127.0.0.1 (three `swarm serve` processes
of the model's thirds, 1 thread each) and the client in this process. Any other RTT runs in the
network lab (sim/netlab.py, needs root): the swarm of scripts/bench_wan.py (`direct`: three public
peers and a DHT peer), the client behind a NAT router, every two sites RTT apart.

    flock /tmp/swarm-heavy.lock .venv/bin/python scripts/bench_spec.py [--model smollm2-135m] \
        [--rtt 0 20 50] [--k 4] [--decode 64] [--repeats 2] [--drafts lookup self] [--tasks copy novel] \
        [--pipeline off on]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarm.manifest import build_manifest  # noqa: E402 - the repo root is on sys.path now
from swarm.models import resolve_model  # noqa: E402
from tests.helpers.oracle import PROMPT as CODE  # noqa: E402
from tests.helpers.peers import PeerSet, serve_args  # noqa: E402

CLIENT_S = 1800.0
EDIT_FILE = (
    "class Stack:\n"
    '    """A last-in, first-out container backed by a Python list."""\n\n'
    "    def __init__(self):\n"
    "        self.items = []\n\n"
    "    def push(self, item):\n"
    '        """Put item on top of the stack."""\n'
    "        self.items.append(item)\n\n"
    "    def pop(self):\n"
    '        """Remove and return the item on top; raise IndexError when empty."""\n'
    "        if not self.items:\n"
    '            raise IndexError("pop from an empty stack")\n'
    "        return self.items.pop()\n\n"
    "    def peek(self):\n"
    '        """Return the item on top without removing it."""\n'
    "        return self.items[-1]\n\n"
    "    def __len__(self):\n"
    "        return len(self.items)\n\n\n"
    "def reverse(words):\n"
    '    """Return the words in reverse order, using a Stack."""\n'
    "    stack = Stack()\n"
    "    for word in words:\n"
    "        stack.push(word)\n"
    "    return [stack.pop() for _ in range(len(stack))]\n"
)
"""A whole code file for the edit task (the parity prompt's code stops inside a class)."""
TASKS = {
    "copy": (CODE + "        self.items = []\n\n# The same code, copied exactly:\n"
             + CODE.split("\n", 1)[0] + "\n"),
    "edit": [{"role": "user", "content": "Here is a Python file. Print it again with a one-line comment "
              "`# stack.py` added at the top.\n\n" + EDIT_FILE}],
    "novel": ("Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n"
              "Once upon a time,"),
}


def run_client(model: str, initial_peers: list[str], args) -> list[dict]:
    """Per draft, every task with speculation off (k 0) and at each k: medians over `args.repeats`
    generations of `args.decode` + 1 tokens."""
    rows = []
    for draft in args.drafts:
        rows += run_draft(model, initial_peers, draft, args.tasks, args.k, args.decode, args.repeats,
                          [p == "on" for p in args.pipeline])
    return rows


def run_draft(model: str, initial_peers: list[str], draft: str, tasks: list[str], k_values: list[int],
              n_decode: int, repeats: int, pipelines: list[bool]) -> list[dict]:
    """One client drafting with `draft`: its plain and speculative rows."""
    from swarm import Client

    rows = []
    with Client(model, initial_peers=initial_peers, draft=draft) as client:
        client.generate(TASKS["novel"][:40], max_new_tokens=4)  # probes, streams and cost model warmed
        client.generate(TASKS["novel"][:40], max_new_tokens=4, speculate=2)  # the draft model loaded
        for task in tasks:
            prompt = TASKS[task]
            plain_text = None
            modes = [(0, False, False)]
            modes += [(k, a, p) for k in k_values for a in (False, True) for p in pipelines]
            # Repeats go round the modes in turn, plain included, so a drift of the machine's speed
            # (other tenants, a 2-core machine's turbo) lands on every mode alike, not on the last ones.
            by_mode: dict[tuple, list] = {mode: [] for mode in modes}
            for _ in range(repeats):
                for k, adaptive, pipeline in modes:
                    client.adaptive_speculation, client.pipeline_speculation = adaptive, pipeline
                    ask = client.chat if isinstance(prompt, list) else client.generate
                    by_mode[k, adaptive, pipeline].append(ask(prompt, max_new_tokens=n_decode + 1, speculate=k))
            for (k, adaptive, pipeline), runs in by_mode.items():
                s = [r.telemetry.speculation for r in runs]
                row = {
                    "task": task,
                    "draft": draft,
                    "k": k,
                    "adaptive": adaptive,
                    "pipeline": pipeline,
                    "decode_tok_s": round(statistics.median(r.telemetry.decode_tokens_per_s
                                                            for r in runs), 2),
                    "total_ms": round(statistics.median(r.telemetry.total_ms for r in runs), 1),
                }
                if k:
                    row |= {
                        "acceptance_rate": round(statistics.median(x.rate for x in s), 3),
                        "tokens_per_pass": round(statistics.median(x.tokens_per_pass for x in s), 2),
                        "passes": statistics.median(x.passes for x in s),
                        "passes_in_flight": 2 if any(x.ahead_sent for x in s) else 1,
                        "ahead_used": statistics.median(x.ahead_used for x in s),
                        "ahead_sent": statistics.median(x.ahead_sent for x in s),
                        "same_text_as_plain": all(r.text == plain_text for r in runs),
                    }
                    plain = by_mode[0, False, False]  # the same repeat's plain run: a pair
                    row["speedup_paired"] = round(statistics.median(
                        r.telemetry.decode_tokens_per_s / b.telemetry.decode_tokens_per_s
                        for r, b in zip(runs, plain)), 2)
                else:
                    plain_text = runs[0].text
                rows.append(row)
    for row in rows:
        if row["k"]:
            base = next(r for r in rows if r["task"] == row["task"] and r["k"] == 0)  # this client's
            row["speedup"] = round(row["decode_tok_s"] / base["decode_tok_s"], 2)
    return rows


def loopback(model: Path, n_layers: int, args) -> list[dict]:
    """A three-peer swarm on 127.0.0.1 and the client in this process."""
    cuts = [0, n_layers // 3, 2 * n_layers // 3, n_layers]
    with tempfile.TemporaryDirectory(prefix="bench-spec-") as root:
        peers = PeerSet(Path(root))
        try:
            first = peers.start("p0", *serve_args(model, f"0:{cuts[1]}", "--new-swarm"))
            for i in (1, 2):
                peers.start(f"p{i}", *serve_args(model, f"{cuts[i]}:{cuts[i + 1]}", "--initial-peers",
                                                 first.maddrs[0]))
            return run_client(str(model), first.maddrs, args)
        finally:
            peers.stop_all()


def in_lab(model: Path, n_layers: int, args, rtts: list[float]) -> dict[float, list[dict]]:
    """scripts/bench_wan.py's `direct` swarm in the network lab; the client in its site, per RTT."""
    from sim.netlab import Lab, lab_available

    reason = lab_available()
    if reason:
        raise SystemExit(f"bench_spec: {reason}")
    spec = importlib.util.spec_from_file_location("bench_wan", ROOT / "scripts" / "bench_wan.py")
    wan = importlib.util.module_from_spec(spec)
    sys.modules["bench_wan"] = wan  # its dataclasses look their module up while it loads
    spec.loader.exec_module(wan)
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-spec-") as root, Lab() as lab:
        peers = PeerSet(Path(root))
        try:
            placed = wan.direct(lab, peers, model, n_layers, "spec")
            client_site = lab.home("client")
            for rtt in rtts:
                lab.set_rtt(rtt)
                argv = [sys.executable, str(Path(__file__).resolve()), "--client", str(model), "--decode",
                        str(args.decode), "--repeats", str(args.repeats), "--k", *map(str, args.k),
                        "--drafts", *args.drafts, "--tasks", *args.tasks, "--pipeline", *args.pipeline,
                        "--initial-peers", *placed.initial_peers]
                done = lab.run(client_site, argv, timeout_s=CLIENT_S)
                out[rtt] = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            peers.stop_all()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rtt", type=float, nargs="+", default=[0.0],
                    help="ms; 0 runs on loopback, others in the lab")
    ap.add_argument("--k", type=int, nargs="+", default=[4], help="drafted tokens per pass")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--drafts", nargs="+", default=["lookup"], help="lookup, self, self:TYPE or a .gguf path")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--pipeline", nargs="+", default=["off", "on"], choices=["off", "on"],
                    help="one verify pass in flight (off), pipelined passes (on), or both")
    ap.add_argument("--client", metavar="MODEL", help=argparse.SUPPRESS)  # the client inside its lab site
    ap.add_argument("--initial-peers", nargs="*", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        print(json.dumps(run_client(args.client, args.initial_peers, args)))
        return 0
    model = resolve_model(args.model, fetch=True)
    n_layers = build_manifest(model).n_layers
    results = {}
    if 0.0 in args.rtt:
        results["0"] = loopback(model, n_layers, args)
    lab_rtts = [r for r in args.rtt if r != 0.0]
    if lab_rtts:
        results |= {f"{r:g}": rows for r, rows in in_lab(model, n_layers, args, lab_rtts).items()}
    print(json.dumps({"model": args.model, "decode": args.decode, "repeats": args.repeats,
                      "rows_by_rtt_ms": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
