"""The generation loop shared by the local backend and the swarm route.

An engine turns tokens into sampled next tokens (`prefill` for the prompt, `decode` one token at a
time); this module owns everything else of a request: validating it against the context limits,
turning tokens into UTF-8-safe text deltas, stop strings and end-of-generation tokens, timing and
the Generation Telemetry record. It does not know where the engine computes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from swarm.client.telemetry import GenerationTelemetry
from swarm.client.text import DeltaDecoder
from swarm.errors import RequestError
from swarm.limits import MAX_CONTEXT_TOKENS
from swarm.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    """One request, validated by `check_request`.

    Attributes:
        max_new_tokens: tokens to generate at most (>= 1).
        sampling: temperature / top-p / top-k / seed; temperature 0 is greedy.
        stop: strings that end generation (not included in the text).
    """

    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepResult:
    """A sampled token: id, its log-probability (None unless asked), and the top alternatives
    [(id, logprob)]."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


class EngineSession(Protocol):
    """One generation's state on an engine: its own llama.cpp context locally, its own hops on the swarm."""

    def prefill(self, tokens: Sequence[int]) -> StepResult:
        """Run the prompt from position 0; sample the token after it."""

    def decode(self, token: int) -> StepResult:
        """Append one token; sample the next."""

    def close(self) -> None:
        """Release the session (idempotent; always called, also after errors and interrupts)."""


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


@dataclass
class Generation:
    """A finished generation: the text, the generated token ids and the telemetry."""

    text: str
    tokens: list[int]
    telemetry: GenerationTelemetry


def check_request(n_prompt_tokens: int, req: GenerationRequest, context_limit: int) -> None:
    """Refuse a request that cannot run on an engine holding `context_limit` tokens per session.

    Raises:
        RequestError: empty prompt, max_new_tokens not an integer >= 1, or prompt + max_new_tokens
            over the engine's context or the product's hard cap of 131,072 tokens.
    """
    if n_prompt_tokens == 0:
        raise RequestError("empty prompt")
    if not isinstance(req.max_new_tokens, int) or isinstance(req.max_new_tokens, bool):
        raise RequestError(f"max_new_tokens must be an integer, got {req.max_new_tokens!r:.40}")
    if req.max_new_tokens < 1:
        raise RequestError(f"max_new_tokens must be >= 1 (got {req.max_new_tokens})")
    limit = min(context_limit, MAX_CONTEXT_TOKENS)
    total = n_prompt_tokens + req.max_new_tokens
    if total > limit:
        which = "the product's hard cap" if limit == MAX_CONTEXT_TOKENS else "the model's context"
        raise RequestError(
            f"prompt ({n_prompt_tokens} tokens) + max_new_tokens ({req.max_new_tokens}) = {total} "
            f"exceeds {which} of {limit} tokens"
        )


class TokenStream:
    """Iterate to receive text deltas (`str`, each valid UTF-8); then read `.result`.

    Created by `stream()`; the work happens as you iterate. Closing it early (break) releases the
    session on the engine.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        prompt: Sequence[int],
        req: GenerationRequest,
        backend: str,
    ):
        check_request(len(prompt), req, engine.context_limit)
        self._engine, self._tok, self._prompt, self._req = engine, tokenizer, list(prompt), req
        self.telemetry = GenerationTelemetry(backend=backend, prompt_tokens=len(prompt))
        self.tokens: list[int] = []
        self.result: Generation | None = None
        self._iter = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._iter

    def __next__(self) -> str:
        return next(self._iter)

    def close(self) -> None:
        """Stop early and release the session."""
        self._iter.close()

    def _run(self) -> Iterator[str]:
        decoder = DeltaDecoder(self._req.stop)
        t0 = last = time.perf_counter()
        session = self._engine.open_session(
            len(self._prompt) + self._req.max_new_tokens, self._req.sampling, self.telemetry
        )
        try:
            step = session.prefill(self._prompt)
            while True:
                now = time.perf_counter()
                if not self.tokens:
                    self.telemetry.ttft_ms = (now - t0) * 1000.0
                if self._tok.is_end(step.token):
                    self.telemetry.finish_reason = "stop"
                    break
                self.telemetry.token_latencies_ms.append((now - last) * 1000.0)
                last = now
                self.tokens.append(step.token)
                delta = decoder.feed(self._tok.piece(step.token))
                if delta:
                    yield delta
                if decoder.stopped:
                    self.telemetry.finish_reason = "stop"
                    break
                if len(self.tokens) >= self._req.max_new_tokens:
                    self.telemetry.finish_reason = "length"
                    break
                step = session.decode(step.token)
        finally:
            session.close()
        tail = decoder.finish()
        if tail:
            yield tail
        self.telemetry.finalize((time.perf_counter() - t0) * 1000.0)
        self.result = Generation(text=decoder.text, tokens=list(self.tokens), telemetry=self.telemetry)

    def run(self) -> Generation:
        """Consume the stream and return the finished generation."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result
