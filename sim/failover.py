"""Generations through a simulated swarm whose peers fail mid-generation, on the client's own
route session (swarm/client/session.py) and failover policy (swarm/route/failover.py).

Each generation is checked token for token against a fault-free run over one peer serving the
whole model, and after each one every peer that can still hear a Close must hold no session.
Faults strike random peers after a random number of steps: death, freezing, leaving, malformed
replies; one fault is pending at a time, so every span keeps a working peer and every generation
can be served (a failed generation is the policy's fault, not the swarm's). Dead, departed and
broken peers come back later as new incarnations, as restarted volunteers do; frozen ones thaw
with the same incarnation, so the client keeps avoiding them for a while.

Every run is a function of the scenario (including its seed) on a virtual clock: no real time,
no sockets. This module does not: import swarm.dht, hivemind, libtorrent or llama.cpp.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import numpy as np

from sim.transport import SimSwarm, SpanPeer, VirtualClock, embed
from swarm.client.session import RouteSession, SessionSpec
from swarm.client.telemetry import GenerationTelemetry
from swarm.errors import SwarmError
from swarm.route.failover import Exclusions, FailoverPolicy
from swarm.sampling import SamplingParams

FAULTS = ("die", "freeze", "leave", "malformed")


@dataclass(frozen=True)
class FailoverScenario:
    """Parameters of one failover run.

    Attributes:
        name: label for reports.
        spans: (start, end) of each span; `redundancy` peers serve each.
        n_layers: layers in the model.
        redundancy: peers per span.
        generations: generations run one after another by one client.
        prompt_tokens, new_tokens: size of each generation.
        fault_rate: chance that a generation arms a random fault on one random peer (one armed
            fault at a time: it is disarmed if the peer was not routed through).
        seed: seeds the one RNG of the run.
    """

    name: str
    spans: tuple[tuple[int, int], ...] = ((0, 10), (10, 20), (20, 30))
    n_layers: int = 30
    redundancy: int = 3
    generations: int = 20
    prompt_tokens: int = 24
    new_tokens: int = 16
    fault_rate: float = 0.8
    seed: int = 0


@dataclass
class FailoverReport:
    """Outcome: generations that matched the fault-free tokens, failovers, stalls, leaks."""

    scenario: str
    generations: int = 0
    exact: int = 0
    failed: int = 0
    faults: int = 0
    failovers: int = 0
    leaked_sessions: int = 0
    stalls_ms: list[float] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        """Headline numbers, stall percentiles in virtual ms."""
        s = sorted(self.stalls_ms)
        pct = (lambda q: s[min(len(s) - 1, int(q * len(s)))]) if s else (lambda q: float("nan"))
        return {
            "generations": self.generations,
            "exact": self.exact,
            "failed": self.failed,
            "faults": self.faults,
            "failovers": self.failovers,
            "leaked_sessions": self.leaked_sessions,
            "stall_ms_p50": pct(0.5),
            "stall_ms_p90": pct(0.9),
            "reasons": dict(sorted(self.reasons.items())),
        }


async def generate(
    swarm: SimSwarm,
    exclusions: Exclusions,
    policy: FailoverPolicy,
    prompt: list[int],
    n_new: int,
    n_layers: int,
) -> tuple[list[int], GenerationTelemetry]:
    """One generation over `swarm` with the client's route session; the session is always closed."""
    telemetry = GenerationTelemetry(backend="sim", prompt_tokens=len(prompt))
    spec = SessionSpec("ab" * 8, "sim-client", n_layers, len(prompt) + n_new, SamplingParams())
    route = RouteSession(
        spec, swarm, swarm, exclusions, telemetry, policy,
        now=swarm.clock.now, sleep=swarm.clock.sleep, rng=random.Random(len(prompt)),
    )  # fmt: skip
    try:
        await route.open()
        x = np.concatenate([embed(t) for t in prompt])
        tokens = [(await route.step(x)).token]
        while len(tokens) < n_new:
            tokens.append((await route.step(embed(tokens[-1]))).token)
        return tokens, telemetry
    finally:
        await route.close()


def run(sc: FailoverScenario, policy: FailoverPolicy | None = None) -> FailoverReport:
    """Run `sc.generations` generations with faults; see the module docstring."""
    return asyncio.run(_run(sc, policy or FailoverPolicy()))


async def _run(sc: FailoverScenario, policy: FailoverPolicy) -> FailoverReport:
    rng = random.Random(sc.seed)
    clock = VirtualClock()
    peers = [
        SpanPeer(f"s{a}-{b}.{k}", a, b, sc.n_layers, rtt_ms=rng.uniform(1.0, 20.0))
        for a, b in sc.spans
        for k in range(sc.redundancy)
    ]
    swarm = SimSwarm(peers, clock)
    oracle = SimSwarm([SpanPeer("whole", 0, sc.n_layers, sc.n_layers)], VirtualClock())
    exclusions = Exclusions(policy.exclusion_s)
    report = FailoverReport(sc.name)
    last_route: set[str] = set()
    for _ in range(sc.generations):
        for p in peers:  # volunteers that left, died or broke come back (as a new incarnation)
            if p.state in ("dead", "leaving", "malformed"):
                p.restart()
        for p in peers:  # a fault that did not strike last generation is disarmed: one at a time
            if p.state == "up":
                p.fault = ""
        if rng.random() < sc.fault_rate:
            # mostly a peer the client is likely to route through again (it used it last time)
            used = [p for p in peers if p.state == "up" and p.peer_id in last_route]
            victim = rng.choice(
                used if used and rng.random() < 0.8 else [p for p in peers if p.state == "up"]
            )
            victim.fault, victim.fault_after = (
                rng.choice(FAULTS),
                victim.forwards + rng.randint(1, sc.new_tokens),
            )
            report.faults += 1
        prompt = [rng.randrange(1000) for _ in range(sc.prompt_tokens)]
        want, _ = await generate(oracle, Exclusions(1.0), policy, prompt, sc.new_tokens, sc.n_layers)
        report.generations += 1
        try:
            got, telemetry = await generate(swarm, exclusions, policy, prompt, sc.new_tokens, sc.n_layers)
        except SwarmError:
            report.failed += 1
        else:
            report.exact += got == want
            last_route = {h.peer_id for h in telemetry.route}
            report.failovers += len(telemetry.failovers)
            for f in telemetry.failovers:
                report.stalls_ms.append(f.stall_ms)
                report.reasons[f.reason] = report.reasons.get(f.reason, 0) + 1
        clock.now_s += 5.0  # think time between a user's generations
        for p in peers:
            if p.state == "frozen":
                p.thaw()
        report.leaked_sessions += swarm.open_sessions()
    return report
