"""Spot checks of a route's hops: replaying a hop's recorded steps on another peer and comparing.

A `SpotChecks` rides along one `RouteSession` (its `checks` hook). After each decode step the
schedule (swarm/route/verify.py) may start a check of one hop, as a task beside the generation
(which goes on meanwhile): the hop's recorded input rows since its previous check are sent
(`CheckPolicy.regroup`, the default) as a prefill (frames of the replay chunk, computed in the
peers' 64-row ubatches, with the rows' token ids where Forwards carry them) to a checker, the
cheapest other peer (or chain of peers) serving the same layers, and every row's output is compared
with what the checked peer returned (its next hop's recorded inputs) within the band. The first
check of a hop opens a session there and sends every row from position 0; the session stays open
for the generation, its KV cache holding the rows checked so far, so each later check of that hop
sends only the rows after them and every row is replayed about once per generation, not once per
check. A checker whose session ended, or whose rows no longer begin the hop's (the route rolled
back), is closed and a fresh one replays from position 0. A prefill of k decode rows costs far less
than k one-row steps (VeriLLM's observation); the price is that the rows are grouped otherwise than
the checked peer computed them, which rounds differently (measured: rel L2 up to 0.0185 on
SmolLM2, 0.0156 on Qwen2.5 0.5B; scripts/bench_verify.py; the band covers it). Without `regroup`
the recorded steps are replayed as a failover replays them (`Forward.steps`), each its own step,
and an honest checker reproduces the answers bit for bit.

To the peer that runs it, a check is an ordinary session: the same Open (the generation's
reservation, sampling and prefix offers) and the Forward frames of a prompt prefill and later
chunks, with step numbers that continue the generation's own. What it can still infer: that the
rows repeat rows it may have seen in another session (a prompt and the tokens generated after
it), and that the session never decodes one row at a time. Disagreement is settled by a second
checker, in a fresh session replaying from position 0, when another peer serves the span: the side
two peers agree on is right (a lying checker is caught instead). Without a second checker the
checked peer is caught: it computed what a peer chosen by this client could not reproduce.

The first check (`CheckPolicy.first_check_step`) replays every checkable hop, one after another,
so a peer lying on every step is caught early wherever it sits in the route; so does a sweep every
`CheckPolicy.sweep_steps` decode steps after it (every 40 by default; their price is in
docs/benchmarks.md), so a peer lying now and then is caught within that many steps of its first
lie; each random check checks one hop, in turn. At most one check of a generation is in flight: a
random check that falls due while one runs is skipped, a sweep waits for it. A generation holds
one check session per checked hop on its checker (a slot and the generation's reservation there)
until it ends or the hop leaves the route.

A caught peer is excluded by this client for `CheckPolicy.caught_exclusion_s`, recorded in the
client's `Standing` (route pricing), in the generation's telemetry (`checks`) and in the evidence
file `swarm status` reads (`EVIDENCE_FILE` under the client's data directory); the route session
then drops it, rebuilds the route and rolls it back to the token after the first row outside the
band (`CheckEvent.first_outside`), which it recomputes (`RouteSession` applies `take_caught` before
its next step).

The last hop answers tokens, not hidden states: its check replays its recorded steps exactly as it
computed them (never regrouped), in verify passes where a frame is short enough (a token after every
row), and every token it answered must come back the same (`compare_tokens`): an honest checker
computes the same logits bit for bit and, with the session's seed, draws the same token.

What is not checked: hops that restored a prompt prefix from a snapshot (the checker would need the
same restore), and hops whose span no other peer serves.

This module does not: decide when to check or how to compare (swarm/route/verify.py), or change
the route (swarm/client/session.py does, between steps). It stays one file past the house's ~400
lines: a check's replay, verdict and consequences are one concern sharing the checker links and
the generation's state; the pure parts already live in swarm/route/.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from swarm.client.link import HopLink, HopTransport, PeerDirectory, error_of
from swarm.client.telemetry import CheckEvent, GenerationTelemetry
from swarm.errors import ProtocolError, SwarmError
from swarm.route.failover import Exclusions, FailoverPolicy, FailureReason, failure_reason, step_timeout_s
from swarm.route.plan import PeerSpan, plan_route
from swarm.route.replay import claim_frames, replay_frames
from swarm.route.verify import Band, CheckPolicy, CheckSchedule, Measure, Standing, compare, compare_tokens
from swarm.limits import MAX_VERIFY_ROWS
from swarm.wire import MAX_FORWARD_STEPS, Error, Forward, Hidden, Open, OpenOk, Token

logger = logging.getLogger(__name__)

EVIDENCE_FILE = "caught_peers.jsonl"
"""One JSON line per caught peer (a `CheckEvent`), under the client's data directory."""


class _CheckerFailed(Exception):
    """Internal: checker `span` failed with `error`."""

    def __init__(self, span: PeerSpan, error: SwarmError):
        super().__init__(str(error))
        self.span, self.error = span, error


@dataclass
class _Checker:
    """Check sessions kept open on a chain of peers serving one checked hop's layers, for the
    generation: the peers hold the hop's rows up to `rows` in their KV caches, so the hop's next
    check sends only the rows after them.

    Attributes:
        chain: the checker peers, in layer order.
        links: their open check sessions (fewer while opening).
        group_rows: the last peer's exact row group (`OpenOk.verify_rows`).
        sent: the hop's input blocks the chain holds, the record's own arrays: a later record
            must begin with the very same ones. A rollback, or a rebuild that replays the hop
            (whose replayed answers were then never checked), puts other arrays there.
        rows: rows in `sent`.
        step: the next Forward step number.
    """

    chain: list[PeerSpan]
    links: list[HopLink] = field(default_factory=list)
    group_rows: int = 1
    sent: list[np.ndarray] = field(default_factory=list)
    rows: int = 0
    step: int = 0

    @property
    def peer_ids(self) -> list[str]:
        return [s.peer_id for s in self.chain]

    def holds_prefix_of(self, inputs: tuple[np.ndarray, ...]) -> bool:
        """Whether the blocks this chain holds begin `inputs` (a hop's recorded steps now)."""
        return len(inputs) >= len(self.sent) and all(a is b for a, b in zip(self.sent, inputs))

    async def close(self) -> None:
        """Close the check sessions (idempotent)."""
        links, self.links = self.links, []
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)


def _hop_key(span: PeerSpan) -> tuple[str, int, int]:
    return span.peer_id, span.start, span.end


@dataclass(frozen=True)
class HopRecord:
    """What a check of one hop needs, copied when the check starts (the route moves on).

    Attributes:
        span: the checked peer's announced span.
        inputs: the hop's recorded input steps, `[rows_i, hidden]` float32 each, from position 0.
        outputs: what the hop answered for each of those steps, same shapes.
        offers: the generation's prefix offers (the checker's Open carries them too).
        step_number: the generation's next Forward step number (the check's frames continue it).
        token_ids: the token id of each input row (`[sum of rows]` int32, from position 0) for a
            model whose Forwards carry them (`Forward.token_ids`); empty for the others.
        claims: the last hop's record: position -> the token it answered there (`outputs` is then
            empty); empty for other hops.
    """

    span: PeerSpan
    inputs: tuple[np.ndarray, ...]
    outputs: tuple[np.ndarray, ...]
    offers: tuple[tuple[int, bytes], ...]
    step_number: int
    token_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    claims: Mapping[int, int] = field(default_factory=dict)


@dataclass
class CheckContext:
    """The parts a client's checks share: its peers' standing, its exclusions, where evidence goes.

    Attributes:
        policy: when to check and what a caught peer costs.
        band: the tolerance for this model and quantization type.
        standing: offences per peer (route pricing).
        evidence_dir: directory of `EVIDENCE_FILE`; None: evidence is not written.
    """

    policy: CheckPolicy
    band: Band
    standing: Standing
    evidence_dir: Path | None = None


class SpotChecks:
    """The spot checks of one generation's route (see the module docstring).

    Args:
        ctx: shared policy, band, standing and evidence directory.
        spec: the generation's `SessionSpec` (model, owner, reservation, sampling).
        directory, transport, exclusions, failover: the route session's own.
        telemetry: the generation's telemetry (`checks` is appended to).
        now: monotonic clock, seconds.
        rng: session ids of check sessions.
    """

    def __init__(self, ctx: CheckContext, spec, directory: PeerDirectory, transport: HopTransport,
                 exclusions: Exclusions, failover: FailoverPolicy, telemetry: GenerationTelemetry, *,
                 now: Callable[[], float], rng: random.Random):
        self.ctx, self.spec = ctx, spec
        self._directory, self._transport, self._exclusions = directory, transport, exclusions
        self._failover, self.telemetry, self._now, self._rng = failover, telemetry, now, rng
        seed_rng = random.Random(ctx.policy.seed) if ctx.policy.seed is not None else random.SystemRandom()
        self._schedule = CheckSchedule(ctx.policy, seed_rng)
        self._decode_step = 0
        self._sweep_waiting = False  # a sweep fell due while a check ran: it starts when that ends
        self._tasks: set[asyncio.Task] = set()
        self._caught: list[CheckEvent] = []
        self._convicted: set[str] = set()  # caught in this session: one offence each, no more checks
        self._checkers: dict[tuple[str, int, int], _Checker] = {}  # by checked hop: its kept checker
        self.settle_on_close = False
        """`close` waits for the checks in flight instead of stopping them (tests, benchmarks)."""

    def penalties(self) -> dict[str, float]:
        """Extra route cost per peer from its offences (`Standing.penalties`), ms per step."""
        return self.ctx.standing.penalties(self._now())

    def after_step(self, rows: int, records: Callable[[], list[HopRecord]]) -> None:
        """Called after each step of the route; a decode step (one row) may start a check.

        Args:
            rows: rows of the step just computed.
            records: the checkable hops' records now (called only when a check starts).
        """
        if rows != 1:
            return
        step, self._decode_step = self._decode_step, self._decode_step + 1
        kind = self._schedule.due(step)
        if kind == "sweep" or self._sweep_waiting:
            kind, self._sweep_waiting = "sweep", bool(self._tasks)
        if kind is None or self._tasks:
            return  # one check in flight per generation: checks never pile up on the checkers
        candidates = [r for r in records() if r.span.peer_id not in self._convicted]
        if not candidates:
            return
        if kind == "sweep":
            # every hop, one after another: a peer lying on every step is caught wherever it sits,
            # and one lying now and then by the sweep after its first lie
            task = asyncio.ensure_future(self._check_each(candidates, step))
        else:
            first = self._schedule.pick(range(len(candidates)))
            order = candidates[first:] + candidates[:first]
            task = asyncio.ensure_future(self._check_first(order, step))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def chain_break(self, pusher: PeerSpan, receiver: PeerSpan, position: int) -> None:
        """Record a receipt that broke the push chain at `position`: `receiver` computed other rows
        than `pusher` answered it had pushed. Which of the two lied cannot be told (each answers on
        its own stream), so both get an offence (route pricing) and neither is excluded."""
        now = self._now()
        event = CheckEvent(peer_id=pusher.peer_id, start=pusher.start, end=pusher.end, position=position,
                           rows=1, rel_l2=math.inf, cosine=-1.0, max_rel_l2=self.ctx.band.max_rel_l2,
                           min_cosine=self.ctx.band.min_cosine, checkers=[receiver.peer_id],
                           verdict="chain_break", decode_step=self._decode_step)
        event.offences = self.ctx.standing.record(pusher.peer_id, now)
        self.ctx.standing.record(receiver.peer_id, now)
        self.telemetry.checks.append(event)
        logger.warning("push chain broken at position %d between %s… and %s…: relaying from now on",
                       position, pusher.peer_id[:12], receiver.peer_id[:12])

    async def check_now(self, records: list[HopRecord]) -> None:
        """Check every hop of `records` now and wait for the verdicts (`CheckPolicy.verify_prefill`:
        the prompt's rows, before the first token); those caught are then in `take_caught`."""
        await self._drop_checkers(records)
        await asyncio.gather(*(self._check(r, -1) for r in records if r.span.peer_id not in self._convicted))

    def take_caught(self) -> list[CheckEvent]:
        """Checks that caught a peer since the last call (the route drops those peers)."""
        caught, self._caught = self._caught, []
        return caught

    async def wait(self) -> None:
        """Wait for the checks in flight (tests and benchmarks read their verdicts after)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Stop the checks in flight (the generation is over), or wait for them (`settle_on_close`);
        then close the kept check sessions."""
        if self.settle_on_close:
            await self.wait()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self._drop_checkers(())

    async def _drop_checkers(self, records: list[HopRecord] | tuple[()]) -> None:
        """Close the kept checkers of hops no longer among `records` (dropped from the route): their
        sessions would hold a slot on each checker for the rest of the generation."""
        keep = {_hop_key(r.span) for r in records}
        gone = [self._checkers.pop(k) for k in list(self._checkers) if k not in keep]
        await asyncio.gather(*(c.close() for c in gone))

    # -- one check -------------------------------------------------------------------------------

    async def _check_each(self, records: list[HopRecord], decode_step: int) -> None:
        """Check every hop of `records`, one after another (the generation's first check)."""
        await self._drop_checkers(records)
        for record in records:
            # in turn, not at once: replays side by side compete with the route for the cores of
            # a small machine (on 2 cores, at once cost 4-12.5% of decode tokens/s, in turn 2-3.5%:
            # docs/benchmarks.md "The first check's hops in turn")
            await self._check(record, decode_step)

    async def _check_first(self, order: list[HopRecord], decode_step: int) -> None:
        """Check the first hop of `order` that another peer can replay."""
        await self._drop_checkers(order)
        for record in order:
            event = await self._check(record, decode_step)
            if event is not None:
                return

    async def _check(self, record: HopRecord, decode_step: int) -> CheckEvent | None:
        """Check the rows `record`'s hop computed since its last check (all of them the first time,
        or when its checker is gone) on a checker, a second one on disagreement; None: nobody could,
        or nothing new to check."""
        span = record.span
        first = await self._recompute_new(record)
        if first is None:
            return None
        checker, ref, done = first
        try:
            claimed = self._claimed(record, done)
            m = self._compare(claimed, ref, done)
            event = self._event(record, m, done, checker.peer_ids, "ok")
            event.decode_step = decode_step
            if not m.within(self.ctx.band):
                # the second checker replays from position 0 in a fresh session: the first one's state
                # is what is in doubt
                second = await self._recompute(record, frozenset({span.peer_id, *checker.peer_ids}))
                if second is not None:
                    await second[0].close()
                    second = second[0].peer_ids, self._claimed_since(second[1], done)
                if second is not None and self._compare(second[1], ref, done).within(self.ctx.band):
                    event.checkers += second[0]
                    event.verdict = "caught"
                elif second is not None and self._compare(claimed, second[1], done).within(self.ctx.band):
                    event.checkers += second[0]
                    event.verdict = "checker_lied"
                else:
                    event.verdict = "caught"
        except BaseException:  # cancelled (the generation ended) while a second checker ran
            await checker.close()
            raise
        if event.verdict == "ok":
            self._checkers[_hop_key(span)] = checker  # the next check of this hop sends only newer rows
        else:
            await checker.close()
        self.telemetry.checks.append(event)
        if event.verdict == "caught":
            self._punish(event, span.peer_id, span.incarnation)
        elif event.verdict == "checker_lied" and len(checker.peer_ids) == 1:
            liar = self._event(record, self._compare(ref, claimed, done), done, [span.peer_id], "caught",
                               checker.peer_ids[0])
            liar.decode_step = decode_step
            self.telemetry.checks.append(liar)
            self._punish(liar, checker.peer_ids[0], 0.0)
        return event

    @staticmethod
    def _claimed(record: HopRecord, done: int) -> np.ndarray | Mapping[int, int]:
        """What `record`'s hop answered for its rows from position `done` on (a last hop: every
        token it answered; `compare_tokens` compares the positions the checker drew)."""
        return record.claims or np.concatenate(record.outputs)[done:]

    @staticmethod
    def _claimed_since(out: np.ndarray | dict[int, int], done: int) -> np.ndarray | dict[int, int]:
        """A full replay's outputs from position `done` on."""
        return out if isinstance(out, dict) else out[done:]

    def _compare(self, claimed: np.ndarray | Mapping[int, int], ref: np.ndarray | Mapping[int, int],
                 done: int) -> Measure:
        """Hidden states within the band, or (a last hop) tokens equal; `claimed` and `ref` are the
        rows from position `done` on (tokens: keyed by position), the measure's rows are positions."""
        if isinstance(claimed, Mapping):
            return compare_tokens(claimed, ref)
        m = compare(claimed, ref, self.ctx.band)
        return dataclasses.replace(m, row=m.row + done,
                                   first_outside=m.first_outside + done if m.first_outside >= 0 else -1)

    def _event(self, record: HopRecord, m: Measure, done: int, checkers: list[str], verdict: str,
               peer_id: str | None = None) -> CheckEvent:
        span = record.span
        return CheckEvent(
            peer_id=peer_id or span.peer_id, start=span.start, end=span.end, position=m.row,
            rows=sum(b.shape[0] for b in record.inputs) - done, rel_l2=m.rel_l2, cosine=m.cosine,
            max_rel_l2=self.ctx.band.max_rel_l2, min_cosine=self.ctx.band.min_cosine,
            checkers=list(checkers), verdict=verdict, first_outside=m.first_outside,
        )

    def _punish(self, event: CheckEvent, peer_id: str, incarnation: float) -> None:
        if peer_id in self._convicted:
            return  # another check in flight caught it first
        self._convicted.add(peer_id)
        now = self._now()
        event.offences = self.ctx.standing.record(peer_id, now)
        self._exclusions.add(peer_id, FailureReason.WRONG_OUTPUT, now, incarnation,
                             for_s=self.ctx.policy.caught_exclusion_s)
        self._caught.append(event)  # the route drops it if it is one of its hops
        logger.warning("spot check caught peer %s… on layers %d:%d: rel L2 %.3g (band %.3g), cosine %.6f at "
                       "position %d, first wrong at %d", peer_id[:12], event.start, event.end, event.rel_l2,
                       event.max_rel_l2, event.cosine, event.position, event.first_outside)
        if self.ctx.evidence_dir is not None:
            try:
                self.ctx.evidence_dir.mkdir(parents=True, exist_ok=True)
                with open(self.ctx.evidence_dir / EVIDENCE_FILE, "a") as f:
                    line = {"model_id": self.spec.model_id, "at": time.time(), **asdict(event)}
                    f.write(json.dumps(line) + "\n")
            except OSError as e:
                logger.warning("cannot record the evidence: %s", e)

    async def _recompute_new(self, record: HopRecord) -> tuple[_Checker, np.ndarray | dict[int, int], int] | None:
        """The outputs of `record`'s rows since this hop's last check, recomputed by the checker that
        checked it then (its session holds the rows before), or, when it has none or that one can
        no longer go on (gone, its session expired, the hop's rows before changed: a rollback), by
        a fresh one from position 0. Returns the checker, its outputs (a last hop's: tokens by
        position) and the position they start at; None when no checker could, or no row is new."""
        checker = self._checkers.pop(_hop_key(record.span), None)
        if checker is not None:
            excluded = self._exclusions.active(self._now())
            if checker.holds_prefix_of(record.inputs) and not excluded & set(checker.peer_ids):
                if len(record.inputs) == len(checker.sent):
                    self._checkers[_hop_key(record.span)] = checker
                    return None
                done = checker.rows
                try:
                    return checker, await self._send(checker, record), done
                except _CheckerFailed as f:  # no exclusion: its session may just have timed out
                    logger.info("spot check of layers %d:%d: the checker's session ended (%s); replaying "
                                "from the start", record.span.start, record.span.end, f.error)
                except BaseException:
                    await checker.close()
                    raise
            await checker.close()
        got = await self._recompute(record, frozenset({record.span.peer_id}))
        return None if got is None else (*got, 0)

    async def _recompute(self, record: HopRecord, exclude: frozenset[str]
                         ) -> tuple[_Checker, np.ndarray | dict[int, int]] | None:
        """The outputs of all of `record`'s steps (a last hop's: its tokens by position) recomputed
        in fresh sessions by the cheapest chain of other peers serving its layers, which stay open
        (the caller keeps or closes them); None when no such chain exists or every attempt failed
        (no verdict). A checker that fails (gone, busy, garbled) is excluded, as a failed hop is,
        and the next cheapest is tried, up to `FailoverPolicy.max_open_attempts` plans."""
        span = record.span
        for _ in range(self._failover.max_open_attempts):
            now = self._now()
            try:
                spans = await self._directory.peers(self._exclusions.active(now), False)
                plan = plan_route(spans, self.spec.n_layers, self.spec.n_tokens, start=span.start,
                                  end=span.end, exclude=self._exclusions.active(now) | exclude,
                                  penalty_ms=self.ctx.standing.penalties(now))
            except SwarmError:  # NoRoute among them
                return None
            by_id = {s.peer_id: s for s in spans}
            checker = _Checker([by_id[h.peer_id] for h in plan.hops])
            try:
                await self._open(checker, record.offers)
                return checker, await self._send(checker, record)
            except _CheckerFailed as f:
                await checker.close()
                logger.info("spot check of layers %d:%d: checker %s… failed: %s", span.start, span.end,
                            f.span.peer_id[:12], f.error)
                self._exclusions.add(f.span.peer_id, failure_reason(f.error), self._now(), f.span.incarnation)
            except BaseException:
                await checker.close()
                raise
        return None

    async def _send(self, checker: _Checker, record: HopRecord) -> np.ndarray | dict[int, int]:
        """Send `record`'s rows past those `checker` holds through its chain; the last peer's outputs
        for them, or for a last hop the tokens its checker drew, by position.

        A last hop's steps are replayed as recorded (each computed as it was), in verify passes
        where a frame is short enough (`Forward.verify`: a token after every row), so that an honest
        checker draws each claimed token again; a longer frame (the prompt's) answers its last row's.

        Raises:
            _CheckerFailed: a peer of the chain failed (the chain's state is then unknown).
        """
        blocks = list(record.inputs[len(checker.sent):])
        done, n = checker.rows, sum(b.shape[0] for b in blocks)
        exact = bool(record.claims)
        step = max(checker.step, record.step_number)  # a check's frames continue the generation's steps
        current = checker.chain[0]
        try:
            for link, current in zip(checker.links, checker.chain):
                last = exact and current is checker.chain[-1]
                outs, tokens, pos0 = [], {}, done
                for x, steps, verify in self._frames(blocks, last, exact, checker.group_rows):
                    frame = Forward(step=step, pos0=pos0, hidden=x, steps=steps, verify=verify,
                                    token_ids=record.token_ids[pos0 : pos0 + len(x)])
                    step, pos0 = step + 1, pos0 + frame.n_tokens
                    timeout_s = step_timeout_s(current, frame.n_tokens, self._failover, steps)
                    if last:
                        tokens.update(await self._tokens(link, frame, timeout_s))
                    else:
                        outs.append(await self._exchange(link, frame, timeout_s))
                if not last:
                    blocks = np.split(np.concatenate(outs), np.cumsum([b.shape[0] for b in blocks])[:-1])
        except SwarmError as e:
            raise _CheckerFailed(current, e) from e
        checker.sent, checker.rows, checker.step = list(record.inputs), done + n, step
        return tokens if exact else np.concatenate(blocks)

    def _frames(self, blocks: list[np.ndarray], last: bool, exact: bool, group_rows: int):
        """The check's frames: (rows, Forward.steps, Forward.verify). One prefill in frames of the
        replay chunk (`CheckPolicy.regroup`, unless `exact`), or the recorded steps as a failover
        replays them; the last span of a last hop's check in verify passes (`claim_frames`, short
        steps in the checker's exact group `group_rows`)."""
        chunk = self._failover.replay_chunk_tokens
        max_rows = max([chunk, *(b.shape[0] for b in blocks)])
        if last:
            return claim_frames(blocks, max_rows, MAX_FORWARD_STEPS, MAX_VERIFY_ROWS, group_rows)
        if self.ctx.policy.regroup and not exact:
            x = np.concatenate(blocks)
            return [(x[i : i + chunk], (), False) for i in range(0, x.shape[0], chunk)]
        return ((x, s, False) for x, s in replay_frames(blocks, max_rows, MAX_FORWARD_STEPS))

    async def _open(self, checker: _Checker, offers) -> None:
        """Open a check session on each peer of `checker`'s chain (its links, and the last one's
        `OpenOk.verify_rows`: the rows of one step it computes exactly as one-row steps).

        Raises:
            _CheckerFailed: a peer refused or failed (the links opened stay in `checker`)."""
        spec = self.spec
        for span in checker.chain:
            try:
                link = await self._transport.connect(span.peer_id, self._failover.open_timeout_s)
                checker.links.append(link)
                frame = Open(session_id=self._rng.randbytes(16), client_id=spec.client_id,
                             model_id=spec.model_id, start=span.start, end=span.end,
                             max_tokens=spec.n_tokens, sampling=spec.sampling, prefixes=offers)
                reply = await self._ask(link, frame, self._failover.open_timeout_s)
                if not isinstance(reply, OpenOk):
                    raise ProtocolError(f"peer {span.peer_id[:12]}… answered open with {type(reply).__name__}")
            except SwarmError as e:
                raise _CheckerFailed(span, e) from e
            checker.group_rows = reply.verify_rows

    async def _exchange(self, link: HopLink, frame: Forward, timeout_s: float) -> np.ndarray:
        reply = await self._ask(link, frame, timeout_s)
        if not isinstance(reply, Hidden) or reply.hidden.shape != frame.hidden.shape:
            raise ProtocolError(
                f"peer {link.peer_id[:12]}… answered a check step with {type(reply).__name__}"
            )
        return np.asarray(reply.hidden, dtype=np.float32)

    async def _tokens(self, link: HopLink, frame: Forward, timeout_s: float) -> dict[int, int]:
        """A last span's answer to a check frame: the token at each position it drew one for."""
        reply = await self._ask(link, frame, timeout_s)
        if not isinstance(reply, Token) or len(reply.tokens) != (frame.n_tokens if frame.verify else 0):
            raise ProtocolError(
                f"peer {link.peer_id[:12]}… answered a check step with {type(reply).__name__}"
            )
        if frame.verify:
            return {frame.pos0 + i + 1: t for i, t in enumerate(reply.tokens)}
        return {frame.pos0 + frame.n_tokens: reply.token}

    async def _ask(self, link: HopLink, frame, timeout_s: float):
        await link.send(frame, timeout_s)
        reply, _ = await link.recv(timeout_s)
        if isinstance(reply, Error):
            raise error_of(link.peer_id, reply)
        return reply


MAX_EVIDENCE_SHOWN = 20
"""`read_evidence` returns at most this many of the latest lines."""


def read_evidence(evidence_dir: Path, model_id: str) -> tuple[dict, ...]:
    """The latest evidence lines of peers caught on `model_id` (`EVIDENCE_FILE` under `evidence_dir`),
    oldest first; lines that are not a JSON object with the `CheckEvent` fields are skipped.
    Never raises: no file is no evidence."""
    try:
        text = (evidence_dir / EVIDENCE_FILE).read_text()
    except OSError:
        return ()
    # first_outside came later: lines written before it are still evidence
    need = {f.name for f in dataclasses.fields(CheckEvent)} - {"first_outside"} | {"model_id", "at"}
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and need <= d.keys() and d["model_id"] == model_id:
            out.append(d)
    return tuple(out[-MAX_EVIDENCE_SHOWN:])
