"""Generations that survive their peers: kill -9, SIGTERM and SIGSTOP of a routed middle peer.

SmolLM2 on 127.0.0.1: spans 0:10, 10:20 (two peers), 20:30, refreshing their records every 3 s (a
frozen peer's DHT node makes a store wait ~3 s for it: a shorter period lets live records lapse).
Each test breaks the middle peer a generation is routed through after a few tokens; the generation
must complete with exactly the fault-free text (llama.cpp's whole model for greedy, a fault-free
swarm run for seeded sampling), and afterwards no live peer may hold a session.
"""

from __future__ import annotations

import random
from pathlib import Path
import threading
import signal

import pytest

from swarm import Client
from swarm.client.connection import SwarmConnection
from swarm.client.remote import connect_swarm
from swarm.client.telemetry import GenerationTelemetry
from swarm.sampling import SamplingParams
from swarm.spec import policy
from swarm.manifest import build_manifest

from tests.helpers.oracle import contract_tokens, oracle
from tests.helpers.peers import PeerSet, serve_args, signal_tree, wait_for

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
CONTRACT_TEXT = Path(__file__).resolve().parents[1] / "data" / "contract_prompt.txt"
N_NEW = 48
MIDDLES = ("m1", "m2")


class Swarm:
    """The module's peers by name, a watcher reading their announcements, and restarts."""

    def __init__(self, ps: PeerSet, model_path, join: str):
        self.ps, self.model_path, self.join = ps, model_path, join
        self.by_name = {}
        self.model_id = build_manifest(model_path).model_id
        self.watcher: SwarmConnection | None = None
        self.broken: dict[str, int] = {}

    def start(self, name: str, layers: str, *extra: str):
        join = extra or ("--initial-peers", self.join)
        args = serve_args(self.model_path, layers, *join, "--announce-period", "3", "--max-sessions", "4")
        self.by_name[name] = self.ps.start(name, *args)
        return self.by_name[name]

    def announced(self) -> dict:
        return {a.peer_id: a for a in self.watcher.announcements(self.model_id)}

    def name_of(self, peer_id: str) -> str:
        return next(n for n, p in self.by_name.items() if p.peer_id == peer_id)

    def heal(self) -> None:
        """Restart every middle peer that is not running (same home: same identity), thaw the
        frozen ones, and wait until all four are announced with every session slot free."""
        for name, sig in self.broken.items():
            p = self.by_name[name]
            if sig == signal.SIGSTOP:
                signal_tree(p, signal.SIGCONT)
            else:
                p.proc.wait(30)  # a SIGTERM'd peer withdraws and says goodbye first
                self.start(name, "10:20")
        self.broken.clear()
        ids = {p.peer_id for p in self.by_name.values()}
        wait_for(
            lambda: all(
                (a := self.announced().get(i)) is not None and a.sessions_free == a.max_sessions for i in ids
            ),
            "every peer announced with every session slot free",
        )


@pytest.fixture(scope="module")
def swarm(smollm2_path, tmp_path_factory):
    ps = PeerSet(tmp_path_factory.mktemp("failover"))
    s = Swarm(ps, smollm2_path, "")
    first = s.start("a", "0:10", "--new-swarm")
    s.join = first.maddrs[0]
    for name in MIDDLES:
        s.start(name, "10:20")
    s.start("z", "20:30")
    s.watcher = SwarmConnection(first.maddrs)
    yield s
    s.watcher.close()
    for p in s.by_name.values():
        signal_tree(p, signal.SIGCONT)
    ps.stop_all()


@pytest.fixture(scope="module")
def expected(smollm2_path) -> str:
    return oracle(smollm2_path, PROMPT, N_NEW)


def generate_breaking_the_middle(swarm: Swarm, client: Client, sig: int, after: int = 5,
                                 prompt: str | list[int] = PROMPT, **sampling):
    """Generate N_NEW tokens after `prompt` (text or token ids); after `after` deltas break the
    routed middle peer with `sig`."""
    if isinstance(prompt, str):
        stream = client.stream(prompt, max_new_tokens=N_NEW, **sampling)
    else:
        stream = client.stream_tokens(prompt, max_new_tokens=N_NEW, **sampling)
    victim = None
    for i, _ in enumerate(stream, 1):
        if i == after:
            victim = swarm.name_of(stream.telemetry.route[1].peer_id)
            peer = swarm.by_name[victim]
            if sig == signal.SIGTERM:  # `kill PID`: the peer leaves on its own, telling its clients
                peer.proc.send_signal(sig)
                peer.proc.wait(30)  # the client is idle meanwhile: its next step must learn why
            else:  # the whole machine dies or freezes: no part of the peer can say anything
                signal_tree(peer, sig)
            swarm.broken[victim] = sig
    assert victim is not None
    return stream.result, victim


@pytest.mark.parametrize(
    "sig, reason",
    [(signal.SIGKILL, "unreachable"), (signal.SIGTERM, "shutting_down"), (signal.SIGSTOP, "timeout")],
    ids=["kill9", "sigterm", "sigstop"],
)
def test_generation_survives_its_middle_peer(swarm, expected, sig, reason):
    swarm.heal()
    with Client(str(swarm.model_path), initial_peers=[swarm.join]) as client:
        got, victim = generate_breaking_the_middle(swarm, client, sig)
    assert got.text == expected
    [f] = got.telemetry.failovers
    other = swarm.by_name["m2" if victim == "m1" else "m1"].peer_id
    assert (f.peer_id, f.start, f.end, f.reason) == (swarm.by_name[victim].peer_id, 10, 20, reason)
    assert f.replacements == [other] and f.replayed_tokens == f.position >= got.telemetry.prompt_tokens + 4
    assert [h.peer_id for h in got.telemetry.route][1] == other
    if sig == signal.SIGTERM:  # it left with streams open (client, push): quietly, no traceback
        log = swarm.by_name[victim].stderr_text()
        assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
    swarm.heal()  # also: every live peer's sessions were released


def test_a_speculating_generation_survives_its_middle_peer_killed(swarm, expected, monkeypatch):
    # verify passes of prompt-lookup drafts, each sending the next one ahead (pipelined: the bar
    # for sending one lowered to 0); kill -9 after 5 deltas: the replacement replays exactly the kept
    # rows (rejected rows and passes sent ahead never read are not in the recorded steps), and the
    # text is unchanged
    monkeypatch.setattr(policy, "AHEAD_MIN_USE", 0.0)
    swarm.heal()
    with Client(str(swarm.model_path), initial_peers=[swarm.join], adaptive_speculation=False) as client:
        got, victim = generate_breaking_the_middle(swarm, client, signal.SIGKILL, speculate=4)
    assert got.text == expected
    [f] = got.telemetry.failovers
    assert (f.peer_id, f.reason) == (swarm.by_name[victim].peer_id, "unreachable")
    assert f.replayed_tokens == f.position
    s = got.telemetry.speculation
    assert s.passes > 0 and s.accepted > 0 and s.ahead_sent > 0
    swarm.heal()


def test_a_failover_after_a_long_prompt_gives_the_whole_model(swarm, smollm2_path):
    """A 600-token prompt (past the 256 cached tokens where a one-row step's attention would depend on
    the thread count, swarm/numeric.py), seeded, kill -9 of the middle peer after 5 tokens: the
    replacement replays the recorded prefill frames and steps (after any prefix it restores), and
    the tokens are still those of llama.cpp's whole model under the numeric contract."""
    swarm.heal()
    with Client(str(swarm.model_path), initial_peers=[swarm.join]) as client:
        prompt = client.tokenizer.encode(CONTRACT_TEXT.read_text())[:600]
        got, _ = generate_breaking_the_middle(swarm, client, signal.SIGKILL, prompt=prompt,
                                              temperature=0.8, seed=1)
    [f] = got.telemetry.failovers
    assert f.restored_tokens + f.replayed_tokens == f.position >= 600 + 4
    assert got.tokens == contract_tokens(smollm2_path, prompt, N_NEW, 0.8, 1)
    swarm.heal()


def greedy_logprobs(engine, prompt: list[int], n_new: int, kill_at: int | None = None, swarm=None):
    """(token, logprob) of n_new greedy steps on `engine`; kill -9 the routed middle peer after
    `kill_at` of them."""
    telemetry = GenerationTelemetry(backend="swarm")
    session = engine.open_session(len(prompt) + n_new, SamplingParams(logprobs=True), telemetry)
    try:
        r = session.prefill(prompt)
        out = [(r.token, r.logprob)]
        while len(out) < n_new:
            if len(out) == kill_at:
                victim = swarm.name_of(telemetry.route[1].peer_id)
                signal_tree(swarm.by_name[victim], signal.SIGKILL)
                swarm.broken[victim] = signal.SIGKILL
            r = session.decode(r.token)
            out.append((r.token, r.logprob))
    finally:
        session.close()
    return out, telemetry


def test_a_late_failover_computes_every_replayed_step_as_it_was_first(swarm, smollm2_path):
    """Killed after 60 decode steps, the middle peer's replacement replays ~90 recorded steps. Sent
    as 64-row chunks, SmolLM2 rounds them differently from one-row steps, its KV differs, and the
    log-probs after the failover drift from the fault-free run's (a fresh-user check saw the text
    change). Replayed as recorded steps (`Forward.steps`), every log-prob is equal, bit for bit."""
    swarm.heal()
    tokenizer, engine = connect_swarm(str(smollm2_path), [swarm.join])
    try:
        prompt = tokenizer.encode(PROMPT)
        calm, _ = greedy_logprobs(engine, prompt, 72)
        got, telemetry = greedy_logprobs(engine, prompt, 72, kill_at=60, swarm=swarm)
    finally:
        engine.close()
    [f] = telemetry.failovers
    assert f.replayed_tokens == f.position == len(prompt) + 59
    assert got == calm
    swarm.heal()


def test_a_generation_that_fails_part_way_keeps_its_text_so_far_in_a_pipe(swarm, smollm2_path, expected):
    """`swarm chat --prompt ... > file` whose route loses every peer of a span mid-generation: the
    text generated so far is in the file (a prefix of the fault-free text), and one error line
    says why."""
    import os
    import subprocess
    import sys

    swarm.heal()
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm.cli", "chat", "--model", str(smollm2_path), "--raw", "--prompt", PROMPT,
         "--max-new-tokens", str(N_NEW), "--initial-peers", swarm.join],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        first = os.read(proc.stdout.fileno(), 1 << 16)  # the first deltas, as they are generated
        for name in MIDDLES:  # no peer serves 10:20 any more
            signal_tree(swarm.by_name[name], signal.SIGKILL)
            swarm.broken[name] = signal.SIGKILL
        rest, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = (first + rest).decode()
    assert proc.returncode == 1, err.decode()[-2000:]
    assert text and expected.startswith(text.rstrip("\n")) and len(text) < len(expected)
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith("swarm: error:") and "10:20" in lines[-1], lines[-3:]
    swarm.heal()


def test_seeded_sampling_survives_a_kill(swarm):
    swarm.heal()
    sampling = dict(temperature=0.9, top_p=0.95, seed=1234)
    with Client(str(swarm.model_path), initial_peers=[swarm.join]) as client:
        calm = client.generate(PROMPT, max_new_tokens=N_NEW, **sampling)
        got, _ = generate_breaking_the_middle(swarm, client, signal.SIGKILL, after=7, **sampling)
    assert got.tokens == calm.tokens and len(got.telemetry.failovers) == 1
    swarm.heal()


def test_restarted_peer_is_routed_through_again_by_the_same_client(swarm, expected):
    swarm.heal()
    with Client(str(swarm.model_path), initial_peers=[swarm.join]) as client:
        _, victim = generate_breaking_the_middle(swarm, client, signal.SIGKILL)
        swarm.heal()  # the victim restarts with the same identity and is announced again
        other = "m2" if victim == "m1" else "m1"
        client._engine.directory.rtt_ms[swarm.by_name[other].peer_id] = 500.0  # noqa: SLF001 - prefer the victim
        got = client.generate(PROMPT, max_new_tokens=8)
    assert [h.peer_id for h in got.telemetry.route][1] == swarm.by_name[victim].peer_id
    assert not got.telemetry.failovers


def test_random_kills_over_twenty_generations_leak_no_session(swarm, smollm2_path, expected):
    swarm.heal()
    rng = random.Random(8)
    prompts = ["The capital of France is", "List three colors:", "def add(a, b):", PROMPT]
    want = {p: oracle(smollm2_path, p, 12) for p in prompts}
    with Client(str(swarm.model_path), initial_peers=[swarm.join]) as client:
        for i in range(20):
            prompt = rng.choice(prompts)
            if i % 3 == 2:  # every third generation loses its middle peer, a random way
                sig = rng.choice([signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP])
                got, _ = generate_breaking_the_middle(swarm, client, sig, after=rng.randint(1, 4))
                got_text, want_text = got.text, expected
                swarm.heal()
            else:
                got_text, want_text = client.generate(prompt, max_new_tokens=12).text, want[prompt]
            assert got_text == want_text, f"generation {i}"
    swarm.heal()  # every live peer is back to every session slot free


def test_one_client_shared_by_interleaved_streams_and_threads(swarm, smollm2_path):
    swarm.heal()
    prompts = ["The capital of France is", "List three colors:"]
    want = [oracle(smollm2_path, p, 12) for p in prompts]
    with Client(str(swarm.model_path), initial_peers=[swarm.join]) as client:
        streams = [client.stream(p, max_new_tokens=12) for p in prompts]
        live = [iter(s) for s in streams]
        while live:  # one delta from each in turn: both sessions are open on the peers at once
            for it in list(live):
                if next(it, None) is None:
                    live.remove(it)
        assert [s.result.text for s in streams] == want
        got: dict[int, str] = {}
        start = threading.Barrier(2)

        def run(i: int) -> None:
            start.wait()
            got[i] = client.generate(prompts[i], max_new_tokens=12).text

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [got.get(0), got.get(1)] == want
    swarm.heal()  # every session slot is free again on every peer
