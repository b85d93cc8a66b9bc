"""A serving peer's decisions that need no I/O: which Open is refused and why, which pushed step
runs, when a Forward rewinds, what truncate and restore require, when a prefix is kept, and the
span record a peer announces.

The stream handler (swarm/peer/handler.py, swarm/peer/push.py) and the simulator's peers
(sim/peers.py, sim/transport.py) both call these, so the simulated peer answers as the real one
does. Nothing here awaits, reads a clock or touches the executor; it imports no DHT, p2p or
llama.cpp module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from swarm.kv.sessions import SessionTable
from swarm.limits import MAX_FORWARD_TOKENS
from swarm.route.plan import PeerSpan
from swarm.wire import ErrorCode, Open

SHUTTING_DOWN_MESSAGE = "peer is shutting down"
"""The message of every SHUTTING_DOWN error a peer sends: refused Opens and the goodbye of each open
stream."""


@dataclass(frozen=True)
class Throughput:
    """Measured speed of a whole span: one-token decode steps/s and prefill tokens/s."""

    decode_steps_per_s: float
    prefill_tokens_per_s: float


def open_refusal(
    frame: Open,
    stream_peer_id: str,
    *,
    shutting_down: bool,
    draining: str | None,
    model_id: str | None,
    start: int,
    end: int,
) -> tuple[ErrorCode, str] | None:
    """Why a peer refuses an `Open` before asking its session table, or None to admit it.

    The checks run in this order; the first that fails answers: the client id is not the stream's
    peer (FORBIDDEN), the peer is leaving (SHUTTING_DOWN), it drains to move (BUSY, with the drain's
    reason), it serves another model or span (NOT_FOUND).

    Args:
        frame: the Open frame.
        stream_peer_id: the authenticated peer id of the stream it came on.
        shutting_down: the peer is leaving.
        draining: the drain's reason while the peer drains (`swarm.peer.rebalance.Drain.active`).
        model_id: the model served; None: the model is not checked (the simulator serves one).
        start, end: the span served, global half-open layers.
    Returns:
        (error code, message) of the refusal, or None.
    """
    if frame.client_id != stream_peer_id:
        return ErrorCode.FORBIDDEN, "client_id does not match the stream's peer id"
    if shutting_down:
        return ErrorCode.SHUTTING_DOWN, SHUTTING_DOWN_MESSAGE
    if draining:
        return ErrorCode.BUSY, draining
    if (model_id is not None and frame.model_id != model_id) or (frame.start, frame.end) != (start, end):
        of_model = f" of model {model_id[:16]}" if model_id is not None else ""
        return ErrorCode.NOT_FOUND, f"this peer serves layers [{start}, {end}){of_model}"
    return None


def restorable_lengths(
    offers: Sequence[tuple[int, bytes]], restorable: Mapping[int, bytes]
) -> tuple[int, ...]:
    """The prefix lengths an `OpenOk` lists: those the peer can restore, shorter than the whole
    offered prompt (a restore leaves at least one row to compute), ascending."""
    return tuple(sorted(n for n in restorable if n < offers[-1][0])) if offers else ()


def accepts_pushed(pos0: int, rewind: bool, session_pos: int) -> bool:
    """Whether a pushed step at `pos0` runs on a session at `session_pos`: it continues the session,
    or it rewinds it. Otherwise it is stale (a step the client has since finished by relay)."""
    return pos0 == session_pos or rewinds(pos0, rewind, session_pos)


def rewinds(pos0: int, rewind: bool, session_pos: int) -> bool:
    """Whether a Forward at `pos0` first rolls the session back to `pos0` (`Forward.rewind`)."""
    return rewind and pos0 < session_pos


def chain_refusal(next_peer: str, is_last: bool) -> str | None:
    """Why a `Chain` naming `next_peer` ("" for none) is refused whatever the peer, or None: the
    last span samples, so it has no next hop to push to."""
    return "the last span samples: it pushes to no next hop" if next_peer and is_last else None


def forward_size_refusal(n_tokens: int) -> str | None:
    """Why a Forward of `n_tokens` rows is refused whatever the session (too many rows), or None."""
    if n_tokens > MAX_FORWARD_TOKENS:
        return (f"a Forward frame carries at most {MAX_FORWARD_TOKENS} tokens, got "
                f"{n_tokens}: send the prompt in several frames")
    return None


def width_refusal(width: int, n_embd: int) -> str | None:
    """Why hidden states `width` wide are refused by a span of `n_embd`, or None."""
    return f"hidden size {width} != span's {n_embd}" if width != n_embd else None


def token_ids_refusal(n_ids: int, reads_token_ids: bool, start: int, end: int) -> str | None:
    """Why a Forward carrying `n_ids` token ids (`Forward.token_ids`; the frame already checked that
    there are 0 or one per row) is refused by span [start, end), or None. A span whose layers read
    token ids (`SpanExecutor.needs_token_ids`) needs them; the others ignore them."""
    if reads_token_ids and not n_ids:
        return (f"layers [{start}, {end}) read token ids (hash-routed experts or a multi-token-prediction "
                f"head): a Forward must carry its rows' token_ids")
    return None


def truncate_refusal(pos: int, session_pos: int) -> str | None:
    """Why a session at `session_pos` cannot be truncated to `pos`, or None."""
    if not 0 <= pos <= session_pos:
        return f"truncate to {pos}: the session holds positions 0..{session_pos - 1}"
    return None


def restore_refusal(session_pos: int) -> str | None:
    """Why a session at `session_pos` cannot restore a prefix: a restore fills an empty sequence
    only, on the session's first step. None: it can, if the snapshot is held (`not_restorable`)."""
    if session_pos != 0:
        return f"restore only on a session's first step (the session is at {session_pos})"
    return None


def not_restorable(n: int) -> str:
    """The refusal of a restore of `n` tokens the peer did not offer at Open, or no longer holds."""
    return f"prefix of {n} tokens is not restorable here (evicted or never offered)"


def keeps_prefix(offers: Sequence[tuple[int, bytes]], kept: bool, session_pos: int) -> bool:
    """Whether a session's cache is now worth keeping as a prefix snapshot: it holds the whole
    offered prompt, and was not kept before (once per session)."""
    return bool(offers) and not kept and session_pos == offers[-1][0]


def span_record(
    peer_id: str,
    start: int,
    end: int,
    throughput: Throughput,
    table: SessionTable | None,
    *,
    draining: bool,
    started_at: float = 0.0,
) -> PeerSpan:
    """The span a peer announces: its layers, measured speed and free room now.

    Args:
        peer_id: the peer.
        start, end: global half-open layers served.
        throughput: its measured speed.
        table: its session table; None while it serves nothing (no room).
        draining: whether to announce the drain: no free session slot while it drains.
        started_at: when this run of the peer started serving, Unix seconds (its incarnation).
    """
    return PeerSpan(
        peer_id,
        start,
        end,
        throughput.decode_steps_per_s,
        throughput.prefill_tokens_per_s,
        table.free_cache_tokens if table is not None else 0,
        0 if table is None or draining else table.sessions_free,
        None,
        started_at,
    )
