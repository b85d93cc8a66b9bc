"""The sessions of one served span: admission, positions, idle eviction, llama.cpp seq-id slots.

`SessionTable` is the single mutator of a span's session state (the `llama_memory_i::apply` rule):
the peer handler asks it, then applies what it returns to the executor. Every seq id the table
frees (on `release`, `evict_idle`, or the eviction inside `admit`) must be cleared in the
executor by the caller before that seq id serves another session.

Accounting: each session reserves `reserved_tokens` of the span's `cache_tokens` when admitted
(the client's declared session length), and holds one of `max_sessions` seq ids (0-based,
lowest free first). The executor gives every seq id a KV stream of its own of
`session_cap_tokens` cells (cache_tokens / max_sessions), so no session may reserve more than that
however much of the cache is free; `free_cache_tokens`, which the peer announces and route
planning compares with a session's length, is what a NEW session could reserve now. A forward step
may only continue exactly where the session stands. One owner (the client's authenticated peer id)
may hold at most `owner_sessions` sessions and `owner_tokens` reserved tokens, so one client cannot
take every slot of a peer (`swarm serve --client-sessions`, `--client-kv-tokens`).

This module does not: touch llama.cpp, read a clock (every call takes `now_s`), or do I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from swarm.errors import Busy, Forbidden, RequestError
from swarm.limits import MAX_CONTEXT_TOKENS


CLIENT_LIMIT_PREFIX = "client limit: "
"""Start of every refusal that names a limit per remote client (sessions, KV tokens, streams, frame
bytes), so a client or a test can tell it from a full peer."""


@dataclass
class SessionSlot:
    """One admitted session; mutated only by its `SessionTable`.

    Attributes:
        session_id: the client's session id.
        seq_id: llama.cpp sequence id in [0, max_sessions).
        owner: peer id of the client that opened it.
        reserved_tokens: KV tokens reserved; positions stay below this.
        pos: next position to compute (tokens already in the cache).
        last_used_s: time of the last admit/advance, seconds on the caller's clock.
    """

    session_id: bytes
    seq_id: int
    owner: str
    reserved_tokens: int
    pos: int
    last_used_s: float


@dataclass(frozen=True)
class Admission:
    """Result of `SessionTable.admit`.

    Attributes:
        slot: the new session.
        evicted_seq_ids: seq ids of idle sessions evicted to make room; clear them in the executor
            (one of them may be `slot.seq_id`) before running the new session.
    """

    slot: SessionSlot
    evicted_seq_ids: tuple[int, ...]


def _check_int(name: str, v: object, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise RequestError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


class SessionTable:
    """Sessions of one span, keyed by session id.

    Args:
        max_sessions: seq-id slots (llama.cpp n_seq_max), >= 1.
        cache_tokens: KV tokens the span's cache holds in all (n_ctx), >= 1.
        idle_timeout_s: a session unused for longer than this is evicted, > 0 seconds.
        max_session_tokens: most tokens one session may reserve, 1..MAX_CONTEXT_TOKENS; a request
            above it is malformed (RequestError).
        session_cap_tokens: KV tokens one session's stream holds (`SpanExecutor.n_ctx_seq_tokens`),
            >= 1, or None for no cap but cache_tokens (a cache all sessions share); a request above
            it does not fit this peer (Busy), though another peer may hold it.
        owner_sessions: most sessions one owner may hold at once, >= 1 (None: max_sessions).
        owner_tokens: most KV tokens one owner's sessions may reserve together, >= 1 (None:
            cache_tokens).
    Raises:
        RequestError: an argument is out of range.
    """

    def __init__(
        self,
        max_sessions: int,
        cache_tokens: int,
        idle_timeout_s: float,
        max_session_tokens: int = MAX_CONTEXT_TOKENS,
        session_cap_tokens: int | None = None,
        owner_sessions: int | None = None,
        owner_tokens: int | None = None,
    ):
        self.max_sessions = _check_int("max_sessions", max_sessions, 1, 1 << 16)
        self.cache_tokens = _check_int("cache_tokens", cache_tokens, 1, 1 << 40)
        if not isinstance(idle_timeout_s, (int, float)) or not 0 < idle_timeout_s < math.inf:
            raise RequestError(f"idle_timeout_s must be a positive finite number, got {idle_timeout_s!r}")
        self.idle_timeout_s = float(idle_timeout_s)
        self.max_session_tokens = _check_int("max_session_tokens", max_session_tokens, 1, MAX_CONTEXT_TOKENS)
        cap = self.cache_tokens if session_cap_tokens is None else session_cap_tokens
        self.session_cap_tokens = _check_int("session_cap_tokens", cap, 1, 1 << 40)
        self._cap_origin = (
            "" if session_cap_tokens is None else f" ({cache_tokens} cache tokens / {max_sessions} sessions)"
        )
        self.owner_sessions = _check_int(
            "owner_sessions", self.max_sessions if owner_sessions is None else owner_sessions, 1, 1 << 16)
        self.owner_tokens = _check_int(
            "owner_tokens", self.cache_tokens if owner_tokens is None else owner_tokens, 1, 1 << 40)
        self._slots: dict[bytes, SessionSlot] = {}
        self._free_seq_ids = set(range(max_sessions))
        self._reserved = 0

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def free_cache_tokens(self) -> int:
        """KV tokens a new session could reserve now: min(session_cap_tokens, unreserved tokens)
        while a seq-id slot is free, else 0 (idle sessions that `admit` would evict not counted)."""
        if not self._free_seq_ids:
            return 0
        return min(self.session_cap_tokens, self.unreserved_tokens)

    @property
    def unreserved_tokens(self) -> int:
        """KV tokens of cache_tokens not reserved by any session."""
        return self.cache_tokens - self._reserved

    @property
    def sessions_free(self) -> int:
        """Seq-id slots not held by any session."""
        return len(self._free_seq_ids)

    def admit(self, session_id: bytes, owner: str, reserved_tokens: int, now_s: float) -> Admission:
        """Open a session, evicting idle ones first.

        Args:
            session_id: new, unused session id (non-empty bytes).
            owner: the client's peer id.
            reserved_tokens: session length to reserve, 1..max_session_tokens.
            now_s: current time in seconds.
        Returns:
            Admission: the slot (pos 0) and the seq ids evicted on the way.
        Raises:
            RequestError: bad arguments, session id already open, or reserved_tokens above
                max_session_tokens.
            Busy: reserved_tokens above session_cap_tokens (the message names both numbers), the
                owner at its owner_sessions or owner_tokens limit, no free seq id, or
                reserved_tokens above the unreserved tokens (after eviction). A message naming a
                per-client limit starts with CLIENT_LIMIT_PREFIX.
        """
        if not isinstance(session_id, bytes) or not session_id:
            raise RequestError("session id must be non-empty bytes")
        if not isinstance(owner, str):
            raise RequestError("session owner must be a peer id string")
        _check_int("reserved_tokens", reserved_tokens, 1, self.max_session_tokens)
        if session_id in self._slots:
            raise RequestError("session already open")
        if reserved_tokens > self.session_cap_tokens:
            raise Busy(
                f"session needs {reserved_tokens} KV tokens, but a session here holds at most "
                f"{self.session_cap_tokens}{self._cap_origin}"
            )
        evicted = tuple(self.evict_idle(now_s))
        if not self._free_seq_ids:
            raise Busy(f"all {self.max_sessions} session slots are in use")
        held = [s for s in self._slots.values() if s.owner == owner]
        if len(held) >= self.owner_sessions:
            raise Busy(f"{CLIENT_LIMIT_PREFIX}this client holds {len(held)} sessions here, the most one "
                       f"client may (client_sessions {self.owner_sessions})")
        owned = sum(s.reserved_tokens for s in held)
        if owned + reserved_tokens > self.owner_tokens:
            raise Busy(f"{CLIENT_LIMIT_PREFIX}this client's sessions reserve {owned} KV tokens here; "
                       f"{reserved_tokens} more would pass client_kv_tokens {self.owner_tokens}")
        if reserved_tokens > self.unreserved_tokens:
            raise Busy(f"session needs {reserved_tokens} KV tokens, {self.unreserved_tokens} are free")
        seq_id = min(self._free_seq_ids)
        self._free_seq_ids.remove(seq_id)
        self._reserved += reserved_tokens
        slot = SessionSlot(session_id, seq_id, owner, reserved_tokens, 0, float(now_s))
        self._slots[session_id] = slot
        return Admission(slot, evicted)

    def get(self, session_id: bytes, owner: str) -> SessionSlot:
        """The open session `session_id`, which must belong to `owner`.

        Raises:
            RequestError: unknown (or evicted) session.
            Forbidden: the session belongs to another client.
        """
        slot = self._slots.get(session_id) if isinstance(session_id, bytes) else None
        if slot is None:
            raise RequestError("unknown session")
        if slot.owner != owner:
            raise Forbidden("session belongs to another client")
        return slot

    def _live(self, slot: SessionSlot) -> SessionSlot:
        if self._slots.get(slot.session_id) is not slot:
            raise RequestError("session is closed")
        return slot

    def check_forward(self, slot: SessionSlot, pos0: int, n_tokens: int) -> None:
        """Check that a step of n_tokens at pos0 may run on the session.

        Raises:
            RequestError: session closed, n_tokens < 1, pos0 != slot.pos, or the step would pass
                reserved_tokens.
        """
        self._live(slot)
        _check_int("n_tokens", n_tokens, 1, self.max_session_tokens)
        if pos0 != slot.pos:
            raise RequestError(f"step starts at position {pos0}, session is at {slot.pos}")
        if pos0 + n_tokens > slot.reserved_tokens:
            raise RequestError(
                f"step to position {pos0 + n_tokens} passes the session's "
                f"{slot.reserved_tokens} reserved tokens"
            )

    def advance(self, slot: SessionSlot, n_tokens: int, now_s: float) -> None:
        """Record that n_tokens more positions are in the cache.

        Raises:
            RequestError: as `check_forward(slot, slot.pos, n_tokens)`.
        """
        self.check_forward(slot, slot.pos, n_tokens)
        slot.pos += n_tokens
        slot.last_used_s = float(now_s)

    def truncate(self, slot: SessionSlot, pos: int) -> None:
        """Roll the session back so that its next position is pos (the caller drops KV >= pos).

        Raises:
            RequestError: session closed or pos not in [0, slot.pos].
        """
        self._live(slot)
        _check_int("pos", pos, 0, slot.pos)
        slot.pos = pos

    def release(self, session_id: bytes) -> int:
        """Close a session and free its reservation.

        Returns:
            int: the seq id the caller must clear in the executor.
        Raises:
            RequestError: unknown session.
        """
        slot = self._slots.pop(session_id, None) if isinstance(session_id, bytes) else None
        if slot is None:
            raise RequestError("unknown session")
        self._reserved -= slot.reserved_tokens
        self._free_seq_ids.add(slot.seq_id)
        return slot.seq_id

    def evict_idle(self, now_s: float) -> list[int]:
        """Close every session idle for longer than idle_timeout_s.

        Returns:
            list[int]: freed seq ids, ascending; the caller clears them in the executor.
        """
        idle = [sid for sid, s in self._slots.items() if now_s - s.last_used_s > self.idle_timeout_s]
        return sorted(self.release(sid) for sid in idle)
