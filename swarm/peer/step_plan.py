"""Which unit of a span's executor work runs next, and whether to hold it back a moment: pure.

The scheduler (swarm/peer/scheduler.py) runs one *unit* at a time: a **batch** of one-row decode
steps of several sessions, a **chunk** of one multi-row (prefill) step, or a **call**. This module
decides which, from what is queued and from how much compute each client was served lately.

**Cost-weighted fair share.** Each client (the remote peer a step is for) is charged the compute
milliseconds of the units that served it (a batch's time split over its rows), and the charge
decays with a half-life of `USAGE_HALF_LIFE_S` (`ClientUsage`; the decayed-usage fair share of
batch schedulers such as Slurm's multifactor priority). The client with the least decayed usage
(times its busy sessions, below) goes next. So turns are weighted by cost: a client decoding at
~15 ms a step gets some fifteen steps for each 250 ms prefill chunk of a client that prefills
without pause, where counting turns gave one step per chunk (issue 24: a modest client's decode
was 27.6x slower next to a greedy prefill).

**Many sessions rank later.** Usage is counted per client, not per session, so a client holding
many sessions gets no more compute than one holding a single session; and while others ask too,
it goes later: its usage ranks multiplied by its busy sessions (`ClientUsage.priority`, at most
`SESSION_WEIGHT_MAX`). Equal compute would still give a newcomer only half of a peer that another
client keeps busy with several sessions (issue 24: decoding 1.9x slower next to one that had held
the peer for 3 s); ranked so, a client with one session next to one that keeps n busy gets about
n/(n+1) of the peer, and splitting a load over sessions never buys more of a shared peer. Alone, a
client still gets all of it: every rule here only orders work.

**Batches.** Decode steps of clients whose usage is similar (none `heavier` than the lightest with a
step waiting) batch freely, one step per client before a second of any, as llama.cpp computes a
batch's rows for about the price of fewer. A heavier client's rows join only while the measured cost
of the larger batch stays within `BATCH_SLACK` of the batch without them: on a one-thread CPU peer
a 5-row batch costs about three 1-row steps (docs/benchmarks.md), which a light client should not
pay for a heavy one's rows.

**Holding a unit back (anticipation).** A client's next step (or call) arrives a short, measured gap
after its last one was answered (its round trip; a few ms on loopback). A unit started in that gap
is in the way when the client comes back: a 64-row chunk runs ~250 ms on one thread, which the light
client would wait for on every token, or which would be stopped and its compute thrown away (below).
When the unit about to start serves only clients with more usage than a
client that is due back before the unit would end, the scheduler waits for that client up to
`ANTICIPATE_FACTOR` times its gap, never longer than the unit itself would take
(the anticipatory disk scheduler's idea: Iyer and Druschel, SOSP 2001). At most one wait per
answer, so a peer idles at most that much per step of a lighter client, and only to the cost of
heavier ones; units that end before it is due still fill its gaps. Between decode steps of clients
of similar usage, a hold merges what would run as two batches in turn (each client paying for
both) into one. A lone session pays no batching delay: work is held only for another client.

**Stopping a chunk (preemption).** A hold covers only a gap that was measured; a light client that
arrives while a heavier client's chunk runs (its first message, or after a pause of its own) would
still wait for the whole chunk, some 250-600 ms on one thread, more than its own prompt may cost
(issue 24: a newcomer's TTFT 2.6x its idle figure next to a client prefilling without pause). So
when work of a client arrives while a chunk runs that serves only clients `heavier` than it, the
chunk is stopped (`SpanExecutor.interrupt`: llama.cpp drops the chunk's positions again, and the
chunk reruns later on the same rows and cells, so its results do not change) and queued again at
the front (`preempts`). The compute the stopped chunk had spent is charged to the client that
stopped it, so stopping is not free: a client that keeps doing it soon ranks heavier itself, and
a stop whose charge would rank the stopper behind the chunk's client is not made (the chunk would
rerun whole first). One chunk is stopped at most `PREEMPT_MAX` times, so a heavy client's prefill
always progresses (at worst a chunk costs `PREEMPT_MAX + 1` times its compute, charged to clients
with far less usage, which soon are not), and never when it is expected to end within
`PREEMPT_MIN_LEFT_MS`. Only where a sequence rolls back exactly (`ArchRow.rollback_exact`);
decode batches are never stopped (they are short).

Nothing here reads a clock or a queue: the scheduler passes the time, the usage and the gaps in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Sequence

INLINE_MAX_MS = 10.0
"""Units expected to compute in less than this many ms run on the event loop thread: the longest a
ping or another stream's frame waits for one unit."""

MAX_TRACKED_CLIENTS = 1024
"""Clients whose usage is remembered; a forgotten one counts as new (usage 0)."""
EWMA_WEIGHT = 0.2
"""Weight of the newest measurement in a unit kind's moving average of compute time."""
USAGE_HALF_LIFE_S = 10.0
"""Half-life of a client's charged compute: a client that stops is treated as new after a minute
or so; a generation of a few hundred tokens is remembered for its whole length."""
SESSION_WEIGHT_MAX = 4
"""Most busy sessions a client's usage is multiplied by (a peer's default per-client session limit
with 8 slots): a client ranked behind others still gets a fifth of a peer they keep busy."""
BUSY_SESSION_S = 2.0
"""A session counts as busy for its client's rank this long (s) after its last charged unit: longer
than any gap between a decoding session's steps, far shorter than the usage's half-life."""
HEAVY_FACTOR = 1.5  # 2x let a client that had held the peer 3 s count as an equal (docs/benchmarks.md)
HEAVY_MARGIN_MS = 500.0
"""Client b is heavier than a when usage_b > HEAVY_FACTOR * usage_a + HEAVY_MARGIN_MS (ms of decayed
compute): two clients sharing a peer evenly never are; a client saturating the peer for seconds is,
next to one that just arrived."""
BATCH_SLACK = 0.25
"""A heavier client's row joins a batch only if the batch then costs at most this much more."""
ANTICIPATE_FACTOR = 2.0
"""A held unit waits at most this many times the due client's measured gap."""
PREEMPT_MAX = 4
"""Times one chunk may be stopped for lighter clients. A newcomer's first messages (its Open, the
calls after it, its first step) come a round trip apart with no measured gap to hold for, and the
stopped chunk may rerun between any two of them, so one stop each; a fixed cap bounds the rerun
work whatever the timing (stops right after a rerun starts cost the chunk almost nothing)."""
PREEMPT_MIN_LEFT_MS = 20.0
"""A chunk expected to end within this many ms is left to finish."""


@dataclass(frozen=True)
class Pending:
    """What the planner sees of one queued job.

    Attributes:
        kind: "step" (a Forward's rows) or "call" (any other executor work).
        seq_id: the step's sequence; -1 for a call.
        rows_left: rows of the step not computed yet; 0 for a call.
        started: some chunk of the step has run already.
        client: the remote client the work is for (its peer id); "" for the peer's own work.
    """

    kind: Literal["step", "call"]
    seq_id: int = -1
    rows_left: int = 0
    started: bool = False
    client: str = ""

    @property
    def is_decode(self) -> bool:
        """A one-row step that has not started: it may join a batch."""
        return self.kind == "step" and self.rows_left == 1 and not self.started


@dataclass(frozen=True)
class Unit:
    """The next piece of work: `kind` "batch" (jobs' one-row steps together), "chunk" (`rows` rows
    of the step `jobs[0]`) or "call" (`jobs[0]`); `jobs` index the pending queue."""

    kind: Literal["batch", "chunk", "call"]
    jobs: tuple[int, ...]
    rows: int


def heavier(usage_b: float, usage_a: float) -> bool:
    """Client b has used clearly more than client a (decayed compute ms; see `HEAVY_FACTOR`)."""
    return usage_b > HEAVY_FACTOR * usage_a + HEAVY_MARGIN_MS


class ClientUsage:
    """Compute ms served per client, decayed exponentially (half-life `half_life_s`), and the
    client's busy sessions (charged within `BUSY_SESSION_S`).

    `charge`, `value`, `priority` and `snapshot` take the time (s, any monotonic clock) so the decay
    is testable.
    """

    def __init__(self, half_life_s: float = USAGE_HALF_LIFE_S, max_clients: int = MAX_TRACKED_CLIENTS):
        self._rate = math.log(2.0) / half_life_s
        self._max = max_clients
        self._at: dict[str, tuple[float, float]] = {}  # client -> (usage ms, at time s)
        self._busy: dict[str, dict[int, float]] = {}  # client -> session seq_id -> last charged, s

    def value(self, client: str, now: float) -> float:
        """The client's decayed usage (ms) at `now`; 0 for a client never charged or forgotten."""
        v, t = self._at.get(client, (0.0, now))
        return v * math.exp(-self._rate * max(0.0, now - t))

    def busy_sessions(self, client: str, now: float) -> int:
        """Sessions of the client charged within `BUSY_SESSION_S` before `now`."""
        return sum(now - t < BUSY_SESSION_S for t in self._busy.get(client, {}).values())

    def priority(self, client: str, now: float) -> float:
        """What the client ranks by (ms; less goes first): its usage times its busy sessions (at
        least 1, at most `SESSION_WEIGHT_MAX`), so a client asking for many sessions at once goes
        after one asking for fewer."""
        return self.value(client, now) * min(max(1, self.busy_sessions(client, now)), SESSION_WEIGHT_MAX)

    def charge(self, client: str, ms: float, now: float, seq_id: int = -1) -> None:
        """Add `ms` of compute to the client's usage at `now`, for its session `seq_id` (-1: work of
        no session, such as a call)."""
        v = self.value(client, now) + ms
        self._at.pop(client, None)
        self._at[client] = (v, now)
        busy = {s: t for s, t in self._busy.pop(client, {}).items() if now - t < BUSY_SESSION_S}
        if seq_id >= 0:
            busy[seq_id] = now
        self._busy[client] = busy
        while len(self._at) > self._max:
            forgotten = next(iter(self._at))  # least recently charged: dicts keep insertion order
            del self._at[forgotten]
            self._busy.pop(forgotten, None)

    def snapshot(self, clients: set[str], now: float) -> dict[str, float]:
        """Each of `clients`' `priority` at `now`: the usage the planner ranks by."""
        return {c: self.priority(c, now) for c in clients}


def _by_usage(indices: Sequence[int], pending: Sequence[Pending],
              usage: Mapping[str, float]) -> list[list[int]]:
    """`indices` grouped by client, each group in queue order, the least-used client's group first
    (ties: the client whose first job is oldest)."""
    groups: dict[str, list[int]] = {}
    for i in indices:
        groups.setdefault(pending[i].client, []).append(i)
    return sorted(groups.values(), key=lambda g: (usage.get(pending[g[0]].client, 0.0), g[0]))


def _fill_batch(groups: list[list[int]], pending: Sequence[Pending], usage: Mapping[str, float],
                max_batch_rows: int, batch_ms: Callable[[int], float | None]) -> list[int]:
    """Decode steps for one batch: round-robin over the light clients' groups (one step per client
    before a second of any), then heavier clients' steps while the batch's measured cost allows."""
    lead = usage.get(pending[groups[0][0]].client, 0.0)
    light = [g for g in groups if not heavier(usage.get(pending[g[0]].client, 0.0), lead)]
    heavy = [g for g in groups if g not in light]
    chosen: list[int] = []
    seen: set[int] = set()

    def round_robin(gs: list[list[int]], admit: Callable[[int], bool]) -> None:
        for rank in range(max((len(g) for g in gs), default=0)):
            for g in gs:
                # One step per sequence per batch: a sequence's second step needs its first one's position.
                if (rank < len(g) and pending[g[rank]].seq_id not in seen and len(chosen) < max_batch_rows
                        and admit(len(chosen))):
                    chosen.append(g[rank])
                    seen.add(pending[g[rank]].seq_id)

    round_robin(light, lambda n: True)
    base = batch_ms(len(chosen))

    def cheap(n: int) -> bool:
        more = batch_ms(n + 1)
        return base is None or more is None or more <= (1.0 + BATCH_SLACK) * base

    round_robin(heavy, cheap)
    return sorted(chosen)


def plan_next(pending: Sequence[Pending], *, last_was_batch: bool, max_batch_rows: int, chunk_tokens: int,
              usage: Mapping[str, float] | None = None,
              batch_ms: Callable[[int], float | None] = lambda rows: None) -> Unit | None:
    """Choose the next unit from the queue: the least-used client's work first.

    The client with the least decayed usage among those with work queued leads. If it has decode
    steps waiting, the next unit is a batch (`_fill_batch`); otherwise its oldest other job runs (a
    chunk of at most `chunk_tokens` rows, or a call). When the lead has both, batches and its other
    jobs alternate (`last_was_batch`), so its own decoding never starves its own prefill. Within a
    client, jobs keep their queue order.

    Args:
        pending: queued jobs in arrival order (a job cut into chunks goes back to the end).
        last_was_batch: the previous unit was a batch.
        max_batch_rows: most rows in one batch (>= 1).
        chunk_tokens: most rows of a multi-row step per chunk (>= 1).
        usage: what each client ranks by (`ClientUsage.snapshot`: decayed compute ms times busy
            sessions); a client not listed has 0.
        batch_ms: expected ms of a batch of n rows, or None when not measured.
    Returns:
        The unit, or None when nothing waits.
    """
    if not pending:
        return None
    usage = usage or {}
    order = _by_usage(range(len(pending)), pending, usage)
    lead = order[0]
    lead_decodes = any(pending[i].is_decode for i in lead)
    lead_others = [i for i in lead if not pending[i].is_decode]
    if lead_decodes and (not lead_others or not last_was_batch):
        decodes = _by_usage([i for i, p in enumerate(pending) if p.is_decode], pending, usage)
        jobs = _fill_batch(decodes, pending, usage, max_batch_rows, batch_ms)
        return Unit("batch", tuple(jobs), len(jobs))
    i = lead_others[0]
    if pending[i].kind == "call":
        return Unit("call", (i,), 0)
    return Unit("chunk", (i,), min(chunk_tokens, pending[i].rows_left))


@dataclass(frozen=True)
class Due:
    """A client whose next work is expected: its measured `gap_ms` (median time from an answer to
    the client's next step or call) and `elapsed_ms` since its last answer."""

    client: str
    gap_ms: float
    elapsed_ms: float


def hold_ms(unit: Unit, unit_clients: set[str], unit_cost_ms: float | None, due: Sequence[Due],
            usage: Mapping[str, float]) -> float:
    """How long to hold `unit` back for a due step of a lighter client (see the module docstring).

    A due client counts when it is not served by the unit, has less usage than every client the
    unit serves, it is due back before the unit would end (gap - elapsed < the unit's cost), and it
    is still expected (elapsed < ANTICIPATE_FACTOR * gap). A held batch of similar clients then
    takes the due client's step too (two half batches in turn cost each client both).

    Returns:
        ms to wait for a new arrival before planning again (0: start the unit now); at most
        `unit_cost_ms`.
    """
    if unit_cost_ms is None or not due:
        return 0.0
    wait = 0.0
    for d in due:
        u = usage.get(d.client, 0.0)
        if d.client in unit_clients or d.gap_ms - d.elapsed_ms >= unit_cost_ms:
            continue  # the unit would end before the client is due: no harm in running it
        if all(usage.get(c, 0.0) > u for c in unit_clients):
            wait = max(wait, ANTICIPATE_FACTOR * d.gap_ms - d.elapsed_ms)
    return min(max(wait, 0.0), unit_cost_ms)


def preempts(unit: Unit, unit_clients: set[str], client: str, usage: Mapping[str, float], stopped: int,
             left_ms: float | None, elapsed_ms: float) -> bool:
    """Whether work of `client` arriving now stops the running `unit` (module docstring, "Stopping a
    chunk").

    Args:
        unit: the unit running now; only a "chunk" is ever stopped.
        unit_clients: the clients it serves.
        client: whose work arrived ("": the peer's own work, which never stops anything).
        usage: what clients rank by (`ClientUsage.snapshot`).
        stopped: times this chunk's step was stopped before.
        left_ms: the chunk's expected ms still to run (its measured cost minus its elapsed ms), or
            None when its cost is not measured yet.
        elapsed_ms: how long the chunk has run: the compute a stop throws away, which `client` is
            charged. Every client the chunk serves must still be `heavier` than `client` after that
            charge, or the stopped chunk would rank first again and rerun whole before the work
            that stopped it (a late stop would then cost `client` more than waiting).
    Returns:
        True: stop it and run `client`'s work first.
    """
    if unit.kind != "chunk" or not client or client in unit_clients or stopped >= PREEMPT_MAX:
        return False
    if left_ms is not None and left_ms < PREEMPT_MIN_LEFT_MS:
        return False
    mine = usage.get(client, 0.0) + max(elapsed_ms, 0.0)
    return all(heavier(usage.get(c, 0.0), mine) for c in unit_clients)


class FairnessMeter:
    """How long clients wait while others are served: after each unit, every client with work queued
    that the unit did not serve has waited one more unit; `max_wait_units` is the longest such run
    since start. Under cost-weighted shares a heavy client may wait many cheap units of a light one
    (as many as one of its own units costs), so this is a measurement, not a bound."""

    def __init__(self) -> None:
        self.max_wait_units = 0
        self._waiting: dict[str, int] = {}

    def observe(self, queued: set[str], served: set[str]) -> None:
        """One unit ran: `queued` are the clients with a job in the queue as it was planned, `served`
        those it served."""
        self._waiting = {c: self._waiting.get(c, 0) + 1 for c in queued - served}
        if self._waiting:
            self.max_wait_units = max(self.max_wait_units, max(self._waiting.values()))


class CostModel:
    """Moving average of compute ms per kind of unit, to decide where the next one runs and what a
    batch of n rows costs.

    Keys are (kind, row bucket): a batch of 8 rows costs less than 8 single rows, so each power-of-two
    row count is its own kind.
    """

    def __init__(self, weight: float = EWMA_WEIGHT):
        self._weight = weight
        self._ms: dict[tuple[str, int], float] = {}

    @staticmethod
    def key(kind: str, rows: int) -> tuple[str, int]:
        """The key of a unit of `kind` over `rows` rows."""
        return kind, int(rows).bit_length()

    def expected_ms(self, key: tuple[str, int]) -> float | None:
        """Average ms of units of this key, or None when none was measured."""
        return self._ms.get(key)

    def observe(self, key: tuple[str, int], ms: float) -> None:
        """Fold one measured compute time (ms) into the key's average."""
        old = self._ms.get(key)
        self._ms[key] = ms if old is None else old + self._weight * (ms - old)
