"""One generation's route over the swarm, with failover by replay.

A `RouteSession` plans a chain of peers covering every layer, opens one sticky link per hop,
and carries each step (a prefill chunk or a one-token decode step) hop by hop; the last hop
answers with the sampled token. Every row a hop has been sent is kept, so when a hop fails
(stream closed, refused, timed out, BUSY, SHUTTING_DOWN, malformed reply) only that hop's layers
[start, end) are re-planned, the new hop or hops are opened, the failed hop's inputs are replayed
on them, and the step goes on: the text equals a fault-free run token for token, since each span's
output depends only on the steps it was given and the last span samples by position. A replay
computes every recorded step as it was first sent, many steps to a frame (`Forward.steps`):
llama.cpp rounds a step of many rows differently from one-row steps, so regrouped rows would drift
(swarm/route/replay.py).

Server push: given `push_addrs`, the route is chained after every open and failover: a `Chain` to
each hop (push outputs to the next hop's session, accept pushes from the previous hop's peer), not
waited for (each acknowledgement is read before that hop's next answer). A step is then sent to the
first hop only, with `Forward.push`; each peer pushes its output straight to the next and answers
the client with a copy (`Hidden.pushed`), which the client records as the next hop's input for
replay, and the last answers the token: the client sends once per step and reads every hop's answer
in turn. A hop that did not push answers `pushed` false and the client relays from there. When a
hop fails mid-step, the client replaces it as above and finishes the step by relay with
`Forward.rewind` (a later hop may already hold the step from a push before the failure); answers to
steps the client gave up on are recognised by their step number and skipped. Every answer carries
the receipt of the rows the peer computed (`swarm.wire.receipt`): a relayed step's must be of the
rows sent; a pushed step's of the copy the previous hop returned, else the rows were altered between
the two peers (a chain break): the step is relayed again with `rewind` and the generation relays
from then on.

Everything that does I/O or reads time is passed in: the `PeerDirectory` (announced spans and RTT
probes), the `HopTransport` (links to peers, swarm/client/link.py), the clock, the sleep and the
RNG. A link only sends and receives frames; relaying a step is a send and the receive of its answer,
here, for every kind of link. The client runs it over libp2p and direct streams
(swarm/client/streams.py); the simulator (sim/) runs it over simulated peers; unit tests run it over
scripted peers. The decisions are pure functions in swarm/route/: the policy numbers, timeouts and
failure reasons (failover.py), the open/retry ladder (ladder.py), where new hops start and what they
replay (restore.py, replay.py).

Prefix snapshots: `open(prefixes=...)` offers the prompt's prefix hashes (swarm/kv/prefix.py) to
every hop; the route starts at the largest length every hop can restore (`restored_tokens`), and
each hop's first Forward carries `restore`. A replacement hop offers the same prefixes and replays
only the rows after the longest prefix it can restore at or after the failed hop's first recorded
row; when it can restore none of them (the failed hop's rows before that were never recorded), the
whole route is re-opened and replayed from the prompt's embedded rows (`prefix_rows`).

Repair: a hop that the spot checks (swarm/client/checks.py) catch computing wrong is dropped before
the next step; the whole route is rebuilt without it (every later hop's KV holds states computed
from its rows), replayed from the first hop's recorded rows up to the token after the first wrong
row (`swarm.route.verify.rewind_position`), and `step` raises `Rewound` with the rebuilt route's
token there instead of running its rows, which came from text that may be wrong. The caller drops
its tokens from that position on (swarm/client/generate.py).

Speculative decoding: `step(x, verify=True)` sends a verify pass (swarm/spec/verify.py), whose
last hop answers one sampled token per row, and `keep(n)` then keeps only the pass's first n rows:
the recorded inputs of every hop are cut to them (a replacement replays exactly the kept rows), and
the next step goes out with `Forward.rewind`, so each hop rolls the rejected rows back before it
computes (no round trip of its own). By default a pass is computed in groups of the route's
`verify_rows` (the smallest group every hop proved exact at load, swarm/peer/exact_rows.py), so each
row's output is the one-row step's, bit for bit, and the rows are recorded as one-row steps: a
replacement replays them exactly whatever group it proved. Pipelining: `step(ahead=...)` sends the
next verify pass right behind this one on a chained route; a later `step` of exactly its rows at
its position reads its answers only, and any other step rolls it back with `rewind` (its answers
are skipped by step number). It is recorded for replay only once read (docs/speculative.md).

Token ids (`SessionSpec.token_ids`, a model whose arch row has a `token_ids` sideband: deepseek4's
hash-routed layers pick experts by token id): the session keeps the token id of every position it
was given (`open`'s prompt ids, each step's ids) and sends each Forward the ids of its rows' positions,
to every hop, on every path: steps, verify passes, replays of recorded steps, rebuilt routes and the
spot checks' recomputations. Receipts then cover the ids too (`swarm.wire.receipt`).

Rollback that is not exact (`SessionSpec.rollback_exact` False: a recurrent or compressed state,
which llama.cpp cannot cut back into a sequence): a hop rolls back only the rows of a verify pass
(and a pass sent ahead), from the state it exported before the pass (swarm/peer/checkpoints.py), so
speculation works as on other models. Where a hop may hold rows past a step that was not a verify
pass (a hop failed mid-step on a pushed route, or a receipt broke the chain), the whole route is
rebuilt and replayed into fresh sessions instead of relaying the step with `Forward.rewind`.

This module does not: read the DHT, encode frames to bytes, embed tokens, draft or sample. It is one
concern (one generation's route and its failover) and stays one file past the house's ~400 lines:
its steps, chaining and failover share one route's state, and every decision is already in route/.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from swarm.client.checks import HopRecord, SpotChecks
from swarm.client.link import HopLink, HopTransport, PeerDirectory, error_of
from swarm.client.telemetry import CheckEvent, FailoverEvent, GenerationTelemetry, HopTelemetry
from swarm.errors import NoRoute, ProtocolError, SessionTooLong, SwarmError
from swarm.route.failover import (
    Exclusions, FailoverPolicy, FailureReason, backoff_s, failure_reason, step_timeout_s,
)
from swarm.route.ladder import NoRouteAction, after_no_route, plan_fresh
from swarm.route.plan import Hop, PeerSpan, layer_ranges, plan_route
from swarm.route.replay import clip_steps, drop_rows, replay_frames, split_steps
from swarm.route.restore import CannotRestore, rebuild_rows, restore_point
from swarm.route.verify import rewind_position
from swarm.sampling import SamplingParams
from swarm.spec.verify import accepted, verify_steps
from swarm.wire import (
    MAX_CHAIN_ADDRS, MAX_FORWARD_STEPS, Chain, Error, Forward, Frame, Hidden, Open, OpenOk, Token, receipt,
)


@dataclass(frozen=True)
class SessionSpec:
    """What one generation asks of every hop.

    Attributes:
        model_id: the model.
        client_id: this client's peer id (owner of the sessions on the peers).
        n_layers: layers in the model; the route covers [0, n_layers).
        n_tokens: KV tokens to reserve on every hop (prompt + max new tokens).
        sampling: sampling parameters for the last hop.
        token_ids: every Forward carries its rows' token ids (`Forward.token_ids`): the model's arch
            row has a `token_ids` sideband (some of its layers read them).
        rollback_exact: the model's hops can roll a sequence back to an earlier position
            (`ArchRow.rollback_exact`); False: a rewind is replaced by a rebuild (module docstring).
    """

    model_id: str
    client_id: str
    n_layers: int
    n_tokens: int
    sampling: SamplingParams
    token_ids: bool = False
    rollback_exact: bool = True


@dataclass
class _Hop:
    span: PeerSpan
    link: HopLink
    telemetry: HopTelemetry
    inputs: list[np.ndarray]
    """The `[rows, hidden]` float32 rows of every step this hop computed, one block per step, from
    position `base` on: its replay (a replay computes each block as its own step)."""
    session_id: bytes = b""
    acks_due: int = 0
    """Chain frames sent to the hop whose acknowledgement was not read yet."""
    restorable: frozenset[int] = frozenset()
    """Prefix lengths the peer said it can restore."""
    base: int = 0
    """Position of the first recorded input row (the restored prefix length)."""
    pending_restore: int = 0
    """Prefix length to restore with the hop's first Forward (0: none, or already done)."""
    verify_rows: int = 1
    """Rows of one step the peer computes exactly as one-row steps (`OpenOk.verify_rows`)."""
    claims: dict[int, int] = field(default_factory=dict)
    """The last hop's own answers: position -> the token it answered there (what its spot check
    compares; a replacement hop starts with none)."""

    @property
    def peer_id(self) -> str:
        return self.span.peer_id


class Rewound(Exception):
    """A spot check caught a hop of the route computing wrong: the route was rebuilt without it and
    rolled back, and the step asked for was not run (its input was computed from wrong text).

    Attributes:
        position: tokens (prompt + generated) that stand; the caller's tokens from this position on
            are replaced, starting with `token`.
        token: the rebuilt route's answer after the row at `position - 1`: the token at `position`.
    """

    def __init__(self, position: int, token: Token):
        super().__init__(f"rolled back to position {position}")
        self.position, self.token = position, token


class _HopFailed(Exception):
    """Internal: `hop` failed with the user-facing `error`."""

    def __init__(self, span: PeerSpan, error: SwarmError):
        super().__init__(str(error))
        self.span, self.error = span, error


@dataclass(frozen=True)
class _Ahead:
    """A verify pass sent to the first hop right after the pass before it (`step(ahead=...)`), on
    the guess that the earlier pass keeps every row: its rows start where that pass's rows end."""

    step: int
    """Its `Forward.step`."""
    pos0: int
    x: np.ndarray
    ids: np.ndarray
    """Its `Forward.token_ids` (empty without `SessionSpec.token_ids`)."""
    hops: tuple[_Hop, ...]
    """The route it was sent over: a route changed since (failover, repair) never answers it."""
    steps: tuple[int, ...]
    record: tuple[int, ...]

    def carries(self, pos0: int, x: np.ndarray, ids: np.ndarray, hops: list[_Hop]) -> bool:
        """Whether it is the step of rows `x` with token ids `ids` at `pos0` over `hops` (then only
        its answers are read)."""
        return (self.pos0 == pos0 and len(self.hops) == len(hops) and all(a is b for a, b in zip(self.hops, hops))
                and self.x.shape == x.shape and np.array_equal(self.x, x) and np.array_equal(self.ids, ids))


class RouteSession:
    """A route of hops for one generation; `open`, then `step` per chunk, then `close`.

    Args:
        spec: the session's model, owner, size and sampling.
        directory: announced spans and probes.
        transport: links to peers.
        exclusions: peers to avoid, shared with the client's other sessions.
        telemetry: filled with the route, per-hop costs, retries and failovers.
        policy: failover limits and timeouts.
        now: monotonic clock, seconds.
        sleep: awaitable sleep, seconds (backoff).
        rng: jitter and session ids.
        push_addrs: peer id → (multiaddrs, direct endpoints, relay addresses) to give the previous hop: chain the
            route for server push; None: relay only.
    All methods run on one event loop; one call at a time.
    """

    def __init__(
        self,
        spec: SessionSpec,
        directory: PeerDirectory,
        transport: HopTransport,
        exclusions: Exclusions,
        telemetry: GenerationTelemetry,
        policy: FailoverPolicy,
        *,
        now: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        rng: random.Random,
        push_addrs: Callable[[str], tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] | None = None,
    ):
        self.spec, self._directory, self._transport = spec, directory, transport
        self._push_addrs = push_addrs
        self.chained = False
        """The current route is chained: steps go out with `Forward.push`."""
        self.mtp_drafts = 0
        """Drafts to ask of the last span's multi-token-prediction head (`Forward.want_draft`) on
        steps that say so (`step(draft=True)`), 0: none; answers land in `telemetry.mtp_drafts`."""
        self._want_draft = 0
        self._exclusions, self.telemetry, self.policy = exclusions, telemetry, policy
        self._now, self._sleep, self._rng = now, sleep, rng
        self._hops: list[_Hop] = []
        self._links: set[HopLink] = set()
        self._closing: set[asyncio.Future] = set()
        self._step = 0
        self._last_pos0 = 0
        self._stale = False
        """Hops may hold rows past `pos` (a verify pass's rejected rows): the next step rewinds."""
        self._ahead: _Ahead | None = None
        """A verify pass in flight behind the latest step (`step(ahead=...)`), not read yet."""
        self.ahead_sent = 0
        """Verify passes sent ahead (`step(ahead=...)`) in this generation."""
        self.ahead_used = 0
        """Of them, the ones whose answers were used (the pass before kept every row and the guess
        after it held); the others were rolled back unread."""
        self.pos = 0
        """Tokens every hop holds: the next step starts at this position."""
        self.restored_tokens = 0
        """Prompt tokens the route restored from snapshots at open (the prefill starts there)."""
        self.prompt_tokens = 0
        """The prompt's length (`open`): a repair never rolls back into the prompt."""
        self._offers: tuple[tuple[int, bytes], ...] = ()
        self._prefix_rows: Callable[[int], np.ndarray] | None = None
        self._replayed_token: Token | None = None
        """The last hop's answer to the last row of the latest replay through it."""
        self._push_broken = False
        """A receipt showed pushed rows altered between two hops: this generation relays from then on."""
        self._ids = np.zeros(0, np.int32)
        """With `spec.token_ids`: the token id at each position the route was given (prompt ids from
        `open`, then each step's); entries at and past `pos` may be stale and are overwritten."""
        self.checks: SpotChecks | None = None
        """Spot checks of the hops (swarm/client/checks.py); None: none. A peer they catch is
        dropped before the next step, the route rebuilt and rolled back to its first wrong row
        (`_drop_caught`), and the step raises `Rewound`."""

    @property
    def route(self) -> list[str]:
        """Peer ids of the current hops, in layer order."""
        return [h.peer_id for h in self._hops]

    async def open(
        self,
        prefixes: tuple[tuple[int, bytes], ...] = (),
        prefix_rows: Callable[[int], np.ndarray] | None = None,
        prompt_tokens: int = 0,
        prompt_ids: np.ndarray | None = None,
    ) -> None:
        """Plan a route over every layer and open a session on each hop.

        Args:
            prefixes: (n_tokens, hash) offers of the prompt (swarm/kv/prefix.py), the last one the
                whole prompt; () offers nothing.
            prefix_rows: n → the first hop's input rows for positions [0, n) (the embedded prompt),
                used to rebuild the route when a replacement cannot restore a restored prefix.
            prompt_tokens: the prompt's length: a route caught computing wrong rolls back to the
                prompt's end at the earliest (0: to the token after the first wrong row).
            prompt_ids: with `spec.token_ids`, the prompt's token ids (`[prompt_tokens]` ints): the
                ids of a restored prefix's positions, which a rebuilt route replays; else ignored.
        After it, `pos` is the restored length: the caller's first step starts there.
        Raises:
            NoRoute: no chain of live peers with room, even after a fresh probe of excluded peers,
                or every attempt to open one failed.
            ValueError: `spec.token_ids` and prefixes offered without `prompt_ids`.
        """
        if self.spec.token_ids:
            if prompt_ids is None and prefixes:
                raise ValueError("a route whose Forwards carry token ids needs the prompt's ids to restore")
            if prompt_ids is not None:
                self._record_ids(0, prompt_ids)
        self._offers, self._prefix_rows, self.prompt_tokens = prefixes, prefix_rows, prompt_tokens
        self._hops = await self._open_stretch(0, self.spec.n_layers, None, fresh=True)
        self.telemetry.route = [h.telemetry for h in self._hops]
        await self._chain()
        self.restored_tokens = self.pos
        self.telemetry.reused_tokens = self.pos

    @property
    def verify_rows(self) -> int:
        """The largest verify group every hop of the route computes exactly as one-row steps."""
        return min((h.verify_rows for h in self._hops), default=1)

    async def step(self, x: np.ndarray, *, verify: bool = False, group_rows: int | None = None,
                   token_ids: np.ndarray | None = None, draft: bool = False,
                   ahead: Callable[[], Awaitable[tuple[np.ndarray, np.ndarray | None] | None]] | None = None,
                   ) -> Token:
        """Run `x` (`[n, hidden]` float32, positions pos..pos+n-1) through every hop.

        A failed hop is replaced and replayed, and the step continues (see the module docstring).
        Pipelined verify passes: `ahead` sends the next verify pass right after this one, before
        this one's answer is back, on the guess that this one keeps every row; a later `step` of
        exactly those rows at that position then only reads their answers. When the guess fails
        (fewer rows kept, other rows next, or the route changed), the pass sent ahead is never read
        and the next step rolls it back (`Forward.rewind`), as it does a pass's rejected rows.
        Args:
            x: the rows.
            verify: a verify pass (`Forward.verify`): the Token carries one sampled token per row.
            group_rows: a verify pass's rows per step (`Forward.steps`, recorded as such for replay);
                None: the route's `verify_rows`, recorded as one-row steps (they compute as such).
            token_ids: `[n]` the rows' token ids; required with `spec.token_ids`, else ignored.
            draft: with `mtp_drafts`, ask the last span for its MTP head's drafts after the sampled
                token (a step whose token is kept: a prompt's last chunk, a decode step).
            ahead: with `verify` on a chained route (server push), awaited once this pass is on its
                way to the first hop: the next verify pass's rows `[m, hidden]` float32 (positions
                pos+n..pos+n+m-1) and their `[m]` token ids (None without `spec.token_ids`), sent
                at once; None from it sends nothing. Else ignored.
        Returns:
            Token: the last hop's sampled token after the last row (`tokens`: after every row).
        Raises:
            Rewound: a spot check caught a hop computing wrong: the route was rebuilt and rolled
                back, and `x` (computed from wrong text) was not run.
            SwarmError: more than policy.max_failovers failovers, or no replacement for a failed hop.
            ValueError: `spec.token_ids` and no `[n]` token ids given.
        """
        if self.spec.token_ids and (token_ids is None or len(token_ids) != x.shape[0]):
            raise ValueError(f"this model's Forwards carry token ids: give {x.shape[0]}, one per row")
        if await self._apply_checks():
            raise Rewound(self.pos, self._replayed_token)
        self._want_draft = self.mtp_drafts if draft else 0
        pos0, i, x0 = self.pos, 0, x
        if self.spec.token_ids:
            self._record_ids(pos0, token_ids)
        pushed_step: int | None = None  # the step hop i's input was pushed with (None: send it)
        sent, self._ahead = self._ahead, None
        if sent is not None and not (verify and sent.carries(pos0, x, self._row_ids(pos0, x.shape[0]), self._hops)):
            sent, self._stale = None, True  # the hops computed it past `pos`: roll it back
        if sent is not None:
            pushed_step, steps, record = sent.step, sent.steps, sent.record
        else:
            steps, record = self._verify_steps(x.shape[0], verify, group_rows)
        rewind, push, sent_push = self._stale, sent is not None, sent is not None
        send_ahead = ahead if verify else None
        sent_ahead, n_sent = False, self.ahead_sent
        while i < len(self._hops):
            hop, t_start, n_after = self._hops[i], self._now(), len(self._hops) - i - 1
            try:
                if pushed_step is None:
                    if i:
                        # A later hop is sent this step by relay while the pass sent ahead may reach it
                        # by push: nothing orders the two streams, so that pass may have run before
                        # this step there. It is never read; the next step rolls it back.
                        self._ahead = None
                    # a hop that restores a prefix first must be sent its step: a pushed frame cannot say so
                    push = self.chained and not any(h.pending_restore for h in self._hops)
                    sent_push = sent_push or push
                    then = None  # the first hop is sent the pass ahead once, right after this one
                    if i == 0 and push and send_ahead is not None and not sent_ahead:
                        then, sent_ahead = self._sender_ahead(pos0 + x.shape[0], send_ahead, group_rows), True
                    reply = await self._forward(hop, pos0, x, push=push, rewind=rewind, steps=steps,
                                                verify=verify, then=then)
                elif i == 0:  # sent ahead behind the step before: its answer only
                    if send_ahead is not None and not sent_ahead:
                        sent_ahead = True
                        await self._sender_ahead(pos0 + x.shape[0], send_ahead, group_rows)()
                    reply = await self._ahead_reply(hop, sent, x)
                else:
                    reply = await self._pushed_reply(hop, pushed_step, x.shape, verify)
                    if reply.receipt and reply.receipt != receipt(x, self._row_ids(pos0, x.shape[0])):
                        self._ahead = None  # the route relays from now on: a pass sent ahead is never read
                        self._chain_broken(i)  # it computed other rows than the pusher says it sent
                        pushed_step, rewind = None, True
                        if not self.spec.rollback_exact:  # hop i holds the step: it cannot roll back
                            await self._restart()
                            i, x = 0, x0
                        continue
            except _HopFailed as f:
                self._ahead, sent = None, None  # the route changes: a pass sent ahead is never read
                # a later hop may hold this step from a push; if it cannot roll back, start afresh
                whole = not self.spec.rollback_exact and sent_push and n_after > 0
                if await self._fail_over(i, f.error, t_start, whole_route=whole):
                    i, x = 0, x0  # the whole route was rebuilt: run this step from the first hop
                else:
                    rewind = True  # later hops may hold this step already, from a push before the failure
                pushed_step = None
                steps, record = self._verify_steps(x.shape[0], verify, group_rows)  # new hops, new group
                continue
            hop.inputs.extend(split_steps(x, record))
            if isinstance(reply, Token):
                if verify:
                    hop.claims.update((pos0 + j + 1, t) for j, t in enumerate(reply.tokens))
                else:
                    hop.claims[pos0 + x.shape[0]] = reply.token
                self._last_pos0, self.pos = pos0, pos0 + x.shape[0]
                # a pass sent ahead, then dropped in a failover: the hops hold its rows past `pos`
                self._stale = self.ahead_sent > n_sent and self._ahead is None
                self.ahead_used += sent is not None
                if reply.draft:  # the head's guess of the token after the one the next step feeds
                    self.telemetry.mtp_drafts[self._drafted_at(pos0, x.shape[0], verify, reply)] = reply.draft
                if self.checks is not None:
                    self.checks.after_step(x.shape[0], self._check_records)
                return reply
            x, i = np.asarray(reply.hidden, dtype=np.float32), i + 1
            pushed_step = reply.step if reply.pushed else None
            # a push that failed half-way may still have reached the next hop: relay with rewind
            rewind = rewind or (push and pushed_step is None)
        raise NoRoute("the route has no hops")

    def _drafted_at(self, pos0: int, n: int, verify: bool, reply: Token) -> int:
        """The position `reply.draft` guesses the token of: after a verify pass, the one after the
        token sampled after its accepted rows (`Token.draft`), else after the step's own token."""
        if not verify or not self.spec.token_ids:
            return pos0 + n + 1
        return pos0 + len(accepted(self._row_ids(pos0 + 1, n - 1).tolist(), reply.tokens)) + 1

    def _verify_steps(
        self, n: int, verify: bool, group_rows: int | None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the steps a step of n rows is sent as, the steps it is recorded as): see `step`."""
        if not verify:
            return (), ()
        steps = verify_steps(n, group_rows or self.verify_rows)
        return steps, (steps if group_rows else (1,) * n)

    def keep(self, n: int) -> None:
        """Keep only the first `n` rows of the last step (a verify pass): `pos` goes back to where
        they end, every hop's recorded inputs are cut there, and the next step rolls the hops back
        (`Forward.rewind`) before computing.

        Raises:
            ValueError: n < 1 or more rows than the last step had.
        """
        n_last = self.pos - self._last_pos0
        if not 1 <= n <= n_last:
            raise ValueError(f"keep {n} rows of a step of {n_last}")
        new_pos = self._last_pos0 + n
        if new_pos == self.pos:
            return
        for hop in self._hops:
            drop_rows(hop.inputs, self.pos - new_pos)
            for p in [p for p in hop.claims if p > new_pos]:  # answers to the rejected rows
                del hop.claims[p]
        # the pass's own guess (Token.draft) is at new_pos + 1; others past it were made after rejected rows
        for p in [p for p in self.telemetry.mtp_drafts if p > new_pos + 1]:
            del self.telemetry.mtp_drafts[p]
        self.pos, self._stale = new_pos, True

    async def close(self) -> None:
        """Close every link this session opened, half-opened ones too, and drop recorded inputs;
        stop the spot checks in flight (or wait for them: `SpotChecks.settle_on_close`)."""
        if self.checks is not None:
            await self.checks.close()
        for hop in self._hops:
            hop.inputs.clear()
        self._hops = []
        links, self._links = list(self._links), set()
        closing = [link.close() for link in links] + list(self._closing)
        await asyncio.gather(*closing, return_exceptions=True)

    # -- steps -------------------------------------------------------------------------------------

    def _record_ids(self, pos0: int, ids) -> None:
        """Note the token ids of positions pos0.. (`spec.token_ids`)."""
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        end = pos0 + ids.shape[0]
        if end > self._ids.shape[0]:
            self._ids = np.concatenate([self._ids, np.zeros(end - self._ids.shape[0], np.int32)])
        self._ids[pos0:end] = ids

    def _row_ids(self, pos0: int, n: int) -> np.ndarray:
        """The `Forward.token_ids` of rows at positions [pos0, pos0 + n): their ids with
        `spec.token_ids`, else none (empty)."""
        return self._ids[pos0 : pos0 + n].copy() if self.spec.token_ids else np.zeros(0, np.int32)

    async def _restart(self) -> None:
        """Rebuild the whole route into fresh sessions, replayed up to `pos`: for a model whose hops
        cannot roll back (`spec.rollback_exact` False), where a hop may hold rows past `pos`."""
        self._hops = await self._rebuild()
        self.telemetry.route = [h.telemetry for h in self._hops]
        await self._chain()

    async def _forward(
        self, hop: _Hop, pos0: int, x: np.ndarray, push: bool = False, rewind: bool = False,
        steps: tuple[int, ...] = (), verify: bool = False,
        then: Callable[[], Awaitable[None]] | None = None,
    ) -> Hidden | Token:
        """Send hop a step of rows `x` at `pos0` and return its checked answer; `then` runs after
        the send, before the answer is awaited (a pass sent ahead)."""
        last = hop.span.end == self.spec.n_layers
        ids = self._row_ids(pos0, x.shape[0])
        frame = Forward(step=self._step, pos0=pos0, hidden=x, restore=hop.pending_restore,
                        push=push and not last, rewind=rewind and not hop.pending_restore, steps=steps,
                        verify=verify, token_ids=ids, want_draft=self._want_draft)
        self._step += 1
        reply = await self._exchange(hop, frame, step_timeout_s(hop.span, x.shape[0], self.policy, steps), then)
        hop.pending_restore = 0
        return self._with_receipt(hop, self._checked(hop, reply, x.shape, verify), x, ids)

    def _with_receipt(self, hop: _Hop, reply: Hidden | Token, x: np.ndarray, ids: np.ndarray) -> Hidden | Token:
        """`reply`, unless its receipt is of other rows than `x` with token ids `ids` (_HopFailed)."""
        if reply.receipt and reply.receipt != receipt(x, ids):
            raise _HopFailed(
                hop.span, ProtocolError(f"peer {hop.peer_id[:12]}… answered with the receipt of other rows")
            )
        return reply

    def _sender_ahead(
        self, pos0: int, ahead: Callable[[], Awaitable[tuple[np.ndarray, np.ndarray | None] | None]],
        group_rows: int | None,
    ) -> Callable[[], Awaitable[None]]:
        """Sends the verify pass that `ahead` gives (rows, token ids; None: none) at `pos0` to the
        first hop with push, noting it as `_ahead`; a failed send only means it is not sent (the
        next step sends its rows)."""

        async def send() -> None:
            rows = await ahead()
            if rows is None or not rows[0].shape[0]:
                return
            x, ids = rows
            hop = self._hops[0]
            if self.spec.token_ids:
                self._record_ids(pos0, ids)
            steps, record = self._verify_steps(x.shape[0], True, group_rows)
            frame = Forward(step=self._step, pos0=pos0, hidden=x, push=True, steps=steps, verify=True,
                            token_ids=self._row_ids(pos0, x.shape[0]), want_draft=self._want_draft)
            self._step += 1
            timeout_s = step_timeout_s(hop.span, x.shape[0], self.policy, steps)
            try:
                hop.telemetry.bytes_sent += await hop.link.send(frame, timeout_s)
            except SwarmError:
                return
            self._ahead = _Ahead(frame.step, pos0, x, frame.token_ids, tuple(self._hops), steps, record)
            self.ahead_sent += 1

        return send

    async def _ahead_reply(self, hop: _Hop, sent: _Ahead, x: np.ndarray) -> Hidden | Token:
        """The first hop's answer to the verify pass `sent` ahead (rows `x`)."""
        t0 = self._now()
        reply = await self._receive(hop, sent.step, step_timeout_s(hop.span, x.shape[0], self.policy, sent.steps), t0)
        return self._with_receipt(hop, self._checked(hop, reply, x.shape, True), x,
                                  self._row_ids(sent.pos0, x.shape[0]))

    async def _pushed_reply(
        self, hop: _Hop, step: int, shape: tuple[int, ...], verify: bool
    ) -> Hidden | Token:
        """The answer of `hop` to the step the previous hop pushed to it."""
        t0 = self._now()
        reply = await self._receive(hop, step, step_timeout_s(hop.span, shape[0], self.policy), t0)
        hop.telemetry.pushed_steps += 1
        return self._checked(hop, reply, shape, verify)

    def _checked(
        self, hop: _Hop, reply: Frame, shape: tuple[int, ...], verify: bool = False
    ) -> Hidden | Token:
        last = hop.span.end == self.spec.n_layers
        if (last and isinstance(reply, Token) and len(reply.tokens) == (shape[0] if verify else 0)) or (
            not last and isinstance(reply, Hidden) and reply.hidden.shape == shape
        ):
            return reply
        raise _HopFailed(
            hop.span, ProtocolError(f"peer {hop.peer_id[:12]}… answered a bad {type(reply).__name__}")
        )

    async def _exchange(
        self, hop: _Hop, frame: Frame, timeout_s: float, then: Callable[[], Awaitable[None]] | None = None
    ) -> Frame:
        """Send `frame` to the hop and return its answer (an Error raises _HopFailed): relaying is
        a send and the receive of the matching answer, over the one link protocol. `then` runs
        between the two."""
        t0 = self._now()
        try:
            hop.telemetry.bytes_sent += await hop.link.send(frame, timeout_s)
        except SwarmError as e:
            raise _HopFailed(hop.span, e) from e
        if then is not None:
            t_then = self._now()
            await then()
            t0 += self._now() - t_then  # the hop's time to answer does not include ours
        return await self._receive(hop, getattr(frame, "step", None), timeout_s, t0)

    async def _receive(self, hop: _Hop, step: int | None, timeout_s: float, t0: float) -> Frame:
        """The hop's next answer to `step` (None: to a frame without one, e.g. Chain), skipping
        answers to steps this session has given up on; an Error raises _HopFailed."""
        deadline = t0 + timeout_s
        while True:
            try:
                reply, received = await hop.link.recv(max(0.0, deadline - self._now()))
            except SwarmError as e:
                raise _HopFailed(hop.span, e) from e
            hop.telemetry.bytes_received += received
            if isinstance(reply, OpenOk) and hop.acks_due:
                hop.acks_due -= 1  # a Chain's acknowledgement: the peer took its place in the chain
                continue
            if not isinstance(reply, (Hidden, Token)) or reply.step == step:
                return self._account(hop, reply, t0)
            hop.telemetry.skipped_replies += 1

    def _account(self, hop: _Hop, reply: Frame, t0: float) -> Frame:
        rtt_ms = (self._now() - t0) * 1000.0
        t = hop.telemetry
        t.steps += 1
        if isinstance(reply, Error):
            raise _HopFailed(hop.span, error_of(hop.peer_id, reply))
        compute_ms = getattr(reply, "compute_ms", 0.0)
        t.compute_ms += compute_ms
        t.network_ms += max(0.0, rtt_ms - compute_ms)
        return reply

    async def _chain(self) -> None:
        """Chain the current route for server push (see the module docstring): a `Chain` to every
        hop, not waited for (each acknowledgement is read before that hop's next answer), so that
        chaining costs no round trip. A hop the Chain cannot reach fails over on its next step."""
        self.chained = self._push_addrs is not None and len(self._hops) > 1 and not self._push_broken
        if not self.chained:
            return
        hops = self._hops
        for i, hop in enumerate(hops):
            nxt = hops[i + 1] if i + 1 < len(hops) else None
            addrs, direct, relay = self._push_addrs(nxt.peer_id) if nxt else ((), (), ())
            frame = Chain(
                next_peer=nxt.peer_id if nxt else "",
                next_session=nxt.session_id if nxt else b"",
                next_addrs=addrs[:MAX_CHAIN_ADDRS],
                next_direct=direct[:MAX_CHAIN_ADDRS],
                next_relay=relay[:MAX_CHAIN_ADDRS],
                prev_peer=hops[i - 1].peer_id if i else "",
            )
            try:
                hop.telemetry.bytes_sent += await hop.link.send(frame, self.policy.open_timeout_s)
            except SwarmError:
                continue
            hop.acks_due += 1

    # -- spot checks -------------------------------------------------------------------------------

    def _check_records(self) -> list[HopRecord]:
        """Copies of what a spot check of each checkable hop needs: every hop that computed every
        step from position 0, with its answers: for a non-last hop the next hop's recorded inputs,
        step for step; for the last hop the tokens it answered (`_Hop.claims`)."""
        out = []
        for hop, nxt in zip(self._hops, self._hops[1:]):
            if hop.base or nxt.base or len(hop.inputs) != len(nxt.inputs) or not hop.inputs:
                continue
            if any(a.shape != b.shape for a, b in zip(hop.inputs, nxt.inputs)):
                continue
            ids = self._row_ids(0, sum(b.shape[0] for b in hop.inputs))
            out.append(HopRecord(hop.span, tuple(hop.inputs), tuple(nxt.inputs), self._offers, self._step,
                                 ids))
        last = self._hops[-1] if self._hops else None
        if last is not None and not last.base and last.inputs and last.claims:
            ids = self._row_ids(0, sum(b.shape[0] for b in last.inputs))
            out.append(HopRecord(last.span, tuple(last.inputs), (), self._offers, self._step, ids,
                                 claims=dict(last.claims)))
        return out

    def _chain_broken(self, i: int) -> None:
        """Hop i's receipt is not of the rows hop i-1 says it pushed to it: one of the two altered
        them (in transit, or in its answer). The step is relayed again with `rewind`, and the rest of
        the generation relays every step; the spot checks record it (`SpotChecks.chain_break`)."""
        self.chained, self._push_broken = False, True
        if self.checks is not None:
            self.checks.chain_break(self._hops[i - 1].span, self._hops[i].span, self.pos)

    async def verify_prefill(self) -> Token | None:
        """With `CheckPolicy.verify_prefill`: check every checkable hop's prompt rows now, before the
        first token is given out; a caught hop is dropped and the route rebuilt, and the rebuilt
        route's token after the prompt is returned (None: nothing was caught, or no checks)."""
        if self.checks is None or not self.checks.ctx.policy.verify_prefill:
            return None
        await self.checks.check_now(self._check_records())
        return self._replayed_token if await self._apply_checks() else None

    async def settle(self) -> Token | None:
        """Wait for the spot checks in flight (the generation's last token is out); when one caught
        a hop of the route, drop it and roll back as a step would (`_drop_caught`) and return the
        rebuilt route's token at the new `pos` (the caller generates on from there); None: nothing
        was caught, no checks, or `CheckPolicy.settle_at_end` is off."""
        if self.checks is None or not self.checks.ctx.policy.settle_at_end:
            return None
        await self.checks.wait()
        return self._replayed_token if await self._apply_checks() else None

    async def _apply_checks(self) -> bool:
        """Drop every hop a spot check caught since the last step, rebuilding the route and rolling
        it back to the earliest first wrong row; True when it rolled back (`_replayed_token` is then
        the rebuilt route's token at the new `pos`)."""
        if self.checks is None:
            return False
        rewound = False
        for event in self.checks.take_caught():
            i = next((k for k, h in enumerate(self._hops) if h.peer_id == event.peer_id), None)
            if i is not None:
                await self._drop_caught(i, event)
                rewound = True
        return rewound

    async def _drop_caught(self, i: int, caught: CheckEvent) -> None:
        """Replace hop i, caught computing wrong, by rebuilding the whole route, rolled back to the
        token after its first wrong row (`rewind_position`): every later hop's KV cache holds states
        computed from its wrong outputs, and every token sampled after that row may be wrong, so the
        route is replayed from the embedded rows of the tokens that stand (the spot check already
        excluded the peer). No prefix snapshot is restored: a peer after the liar may have kept one
        of the prompt computed from the liar's rows."""
        hop, t0 = self._hops[i], self._now()
        if len(self.telemetry.failovers) >= self.policy.max_failovers:
            raise SwarmError(f"gave up after {self.policy.max_failovers} failovers in one generation")
        message = (f"spot check: rel L2 {caught.rel_l2:.3g} outside the band {caught.max_rel_l2:.3g} "
                   f"at position {caught.position}")
        event = FailoverEvent(hop.peer_id, hop.span.start, hop.span.end, FailureReason.WRONG_OUTPUT.value,
                              message, self.pos)
        self.telemetry.failovers.append(event)
        first = caught.first_outside if caught.first_outside >= 0 else caught.position
        self.pos = event.rewound_to = rewind_position(first, self.prompt_tokens, self.pos)
        self._last_pos0, self._stale, self._offers = self.pos, False, ()
        self._replayed_token = None
        self._hops = await self._rebuild()
        self.telemetry.route = [h.telemetry for h in self._hops]
        await self._chain()
        event.restored_tokens = min(h.base for h in self._hops)
        event.replayed_tokens = self.pos - event.restored_tokens
        event.replacements = [h.peer_id for h in self._hops]
        event.stall_ms = (self._now() - t0) * 1000.0

    # -- failover ----------------------------------------------------------------------------------

    async def _fail_over(self, i: int, error: SwarmError, t_start: float, whole_route: bool = False) -> bool:
        """Replace hop i by new hops for its layers, caught up to `self.pos` by replay (after the
        longest prefix they can restore). Returns True when the whole route had to be rebuilt
        instead (the caller reruns the step from the first hop): when no such hops could be had, or
        at once with `whole_route`."""
        hop = self._hops[i]
        if len(self.telemetry.failovers) >= self.policy.max_failovers:
            raise SwarmError(
                f"gave up after {self.policy.max_failovers} failovers in one generation; last: {error}"
            ) from error
        reason = failure_reason(error)
        self._exclusions.add(hop.peer_id, reason, self._now(), hop.span.incarnation)
        # Saying Close to a frozen peer can take its timeout: do it beside the failover, not before.
        self._links.discard(hop.link)
        closing = asyncio.ensure_future(hop.link.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        rows = clip_steps(hop.inputs, 0, self.pos - hop.base) if hop.inputs else None
        event = FailoverEvent(hop.peer_id, hop.span.start, hop.span.end, reason.value, str(error), self.pos)
        self.telemetry.failovers.append(event)
        # The snapshot this generation planned from is seconds old and already lists the failed hop's
        # peers of the same span: re-plan from it, and read the DHT only if it has no replacement.
        rebuilt = whole_route
        if not whole_route:
            try:
                new = await self._open_stretch(hop.span.start, hop.span.end, rows, fresh=False, base=hop.base)
                self._hops[i : i + 1] = new
            except (CannotRestore, NoRoute):
                # NoRoute: no chain of live spans joins exactly the failed hop's boundaries, though a
                # whole new route may (other peers' spans start or end elsewhere).
                if len(self._hops) == 1:
                    raise
                rebuilt = True
        if rebuilt:
            new = self._hops = await self._rebuild()
        hop.inputs.clear()  # after a rebuild, which replays the first hop's recorded rows
        self.telemetry.route = [h.telemetry for h in self._hops]
        await self._chain()
        event.restored_tokens = min(h.base for h in new)
        event.replayed_tokens = self.pos - event.restored_tokens if rows is not None or rebuilt else 0
        event.replacements = [h.peer_id for h in new]
        event.stall_ms = (self._now() - t_start) * 1000.0
        return rebuilt

    async def _rebuild(self) -> list[_Hop]:
        """Close every hop and open a new route over all layers, replayed from the first hop's rows
        (the restored prompt prefix it never computed, in prefill chunks, then its recorded steps)."""
        first = self._hops[0]
        prefix = self._prefix_rows(first.base) if first.base else None
        rows = rebuild_rows(prefix, first.inputs, self.pos - first.base, self.policy.replay_chunk_tokens)
        for h in self._hops:
            h.inputs.clear()
            if h.link in self._links:  # the failed hop's link is already closing beside the failover
                await self._drop(h.link)
        return await self._open_stretch(0, self.spec.n_layers, rows, fresh=False, base=0)

    async def _open_stretch(
        self, start: int, end: int, rows: list[np.ndarray] | None, fresh: bool, base: int = 0
    ) -> list[_Hop]:
        """Open hops chaining layers [start, end) and replay `rows` (recorded steps, one block each,
        positions base..) through them, after the longest prefix all of them can restore
        (swarm/route/restore.py).
        `fresh`: plan the first attempt from a new DHT read (later attempts always read anew). Up to
        max_open_attempts plans, with backoff between them; the last NoRoute is raised as it is.
        Raises:
            CannotRestore: base > 0 and the new hops cannot restore a prefix of at least `base`."""
        last_error: SwarmError | None = None
        for attempt in range(self.policy.max_open_attempts):
            await self._sleep(backoff_s(attempt, self.policy, self._rng))
            try:
                hops, spans = await self._plan(start, end, fresh=plan_fresh(attempt, fresh))
            except NoRoute as e:
                action = after_no_route(attempt, self.policy, opening=fresh,
                                        too_long=isinstance(e, SessionTooLong))
                if action is NoRouteAction.RETRY:
                    continue
                if action is NoRouteAction.RAISE_GONE:
                    raise NoRoute(
                        f"no live peer left for layers {layer_ranges(e.missing)} can hold this "
                        f"session: it needs {e.need_tokens} KV tokens, they take at most {e.most_tokens}",
                        e.missing,
                    ) from e
                raise
            opened: list[_Hop] = []
            try:
                opened = await self._open_hops(hops, spans)
                restore = restore_point([h.restorable for h in opened], base, self.pos,
                                        self._offers[-1][0] if self._offers else None)
                for h in opened:
                    h.base = h.pending_restore = restore
                    h.telemetry.reused_tokens = restore
                if rows is None:
                    self.pos = max(self.pos, restore)
                elif restore < self.pos:
                    await self._replay(opened, clip_steps(rows, restore - base), restore)
                return opened
            except CannotRestore:
                for h in opened:
                    await self._drop(h.link)
                raise
            except _HopFailed as f:
                last_error = f.error
                self.telemetry.retries += 1
                self._exclusions.add(f.span.peer_id, failure_reason(f.error), self._now(), f.span.incarnation)
                for h in opened:
                    await self._drop(h.link)
        raise NoRoute(
            f"could not open layers [{start}, {end}) after {self.policy.max_open_attempts} attempts; "
            f"last error: {last_error}"
        )

    async def _plan(self, start: int, end: int, fresh: bool) -> tuple[tuple[Hop, ...], dict[str, PeerSpan]]:
        """Plan [start, end) around excluded peers. Before giving up: read the DHT anew (if the
        plan came from the directory's last read), then probe the peers excluded for not answering
        (timeout, unreachable) afresh, once, and plan over every record either read showed (a DHT
        slowed by a frozen node can let a live peer's record lapse for a moment)."""
        spans = await self._directory.peers(self._exclusions.active(self._now()), fresh)
        try:
            return self._plan_over(spans, start, end)
        except NoRoute:
            seen = {s.peer_id: s for s in spans}
            if not fresh:
                newer = await self._directory.peers(self._exclusions.active(self._now()), True)
                seen.update((s.peer_id, s) for s in newer)
                try:
                    return self._plan_over(list(seen.values()), start, end)
                except NoRoute:
                    pass
            # A probe proves only that a peer is alive again: it clears liveness failures, not a
            # peer that answered garbage or said it is busy.
            suspects = self._exclusions.liveness_suspects(self._now())
            if not suspects:
                return self._plan_over(list(seen.values()), start, end)
            self._exclusions.forgive(await self._directory.probe(suspects))
            return self._plan_over(list(seen.values()), start, end)

    def _plan_over(
        self, spans: list[PeerSpan], start: int, end: int
    ) -> tuple[tuple[Hop, ...], dict[str, PeerSpan]]:
        now = self._now()
        for s in spans:
            if s.rtt_ms == float("inf"):
                self._exclusions.add(s.peer_id, FailureReason.UNREACHABLE, now, s.incarnation)
        exclude = self._exclusions.active(now, {s.peer_id: s.incarnation for s in spans})
        plan = plan_route(
            spans, self.spec.n_layers, self.spec.n_tokens, start=start, end=end, exclude=exclude,
            penalty_ms=self.checks.penalties() if self.checks is not None else None,
            unreachable=frozenset(self._exclusions.liveness_suspects(now)),
        )
        return plan.hops, {s.peer_id: s for s in spans}

    async def _open_hops(self, hops: tuple[Hop, ...], spans: dict[str, PeerSpan]) -> list[_Hop]:
        """Open every hop of a plan at once, in route order. Each open costs round trips (dial, stream,
        Open/OpenOk), several on a WAN; opening hops in turn would add them up in the TTFT.
        Raises:
            _HopFailed: the first hop in route order that failed (every other failed hop is excluded
                here; the hops that opened are dropped)."""
        results = await asyncio.gather(*(self._open_hop(h, spans[h.peer_id]) for h in hops),
                                       return_exceptions=True)
        opened = [r for r in results if isinstance(r, _Hop)]
        errors = [r for r in results if not isinstance(r, _Hop)]
        if not errors:
            return opened
        for hop in opened:
            await self._drop(hop.link)
        for e in errors[1:]:
            if isinstance(e, _HopFailed):
                self._exclusions.add(e.span.peer_id, failure_reason(e.error), self._now(), e.span.incarnation)
        raise errors[0]

    async def _open_hop(self, h: Hop, span: PeerSpan) -> _Hop:
        spec = self.spec
        frame = Open(
            session_id=self._rng.randbytes(16),
            client_id=spec.client_id,
            model_id=spec.model_id,
            start=h.start,
            end=h.end,
            max_tokens=spec.n_tokens,
            sampling=spec.sampling,
            prefixes=self._offers,
        )
        try:
            link = await self._transport.connect(h.peer_id, self.policy.open_timeout_s)
        except SwarmError as e:
            raise _HopFailed(span, e) from e
        self._links.add(link)
        telemetry = HopTelemetry(peer_id=h.peer_id, start=h.start, end=h.end, transport=link.transport,
                                 direct_error=link.direct_error)
        hop = _Hop(span, link, telemetry, [], session_id=frame.session_id)
        try:
            reply = await self._exchange(hop, frame, self.policy.open_timeout_s)
            if not isinstance(reply, OpenOk):
                raise _HopFailed(span, ProtocolError(f"peer {h.peer_id[:12]}… answered open with {reply}"))
        except _HopFailed:
            await self._drop(link)
            raise
        hop.restorable = frozenset(reply.restorable)
        hop.verify_rows = hop.telemetry.verify_rows = reply.verify_rows
        hop.telemetry.fetched_from = reply.fetched_from
        return hop

    async def _replay(self, hops: list[_Hop], blocks: list[np.ndarray], start: int = 0) -> None:
        """Send recorded steps (one block each, positions start..) through `hops`, many to a frame but
        each computed as its own step (swarm/route/replay.py), recording each hop's inputs per step."""
        pos0 = start
        # a frame holds at least the longest recorded step: cutting one would regroup its rows
        max_rows = max([self.policy.replay_chunk_tokens, *(b.shape[0] for b in blocks)])
        for x, steps in replay_frames(blocks, max_rows, MAX_FORWARD_STEPS):
            n = x.shape[0]
            for hop in hops:
                reply = await self._forward(hop, pos0, x, steps=steps)
                hop.inputs.extend(split_steps(x, steps))
                if isinstance(reply, Hidden):
                    x = np.asarray(reply.hidden, dtype=np.float32)
                else:
                    self._replayed_token = reply
            pos0 += n

    async def _drop(self, link: HopLink) -> None:
        self._links.discard(link)
        await link.close()
