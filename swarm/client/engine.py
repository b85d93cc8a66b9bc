"""What an engine is to the generation loop (swarm/client/generate.py): the interfaces the local and
the swarm backends implement, the token they sample (`StepResult`) and the roll-back a swarm session
raises when a caught peer's tokens are recomputed (`Rewind`).

This module does not: run a model, route, or hold a generation's state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from swarm.client.telemetry import GenerationTelemetry
from swarm.sampling import SamplingParams


@dataclass(frozen=True)
class StepResult:
    """A sampled token: id, its log-probability (None unless asked), and the top alternatives
    [(id, logprob)]."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


class Rewind(Exception):
    """Raised by an engine session's `decode` or `verify`: tokens it gave out were computed wrong
    (a peer was caught), and the session rolled back. Internal to the generation loop.

    Attributes:
        position: tokens (prompt + generated) that stand; every later token is replaced.
        step: the token at `position`, sampled by the rolled-back session.
    """

    def __init__(self, position: int, step: StepResult):
        super().__init__(f"rolled back to position {position}")
        self.position, self.step = position, step


class EngineSession(Protocol):
    """One generation's state on an engine: its own llama.cpp context locally, its own hops on the swarm."""

    def prefill(self, tokens: Sequence[int]) -> StepResult:
        """Run the prompt from position 0; sample the token after it."""

    def decode(self, token: int, follow: Callable[[int], bool] | None = None) -> StepResult:
        """Append one token; sample the next. `follow(next token)` True promises that the next
        call is `decode` of that token (or `settle`, or `close`), so a session with a round trip
        to hide may start that step before it is asked for; None: it may not.

        Raises:
            Rewind: (swarm) tokens given out earlier were computed wrong; `token` was not appended.
        """

    def settle(self) -> Rewind | None:
        """Called once the generation has its last token: a `Rewind` (as `decode` raises it) when
        tokens given out turn out computed wrong (swarm: a spot check still in flight caught a
        peer), and the generation goes on from its step; None: the tokens stand."""

    def close(self) -> None:
        """Release the session (idempotent; always called, also after errors and interrupts)."""


class SpeculativeSession(EngineSession, Protocol):
    """An engine session that can verify a draft in one pass (the swarm's)."""

    verify_rows: int
    """Rows of one step that every hop of the session's route computes exactly as one-row decode
    steps (its proven exact group, swarm/peer/exact_rows.py); 1 until the session is open."""

    def verify(self, token: int, draft: Sequence[int], group_rows: int | None,
               ahead: Callable[[], Sequence[int]] | None = None) -> list[StepResult]:
        """Append `token` and the drafted tokens, keep the drafted tokens up to the first one plain
        decoding would not have produced, and return the kept ones plus the next sampled token.
        `ahead`: where the session pipelines, called once the pass is on its way (maybe on another
        thread) for the guessed token after the draft and drafted tokens after it, which it may
        start computing as the next pass before this one returns; None: one pass at a time.

        Raises:
            Rewind: tokens given out earlier were computed wrong; nothing was appended.
        """


class Engine(Protocol):
    """Opens sessions that compute next tokens; implemented by the local and swarm backends.

    An engine may be shared: each `open_session` gets state of its own, so concurrent sessions
    (threads or interleaved iterators) each give exactly their solo output. An engine that cannot
    hold another session now raises `Busy` from `open_session` at once.
    """

    context_limit: int
    """Tokens (prompt + generated) one session may hold on this engine."""

    def session_room(self) -> int | None:
        """Tokens (prompt + generated) a session opened now could hold, at most `context_limit`:
        locally `context_limit`; on the swarm, what the best route's peers take per session (None
        when no complete route exists now)."""

    def open_session(
        self, n_tokens: int, sampling: SamplingParams, telemetry: GenerationTelemetry
    ) -> EngineSession:
        """Open a session that will hold at most `n_tokens` tokens.

        Raises:
            Busy: (local) every session slot is in use.
            NoRoute: (swarm) no chain of live peers with room for the session.
        """


class Tokenizer(Protocol):
    """What the loop needs from a tokenizer (see `swarm.client.tokenizer.Tokenizer`)."""

    def piece(self, token: int) -> bytes: ...

    def is_end(self, token: int) -> bool: ...
