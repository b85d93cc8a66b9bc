"""Clients generating through the real route session and failover policy, in virtual time.

A `ClientSite` is one client process somewhere on the globe: it is the `PeerDirectory` and the
`HopTransport` that `swarm.client.session.RouteSession` is given, and it keeps what a real client
keeps across its generations (measured RTTs, the last DHT read, `Exclusions`). As
`swarm.client.directory.DHTDirectory` does, a read costs `dht_read_s` and is reused for up to
SNAPSHOT_MAX_AGE_S when the session does not ask for a fresh one (failover re-plans), and peers not
measured yet are pinged in parallel first (a live or reset peer answers or refuses within its round
trip; a frozen one costs the probe timeout and is reported unreachable).

`generate` runs one generation: open the route, prefill the prompt, decode token by token, close;
the tokens are checked against `sim.compute.reference_tokens` (the fault-free run).
`arrivals` starts generations as a Poisson process at random sites.

This module does not: plan routes or fail over itself (the route session does, unchanged), or
decide how peers behave (`sim.peers`).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from sim.compute import VOCAB, embed, reference_tokens
from sim.geo import Point, random_point, rtt_ms
from sim.metrics import GenerationRecord, Metrics
from sim.peers import PeerLink, SimPeer
from sim.records import RecordBoard
from swarm.client.session import RouteSession, SessionSpec
from swarm.client.telemetry import GenerationTelemetry
from swarm.errors import PeerTimeout, PeerUnreachable, SwarmError
from swarm.route.failover import Exclusions, FailoverPolicy
from swarm.route.plan import PeerSpan
from swarm.sampling import SamplingParams

SNAPSHOT_MAX_AGE_S = 60.0
"""A read is reused this long by non-fresh requests (as `swarm.client.directory.SNAPSHOT_MAX_AGE_S`)."""
MODEL_ID = "5e" * 16
"""The simulated model's id (any hex string)."""


@dataclass(frozen=True)
class Load:
    """The clients and what they ask.

    Attributes:
        generations_per_s: Poisson arrival rate of generations over all sites.
        sites: client processes, each at a random point on the globe.
        prompt_tokens, new_tokens: size of every generation.
        policy: the failover policy of every route session.
        push: server push (peers send each step's output to the next peer); False: clients relay.
    """

    generations_per_s: float = 2.0
    sites: int = 64
    prompt_tokens: int = 64
    new_tokens: int = 32
    policy: FailoverPolicy = FailoverPolicy()
    push: bool = False


class ClientSite:
    """One client: `PeerDirectory` and `HopTransport` of its route sessions (see module docstring).

    Args:
        site_id: its peer id.
        location, access_ms: where it is.
        board: the announcement records.
        peers: every peer by id (to dial and ping them).
        dht_read_s: one DHT read.
        policy: the failover policy (its probe timeout and exclusion time).
    Attributes:
        exclusions: peers its route sessions avoid, shared by them all.
        rtt_ms: round trips measured so far, by peer id.
    """

    def __init__(
        self,
        site_id: str,
        location: Point,
        access_ms: float,
        board: RecordBoard,
        peers: dict[str, SimPeer],
        *,
        dht_read_s: float,
        policy: FailoverPolicy,
    ):
        self.site_id, self.location, self.access_ms = site_id, location, access_ms
        self._board, self._peers = board, peers
        self._dht_read_s, self._probe_timeout_s = dht_read_s, policy.probe_timeout_s
        self.exclusions = Exclusions(policy.exclusion_s)
        self.rtt_ms: dict[str, float] = {}
        self._read: list[PeerSpan] = []
        self._read_at = -math.inf
        self._spans: dict[str, tuple[PeerSpan, float | None, PeerSpan]] = {}
        self._links_made = 0

    def rtt_s(self, peer: SimPeer) -> float:
        """The true round trip to `peer`, seconds."""
        return rtt_ms(self.location, peer.profile.location, self.access_ms, peer.profile.access_ms) / 1000.0

    async def peers(self, skip_probe: frozenset[str], fresh: bool) -> list[PeerSpan]:
        """See `swarm.client.link.PeerDirectory.peers`."""
        loop = asyncio.get_running_loop()
        if fresh or loop.time() - self._read_at > SNAPSHOT_MAX_AGE_S:
            await asyncio.sleep(self._dht_read_s)
            self._read, self._read_at = self._board.snapshot(), loop.time()
        read = self._read
        unmeasured = [r.peer_id for r in read if r.peer_id not in self.rtt_ms and r.peer_id not in skip_probe]
        answered = await self.probe(unmeasured) if unmeasured else set()
        failed = {p for p in unmeasured if p not in answered}
        out = []
        for r in read:  # PeerSpans with RTTs, rebuilt only when the record or the RTT changed
            pid = r.peer_id
            rtt = math.inf if pid in failed else self.rtt_ms.get(pid)
            cached = self._spans.get(pid)
            if cached is None or cached[0] is not r or cached[1] != rtt:
                span = PeerSpan(
                    pid,
                    r.start,
                    r.end,
                    r.decode_steps_per_s,
                    r.prefill_tokens_per_s,
                    r.free_cache_tokens,
                    r.sessions_free,
                    rtt,
                    r.incarnation,
                )
                cached = self._spans[pid] = (r, rtt, span)
            out.append(cached[2])
        return out

    async def probe(self, peer_ids: Collection[str]) -> set[str]:
        """Ping in parallel; returns the peers that answered and keeps their RTTs."""
        answered, wait_s = set(), 0.0
        for pid in peer_ids:
            peer = self._peers[pid]
            self.rtt_ms.pop(pid, None)
            if peer.state == "frozen":
                wait_s = max(wait_s, self._probe_timeout_s)
                continue
            rtt = self.rtt_s(peer)
            wait_s = max(wait_s, min(rtt, self._probe_timeout_s))
            if peer.alive and rtt < self._probe_timeout_s:
                answered.add(pid)
                self.rtt_ms[pid] = rtt * 1000.0
        await asyncio.sleep(wait_s)
        return answered

    async def connect(self, peer_id: str, timeout_s: float) -> PeerLink:
        """Dial `peer_id` (one round trip); refused when gone, timed out when frozen."""
        peer = self._peers[peer_id]
        rtt = self.rtt_s(peer)
        if peer.state == "frozen" or rtt > timeout_s:
            await asyncio.sleep(timeout_s)
            raise PeerTimeout(f"{peer_id} did not accept a stream within {timeout_s:.1f} s")
        await asyncio.sleep(rtt)
        if not peer.alive:
            raise PeerUnreachable(f"cannot dial {peer_id}: connection refused")
        self._links_made += 1
        return PeerLink(peer, self.site_id, rtt, self._links_made)


async def generate(
    site: ClientSite,
    prompt: list[int],
    n_new: int,
    n_layers: int,
    policy: FailoverPolicy,
    rng: random.Random,
    on_token: Callable[[int, RouteSession], None] | None = None,
    push: bool = False,
) -> GenerationRecord:
    """One generation through the swarm from `site`, checked against the fault-free tokens.

    Args:
        site: the client (its exclusions are shared by its generations).
        prompt: token ids; n_new: tokens to generate.
        n_layers: the model's depth.
        policy: failover limits and timeouts.
        rng: the route session's random source (jitter, session ids).
        on_token: called after each token with (tokens so far, the route session): scripted faults.
        push: chain the route for server push (peers find each other by id: no addresses).
    Returns:
        GenerationRecord (never raises SwarmError: a failure is recorded with its reason).
    """
    loop = asyncio.get_running_loop()
    telemetry = GenerationTelemetry(backend="sim", prompt_tokens=len(prompt))
    spec = SessionSpec(MODEL_ID, site.site_id, n_layers, len(prompt) + n_new, SamplingParams())
    route = RouteSession(
        spec, site, site, site.exclusions, telemetry, policy, now=loop.time, sleep=asyncio.sleep, rng=rng,
        push_addrs=(lambda peer_id: ((), (), ())) if push else None,
    )
    record, t0 = GenerationRecord(started_s=loop.time()), loop.time()
    tokens: list[int] = []
    try:
        await route.open()
        x = np.concatenate([embed(t) for t in prompt])
        last = t0
        while len(tokens) < n_new:
            tokens.append((await route.step(x)).token)
            telemetry.token_latencies_ms.append((loop.time() - last) * 1000.0)
            last = loop.time()
            if on_token is not None:
                on_token(len(tokens), route)
            x = embed(tokens[-1])
        record.completed = True
    except SwarmError as e:
        record.reason = f"{type(e).__name__}: {str(e)[:60]}"
    finally:
        await route.close()
    telemetry.finalize((loop.time() - t0) * 1000.0)
    record.exact = record.completed and tokens == reference_tokens(prompt, n_new, n_layers)
    record.tokens_per_s = telemetry.decode_tokens_per_s
    record.ttft_ms = telemetry.token_latencies_ms[0] if tokens else 0.0
    record.stalls = [(f.reason, f.stall_ms) for f in telemetry.failovers]
    record.retries = telemetry.retries
    return record


def make_sites(
    n: int,
    rng: random.Random,
    board: RecordBoard,
    peers: dict[str, SimPeer],
    dht_read_s: float,
    policy: FailoverPolicy,
) -> list[ClientSite]:
    """`n` client sites at random points on the globe (last mile 1-5 ms)."""
    return [
        ClientSite(
            f"client{i:03d}",
            random_point(rng),
            rng.uniform(1.0, 5.0),
            board,
            peers,
            dht_read_s=dht_read_s,
            policy=policy,
        )
        for i in range(n)
    ]


async def arrivals(
    sites: list[ClientSite], load: Load, n_layers: int, until_s: float, rng: random.Random, metrics: Metrics
) -> None:
    """Start generations (Poisson, random site and prompt) until virtual `until_s`; wait for them all."""
    loop = asyncio.get_running_loop()
    running: list[asyncio.Task] = []

    async def one(site: ClientSite, prompt: list[int], seed: int) -> None:
        record = await generate(site, prompt, load.new_tokens, n_layers, load.policy, random.Random(seed),
                                push=load.push)
        metrics.generations.append(record)

    while True:
        await asyncio.sleep(rng.expovariate(load.generations_per_s))
        if loop.time() >= until_s:
            break
        site = rng.choice(sites)
        prompt = [rng.randrange(VOCAB) for _ in range(load.prompt_tokens)]
        running.append(loop.create_task(one(site, prompt, rng.getrandbits(64))))
    await asyncio.gather(*running)
