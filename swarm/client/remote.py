"""The swarm backend of `Client`: the engine adapter over route sessions, and joining the swarm.

Each generation gets its own `RouteSession` (swarm/client/session.py), which plans a route, keeps
one sticky stream per hop, and fails over by replay; `RemoteEngine` gives it its real parts: the
`DHTDirectory` (swarm/client/directory.py), the `P2PTransport` (swarm/client/streams.py), the
monotonic clock and asyncio's sleep, all on the `SwarmConnection`'s loop thread
(swarm/client/connection.py, swarm/client/loop.py). The client embeds tokens itself, so only
`[n, hidden]` hidden states cross the network (`hidden` = n_embd x the arch row's `boundary_width`),
with each row's token id where the arch row has a `token_ids` sideband (deepseek4) or the last span
serves a multi-token-prediction head (which reads them). A model whose hops cannot roll back
(`ArchRow.rollback_exact` False, or a served MTP head: it goes back at most 128 positions) offers
no prompt prefixes (a restore truncates a held snapshot to the offered length), and its speculation
rolls rejected rows back from the state each hop exported before the pass
(swarm/peer/checkpoints.py).
`connect_swarm` joins the swarm for a model: the
connection, the tokenizer, the embedder (fetched from seeders when given a model id) and the engine.

The public engine methods are synchronous, as the generation loop expects, and several sessions of
one engine may run at once (threads or interleaved iterators): each has its own hops; the peers'
RTTs and the failed peers to avoid are shared.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from pathlib import Path

from swarm.arch import arch_row
from swarm.artifacts.distribute import acquire, client_ranges
from swarm.artifacts.session import ArtifactSession, SessionConfig
from swarm.client.checks import CheckContext, SpotChecks
from swarm.client.connection import SwarmConnection
from swarm.client.directory import DHTDirectory
from swarm.client.remote_session import CALL_TIMEOUT_S, RemoteSession
from swarm.client.session import RouteSession, SessionSpec
from swarm.client.streams import P2PTransport
from swarm.client.telemetry import GenerationTelemetry
from swarm.client.tokenizer import Tokenizer
from swarm.dht.identity import resolve_data_dir
from swarm.dht.node import SwarmDHT
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.limits import MAX_CONTEXT_TOKENS
from swarm.manifest import Manifest, build_manifest
from swarm.models import cache_dir, is_model_id, resolve_model
from swarm.numeric import check_chunk_tokens
from swarm.route.failover import Exclusions, FailoverPolicy
from swarm.route.verify import CheckPolicy, Standing, band_for, quant_type
from swarm.route.plan import route_room
from swarm.sampling import SamplingParams

class RemoteEngine:
    """`swarm.client.generate.Engine` over the swarm: one `RouteSession` per generation.

    Args:
        conn: the client's swarm connection.
        manifest: the model's manifest (model_id, layer count, context length).
        embedder: token ids → `[n, hidden]` float32, exact.
        prefill_chunk_tokens: prompt tokens per Forward frame (and per replayed frame): a multiple of
            the ubatch grid, `swarm.numeric.UBATCH_TOKENS` (64), so that every frame starts on it.
        policy: failover limits and timeouts.
        reuse_prefixes: offer the prompt's prefix hashes to every hop so that peers holding a
            snapshot of a shared prefix restore it instead of computing it (swarm/kv/prefix.py);
            never on a model whose hops cannot roll back (`rollback_exact`).
        model_path: the model's GGUF as this client holds it (the whole file, or for a model_id
            its header and token embeddings), or None.
    Raises:
        RequestError: prefill_chunk_tokens off the grid (`swarm.numeric.check_chunk_tokens`).
    Attributes:
        manifest: the model's manifest.
        model_path: as given.
        directory: the peers' announcements and measured RTTs.
        transport: opens the hops' streams; `transport.direct = False` keeps them on libp2p.
        push: chain each route for server push (swarm/client/session.py); False: relay every step.
        check_policy: spot checks of every route's hops (swarm/client/checks.py); None: no checks.
        checks: what those checks share: the band of this model's quantization, the peers'
            standing (route pricing), where evidence of caught peers goes (`swarm status` reads it).
        settle_checks: a session's close waits for its checks in flight (tests, benchmarks).
        mtp_drafts: how many chained drafts to ask of the last span's multi-token-prediction head
            after every kept token (`Forward.want_draft`; `GenerationTelemetry.mtp_drafts`), which
            `HeadDrafts` (swarm/spec/draft.py, `Client(draft="mtp")`) proposes for speculation; 0:
            none. Read when a session opens.
        rollback_exact: the model's hops can roll a sequence back to any position
            (`ArchRow.rollback_exact`, and no served MTP head); without it they roll back only a
            verify pass's rows (and a pass sent ahead), from the state exported before it
            (swarm/peer/checkpoints.py) or, on a last span with a head whose cache truncates, by
            truncation (`SpanExecutor.truncate_depth`), and offer no prefixes.
    """

    def __init__(
        self,
        conn: SwarmConnection,
        manifest: Manifest,
        embedder: TokenEmbedder,
        prefill_chunk_tokens: int = 256,
        policy: FailoverPolicy | None = None,
        reuse_prefixes: bool = True,
        model_path: Path | None = None,
    ):
        check_chunk_tokens(prefill_chunk_tokens)
        self._conn = conn
        self.manifest = manifest
        self.model_path = model_path
        self._embedder = embedder
        self._chunk = prefill_chunk_tokens
        row = arch_row(manifest.arch)
        head = bool(manifest.mtp_head_tensors())
        self.rollback_exact = row.rollback_exact and not head
        self._token_ids = head or any(sb.name == "token_ids" for sb in row.sidebands)
        self.reuse_prefixes = reuse_prefixes
        self.policy = policy or FailoverPolicy(replay_chunk_tokens=prefill_chunk_tokens)
        ctx = int(manifest.hparams.get(f"{manifest.arch}.context_length", MAX_CONTEXT_TOKENS))
        self.context_limit = min(ctx, MAX_CONTEXT_TOKENS)
        self.directory = DHTDirectory(
            conn.dht, manifest.model_id, self.policy.probe_timeout_s, n_layers=manifest.n_layers
        )
        self.exclusions = Exclusions(self.policy.exclusion_s)
        self.transport = P2PTransport(conn.dht, self.directory)
        self.push = True
        self.check_policy: CheckPolicy | None = CheckPolicy()
        self.checks = CheckContext(self.check_policy, band_for(manifest.arch, quant_type(manifest.hparams)),
                                   Standing(self.check_policy), evidence_dir=resolve_data_dir(None))
        self.settle_checks = False
        self.mtp_drafts = 0
        self._rng = random.SystemRandom()
        self._sessions: set[RemoteSession] = set()

    def open_session(
        self, n_tokens: int, sampling: SamplingParams, telemetry: GenerationTelemetry
    ) -> "RemoteSession":
        """A session reserving `n_tokens` of KV cache on each hop. Its route is planned and opened
        by the first `prefill`, which knows the prompt's prefix hashes to offer the hops.
        """
        spec = SessionSpec(
            self.manifest.model_id, self._conn.dht.peer_id, self.manifest.n_layers, n_tokens, sampling,
            token_ids=self._token_ids, rollback_exact=self.rollback_exact,
        )
        route = RouteSession(
            spec,
            self.directory,
            self.transport,
            self.exclusions,
            telemetry,
            self.policy,
            now=time.monotonic,
            sleep=asyncio.sleep,
            rng=self._rng,
            push_addrs=self._push_addrs if self.push else None,
        )
        route.mtp_drafts = self.mtp_drafts
        if self.check_policy is not None:
            ctx = dataclasses.replace(self.checks, policy=self.check_policy)
            route.checks = SpotChecks(ctx, spec, self.directory, self.transport, self.exclusions, self.policy,
                                      telemetry, now=time.monotonic, rng=self._rng)
            route.checks.settle_on_close = self.settle_checks
        session = RemoteSession(self._conn.loop, route, self._embedder, self._chunk,
                                self.reuse_prefixes and self.rollback_exact)
        self._sessions.add(session)
        session.on_close = self._sessions.discard
        return session

    def session_room(self) -> int | None:
        """Tokens (prompt + generated) a session opened now could reserve on every hop of the best
        route: the widest chain of the announced `free_cache_tokens` (each peer's per-session cap,
        less what is reserved there), around excluded peers, at most `context_limit`; None when no
        complete route exists now. Reads the DHT when the directory's last read is over
        `SNAPSHOT_MAX_AGE_S` old.

        Raises:
            SwarmError: the DHT did not answer.
        """

        async def read() -> int:
            spans = await self.directory.peers(self.exclusions.active(time.monotonic()), False)
            exclude = self.exclusions.active(time.monotonic(), {s.peer_id: s.incarnation for s in spans})
            return route_room(spans, self.manifest.n_layers, exclude=exclude)

        room = self._conn.loop.run(read(), CALL_TIMEOUT_S)
        return min(room, self.context_limit) if room > 0 else None

    def _push_addrs(self, peer_id: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """Where a hop's peer can reach `peer_id`: its announced multiaddrs, direct endpoints and relay
        addresses."""
        d = self.directory
        return d.addrs(peer_id), d.direct_addrs(peer_id), d.relay_addrs(peer_id)

    def close(self) -> None:
        """Close every open session and leave the swarm."""
        for session in list(self._sessions):
            session.close()
        self._conn.close()


def connect_swarm(
    model: str, initial_peers: list[str], prefill_chunk_tokens: int = 256
) -> tuple[Tokenizer, RemoteEngine]:
    """Join the swarm for `model`: tokenizer and engine.

    Args:
        model: a known name or local `.gguf` path, or a model_id: then the manifest comes from the
            DHT and only the header (tokenizer) and `token_embd` are fetched from seeders, verified.
    Raises:
        RequestError: prefill_chunk_tokens is not a multiple of the ubatch grid (swarm/numeric.py).
        ModelError: the model file cannot be found or read.
        ArtifactError: (model_id) unknown model, no seeders, or bad bytes.
        SwarmError: the DHT could not be joined.
    """
    check_chunk_tokens(prefill_chunk_tokens)  # before joining the swarm: a bad setting costs nothing
    conn = SwarmConnection(initial_peers)
    try:
        if is_model_id(model):
            path, manifest = conn.loop.run(_fetch_client_artifacts(conn.dht, model))
        else:
            path = resolve_model(model, progress=True)
            manifest = build_manifest(path)
        tokenizer = Tokenizer.from_gguf(path)
        embedder = TokenEmbedder(path)
    except BaseException:
        conn.close()
        raise
    return tokenizer, RemoteEngine(conn, manifest, embedder, prefill_chunk_tokens, model_path=path)


async def _fetch_client_artifacts(dht: SwarmDHT, model_id: str) -> tuple[Path, Manifest]:
    artifacts = ArtifactSession(SessionConfig())
    try:
        dest = cache_dir().parent / "artifacts" / f"{model_id}.client.gguf"
        path, manifest, _ = await acquire(dht, artifacts, model_id, dest, client_ranges)
    finally:
        await asyncio.to_thread(artifacts.close)
    return path, manifest
