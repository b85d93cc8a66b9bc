"""Generation Telemetry: what one request cost, where, and how fast.

Records are plain frozen dataclasses with `to_dict()` for `--json`; nothing here measures time
itself (callers pass durations in), so the records stay easy to build in tests and the simulator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from swarm.spec.verify import Acceptance


@dataclass
class HopTelemetry:
    """One hop of a route, accumulated over a request.

    Attributes:
        peer_id: libp2p peer id of the hop's peer.
        start, end: global half-open layer span the hop ran.
        compute_ms: time the peer reported spending in its executor, summed over steps.
        network_ms: round-trip time minus compute time, summed over steps.
        bytes_sent, bytes_received: frame bytes to and from the peer.
        steps: frames exchanged (prefill chunks + decode steps).
        reused_tokens: prompt tokens the hop restored from a prefix snapshot instead of computing.
        fetched_from: peer id the hop fetched that snapshot from during Open ("": its own, or none).
        transport: how the hop's frames travelled: "direct" (a TCP stream, swarm.direct), "relayed"
            (spliced through a relay, sealed end to end: swarm.relay), "libp2p" (through the p2pd
            daemons) or "sim".
        direct_error: why the hop went through libp2p although its peer offers direct endpoints
            ("" when it did not).
        pushed_steps: steps whose input the previous hop's peer pushed straight to this hop (server
            push: the client only read the answer).
        skipped_replies: answers to steps the client had given up on (a push that raced a failover
            upstream), read and dropped.
        verify_rows: rows of one step the peer computes exactly as one-row steps (`OpenOk.verify_rows`):
            speculative verify passes go in groups of the route's smallest.
    """

    peer_id: str
    start: int
    end: int
    compute_ms: float = 0.0
    network_ms: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    steps: int = 0
    reused_tokens: int = 0
    fetched_from: str = ""
    transport: str = ""
    direct_error: str = ""
    pushed_steps: int = 0
    skipped_replies: int = 0
    verify_rows: int = 1


@dataclass
class FailoverEvent:
    """One hop replaced mid-generation.

    Attributes:
        peer_id: the peer that failed.
        start, end: global half-open layers it ran, now run by `replacements`.
        reason: "timeout", "unreachable", "busy", "shutting_down", "malformed" or "error".
        message: the failure as the client saw it.
        position: tokens in the session when it failed.
        replayed_tokens: recorded inputs replayed on the replacement hops.
        restored_tokens: the prefix the replacement hops restored from snapshots instead.
        replacements: peer ids of the new hops, in layer order.
        stall_ms: from the failing step's start at this hop to the replacement being caught up
            (detection + re-plan + open + replay), ms.
        rewound_to: a peer caught computing wrong: the session position the route rolled back to
            (the tokens from there on were recomputed by the rebuilt route); -1 for other failures.
    """

    peer_id: str
    start: int
    end: int
    reason: str
    message: str
    position: int
    replayed_tokens: int = 0
    restored_tokens: int = 0
    replacements: list[str] = field(default_factory=list)
    stall_ms: float = 0.0
    rewound_to: int = -1


@dataclass
class CheckEvent:
    """One spot check of a hop (swarm/client/checks.py): the evidence when it caught a peer.

    Attributes:
        peer_id: the checked peer (for "caught" from a disagreeing checker: that checker).
        start, end: global half-open layers checked.
        position: session position of the worst row (the step the measure comes from).
        rows: rows compared: those the hop computed since its previous check (all of them, from
            position 0, at its first check or with a fresh checker).
        rel_l2: the worst row's ||claimed - recomputed|| / ||recomputed||.
        cosine: the worst row's cosine similarity.
        max_rel_l2, min_cosine: the band the check applied.
        checkers: peers that recomputed the steps (a second one when the first disagreed).
        verdict: "ok", "caught" (outside the band; a second checker, if any, agreed with the first),
            "checker_lied" (the second checker agreed with the checked peer), or "chain_break" (the
            receipt of `checkers[0]`, the next hop, is not of the rows `peer_id` said it pushed;
            rel_l2 inf).
        offences: the caught peer's offences in this client's standing window, with this one.
        decode_step: the generation's decode step (0-based) after which the check started; -1: the
            prompt's check before the first token (`CheckPolicy.verify_prefill`).
        first_outside: session position of the first row outside the band (-1: none): the route
            rolls its text back to the token after it (`swarm.route.verify.rewind_position`).
    """

    peer_id: str
    start: int
    end: int
    position: int
    rows: int
    rel_l2: float
    cosine: float
    max_rel_l2: float
    min_cosine: float
    checkers: list[str] = field(default_factory=list)
    verdict: str = "ok"
    offences: int = 0
    decode_step: int = 0
    first_outside: int = -1


@dataclass
class GenerationTelemetry:
    """The record returned with every generation (local or over the swarm).

    Attributes:
        backend: "local" or "swarm".
        prompt_tokens, generated_tokens: counts.
        ttft_ms: from request start to the first generated token.
        total_ms: from request start to the end.
        decode_tokens_per_s: generated tokens after the first, per second of decode time.
        token_latencies_ms: per generated token, time since the previous one (the first: TTFT).
        route: hops in layer order (empty for local).
        retries: attempts to open a hop that failed and were retried on another peer (busy, gone).
        failovers: hops replaced mid-generation, with the stall each caused.
        finish_reason: "stop" (end of sequence or stop string), "length" (max_new_tokens).
        reused_tokens: prompt tokens restored from prefix snapshots on every hop (not computed).
        checks: spot checks of the route's hops, with the evidence of any peer caught.
        speculation: verify passes, drafted and accepted tokens when the request speculated, else None.
        mtp_drafts: session position → the last span's multi-token-prediction head's draft of the
            token at that position (`Forward.want_draft`, asked with `RemoteEngine.mtp_drafts` on
            a model whose GGUF has the head); empty otherwise.
    """

    backend: str
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    decode_tokens_per_s: float = 0.0
    token_latencies_ms: list[float] = field(default_factory=list)
    route: list[HopTelemetry] = field(default_factory=list)
    retries: int = 0
    failovers: list[FailoverEvent] = field(default_factory=list)
    finish_reason: str = ""
    reused_tokens: int = 0
    checks: list[CheckEvent] = field(default_factory=list)
    speculation: Acceptance | None = None
    mtp_drafts: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def finalize(self, total_ms: float) -> None:
        """Fill `total_ms` and `decode_tokens_per_s` from the per-token latencies."""
        self.total_ms = total_ms
        self.generated_tokens = len(self.token_latencies_ms)
        decode_ms = sum(self.token_latencies_ms[1:])
        if self.generated_tokens > 1 and decode_ms > 0:
            self.decode_tokens_per_s = (self.generated_tokens - 1) * 1000.0 / decode_ms

    def to_dict(self) -> dict:
        """JSON-able dict of every field."""
        return asdict(self)

    def summary(self) -> str:
        """One human line, e.g. for `/stats`."""
        line = (
            f"{self.prompt_tokens} prompt + {self.generated_tokens} generated tokens, "
            f"TTFT {self.ttft_ms:.0f} ms, {self.decode_tokens_per_s:.1f} tok/s, "
            f"total {self.total_ms:.0f} ms"
        )
        if self.reused_tokens:
            line += f", {self.reused_tokens} prompt tokens reused"
        if self.speculation is not None:
            s = self.speculation
            line += (f", speculation: {s.accepted}/{s.drafted} drafted tokens accepted "
                     f"({s.rate:.0%}), {s.tokens_per_pass:.2f} tokens per pass")
            if s.ahead_sent:
                line += f", {s.ahead_used}/{s.ahead_sent} passes sent ahead used"
        for f in self.failovers:
            line += (
                f"\n  failover [{f.start}:{f.end}) {f.peer_id[:12]}… ({f.reason}) "
                f"after {_generated(f.position, self.prompt_tokens)}: "
                f"replayed {f.replayed_tokens} tokens, stall {f.stall_ms:.0f} ms"
            )
            if f.rewound_to >= 0:
                line += f", text repaired from generated token {max(0, f.rewound_to - self.prompt_tokens)} on"
        for c in self.checks:
            if c.verdict != "ok":
                line += (
                    f"\n  check [{c.start}:{c.end}) {c.peer_id[:12]}… {c.verdict} at position {c.position}: "
                    f"rel L2 {c.rel_l2:.3g} (band {c.max_rel_l2:.3g}), cosine {c.cosine:.6f}"
                )
        for hop in self.route:
            line += (
                f"\n  [{hop.start:>3}:{hop.end:<3}) {hop.peer_id[:12]}…  compute {hop.compute_ms:.0f} ms"
                f"  network {hop.network_ms:.0f} ms  sent {hop.bytes_sent} B  recv {hop.bytes_received} B"
                + (f"  ({hop.transport})" if hop.transport else "")
                + (f" (direct failed: {hop.direct_error})" if hop.direct_error else "")
                + (f"  {hop.pushed_steps} steps pushed in" if hop.pushed_steps else "")
            )
        return line


def _generated(position: int, prompt_tokens: int) -> str:
    """Where a failover happened, in the words a user reads. `position` counts the session's tokens:
    the prompt, then each generated token once it is fed back, so the failing step of a decode at
    position p had produced p - prompt + 1 tokens (the first one came from the prefill)."""
    if position < prompt_tokens:
        return f"{position} of {prompt_tokens} prompt tokens"
    return f"{position - prompt_tokens + 1} generated tokens"
