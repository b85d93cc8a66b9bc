"""The generation loop shared by the local backend and the swarm route.

An engine turns tokens into sampled next tokens (`prefill` for the prompt, `decode` one token at a
time); this module owns everything else of a request: validating it against the context limits,
turning tokens into UTF-8-safe text deltas, stop strings and end-of-generation tokens, timing and
the Generation Telemetry record. It does not know where the engine computes.

Speculative decoding (`GenerationRequest.speculation`): before each decode step the loop asks the
draft for up to k tokens (`swarm.spec.verify.draft_budget`; by default the k that this generation's
measurements say is fastest, 0 included: swarm/spec/policy.py); with a draft, the engine session's
`verify` checks them in one pass and yields 1..k+1 tokens, each the token plain decoding would have
produced; without one, it decodes one token. Only engine sessions with `verify` (the swarm's) can;
on a model whose peers keep a recurrent or compressed state, each hop rolls rejected rows back from
the state it exported before the pass (swarm/peer/checkpoints.py).
Pipelining (`Speculation.pipeline`): where a pass is likely to keep every draft, `verify` is given a
guess of the next pass (the token after the draft, then drafts after it), which the session sends
right behind the pass while it travels; when the pass kept every draft and the guess held, the
next pass is exactly that guess, whose answer is then only read.

Repair: when the swarm's spot checks catch a peer computing wrong, the engine session's `decode` or
`verify` raises `Rewind`: its route was rebuilt without the peer and rolled back to the token after
the peer's first wrong row, and the tokens from there on are recomputed. The loop drops them and
goes on from the rebuilt route's token; the recomputed text is held back while it repeats what was
already given out, and only where it differs does the stream yield a `Correction` (the text given
out from there is withdrawn) before the new text. A consumer that never sees a `Correction` saw
exactly the repaired text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field

from swarm.client.engine import Engine, EngineSession, Rewind, StepResult, Tokenizer
from swarm.client.telemetry import GenerationTelemetry
from swarm.client.text import DeltaDecoder
from swarm.errors import RequestError
from swarm.limits import MAX_CONTEXT_TOKENS, MAX_VERIFY_ROWS
from swarm.sampling import SamplingParams
from swarm.spec.draft import Draft
from swarm.spec.policy import KPolicy, shadow_kept, worth_sending_ahead
from swarm.spec.verify import Acceptance, draft_budget


@dataclass(frozen=True)
class Speculation:
    """How a request speculates.

    Attributes:
        draft: proposes the tokens (one Draft per generation: a draft model keeps state); its
            `close()`, where it has one, is called when the generation ends.
        k: drafted tokens per verify pass at most (1..MAX_VERIFY_ROWS - 1).
        group_rows: rows per step of a verify pass (swarm/spec/verify.py `verify_steps`); None: the
            largest group every hop proved exact at load (each row computes as its decode step would,
            bit for bit); 1: one-row steps; more: faster, exact only where the kernels allow.
        adaptive: choose each pass's draft length in 0..k from the acceptance and pass times this
            generation measured (swarm/spec/policy.py; 0 decodes plainly, so speculation turns
            itself off where it would be slower); False drafts up to k on every step.
        pipeline: send the next verify pass before the one in flight comes back, on the guess that
            it keeps every draft (up to two passes in flight; only where that guess is likely:
            `swarm.spec.policy.worth_sending_ahead`); False: one pass at a time.
    """

    draft: Draft
    k: int = 4
    group_rows: int | None = None
    adaptive: bool = True
    pipeline: bool = True


@dataclass(frozen=True)
class GenerationRequest:
    """One request, validated by `check_request`.

    Attributes:
        max_new_tokens: tokens to generate at most (>= 1).
        sampling: temperature / top-p / top-k / seed; temperature 0 is greedy.
        stop: strings that end generation (not included in the text).
        speculation: speculative decoding, or None (off).
    """

    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    speculation: Speculation | None = None


@dataclass(frozen=True)
class Correction:
    """An event of a `TokenStream`: text it already gave out was wrong, and is withdrawn.

    A peer of the route was caught computing wrong; the route was rebuilt without it and the tokens
    after its first wrong row recomputed, and their text differs from what was given out. A consumer
    cuts the text it received back to `position` characters; the deltas that follow continue from
    there. Yielded only when the given-out text changes.

    Attributes:
        position: characters of the text given out so far that stand.
        text: the withdrawn text (given out after `position`).
        token_position: index among the generated tokens of the first recomputed one.
        tokens: the generated tokens recomputed (from `token_position` on), as first given out.
    """

    position: int
    text: str
    token_position: int
    tokens: tuple[int, ...]


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
    spec = req.speculation
    if spec is not None:
        if not isinstance(spec.k, int) or not 1 <= spec.k < MAX_VERIFY_ROWS:
            raise RequestError(
                f"speculation k must be an integer in [1, {MAX_VERIFY_ROWS - 1}], got {spec.k!r}"
            )
        if spec.group_rows is not None and (not isinstance(spec.group_rows, int) or spec.group_rows < 1):
            raise RequestError(
                f"speculation group_rows must be None or an integer >= 1, got {spec.group_rows!r}"
            )
        if req.sampling.logprobs or req.sampling.n_top_logprobs:
            raise RequestError("speculative decoding does not return log-probs: turn one of them off")
    limit = min(context_limit, MAX_CONTEXT_TOKENS)
    total = n_prompt_tokens + req.max_new_tokens
    if total > limit:
        which = "the product's hard cap" if limit == MAX_CONTEXT_TOKENS else "the model's context"
        raise RequestError(
            f"prompt ({n_prompt_tokens} tokens) + max_new_tokens ({req.max_new_tokens}) = {total} "
            f"exceeds {which} of {limit} tokens"
        )


class TokenStream:
    """Iterate to receive text deltas (`str`, each valid UTF-8) and, rarely, a `Correction`; then
    read `.result`.

    Created by `stream()`; the work happens as you iterate. Closing it early (break) releases the
    session on the engine. A `Correction` comes only over the swarm, after a peer was caught
    computing wrong text that was already given out (see the module docstring); `.result.text` is
    always the repaired text.
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
        self.corrections: list[Correction] = []
        """The corrections yielded so far."""
        self._shown = ""
        """The text given out, with corrections applied."""
        self._agreed = 0
        """Characters of `_shown` the current text is known to repeat (all of them unless a rewind
        left given-out text to be recomputed)."""
        self._rewound: tuple[int, tuple[int, ...]] | None = None
        """The latest rewind's token position and replaced tokens, for its `Correction`."""
        self._draft_lock = threading.Lock()
        self._draft_closed = False
        if req.speculation is not None and hasattr(req.speculation.draft, "attach"):
            req.speculation.draft.attach(self.telemetry)  # a draft of the route's own answers
        self._t0 = self._last = 0.0  # perf_counter s: the start, and the latest token
        self._iter = self._run()

    def __iter__(self) -> Iterator[str | Correction]:
        return self._iter

    def __next__(self) -> str | Correction:
        return next(self._iter)

    def close(self) -> None:
        """Stop early and release the session."""
        self._iter.close()

    def _run(self) -> Iterator[str | Correction]:
        decoder = DeltaDecoder(self._req.stop)
        self._t0 = self._last = time.perf_counter()
        session = self._engine.open_session(
            len(self._prompt) + self._req.max_new_tokens, self._req.sampling, self.telemetry
        )
        try:
            decoder = yield from self._take(self._steps(session), decoder)
            # a spot check still in flight may catch a peer whose rows made the text: its verdict
            # rolls the text back, and the generation goes on from there
            while (rewind := session.settle()) is not None:
                decoder = self._rewind(rewind.position - len(self._prompt))
                decoder = yield from self._take(self._steps(session, rewind.step), decoder)
        finally:
            session.close()
            if self._req.speculation is not None and hasattr(self._req.speculation.draft, "close"):
                with self._draft_lock:  # a guess may still be running on the engine's thread
                    self._draft_closed = True
                    self._req.speculation.draft.close()  # a draft model's context goes back to its pool
        decoder.finish()
        yield from self._give_out(decoder.text, final=True)
        self.telemetry.finalize((time.perf_counter() - self._t0) * 1000.0)
        self.result = Generation(text=decoder.text, tokens=list(self.tokens), telemetry=self.telemetry)

    def _take(self, steps: Iterator[StepResult | Rewind], decoder: DeltaDecoder
              ) -> Generator[str | Correction, None, DeltaDecoder]:
        """Take tokens from `steps` into the text until the end token, a stop string or the length;
        yields the text given out; returns the decoder of the text so far."""
        for step in steps:
            if isinstance(step, Rewind):
                decoder = self._rewind(step.position - len(self._prompt))
                continue
            now = time.perf_counter()
            if not self.telemetry.ttft_ms:
                self.telemetry.ttft_ms = (now - self._t0) * 1000.0
            if self._tok.is_end(step.token):
                self.telemetry.finish_reason = "stop"
                break
            self.telemetry.token_latencies_ms.append((now - self._last) * 1000.0)
            self._last = now
            self.tokens.append(step.token)
            decoder.feed(self._tok.piece(step.token))
            yield from self._give_out(decoder.text, final=False)
            if decoder.stopped:
                self.telemetry.finish_reason = "stop"
                break
            if len(self.tokens) >= self._req.max_new_tokens:
                self.telemetry.finish_reason = "length"
                break
        return decoder

    def _rewind(self, keep: int) -> DeltaDecoder:
        """Drop the generated tokens from index `keep` on (the engine session rolled back); returns
        the decoder of the tokens that stand, whose text is a prefix of what was given out."""
        if self._rewound is None:
            self._rewound = (keep, tuple(self.tokens[keep:]))
        elif keep < self._rewound[0]:  # before a rewind still recomputing given-out text
            at, replaced = self._rewound
            self._rewound = (keep, tuple(self.tokens[keep:at]) + replaced)
        del self.tokens[keep:], self.telemetry.token_latencies_ms[keep:]
        decoder = DeltaDecoder(self._req.stop)
        for t in self.tokens:
            decoder.feed(self._tok.piece(t))
        self._agreed = min(self._agreed, len(decoder.text))
        return decoder

    def _give_out(self, text: str, final: bool) -> Iterator[str | Correction]:
        """Bring what was given out up to `text`, the decoded text now: yield the new delta, held back
        while `text` repeats given-out text that a rewind recomputes, after a `Correction` where it
        differs (or, at the end, stops short of it)."""
        shown, agreed = self._shown, self._agreed
        if agreed < len(shown):
            n = min(len(text), len(shown))
            k = agreed
            while k < n and text[k] == shown[k]:
                k += 1
            if k == n and not (final and n < len(shown)):
                self._agreed = n  # still repeating: nothing new unless it got past the given-out text
                if n < len(shown):
                    return
            else:
                token_position, tokens = self._rewound or (len(self.tokens), ())
                c = Correction(position=k, text=shown[k:], token_position=token_position, tokens=tokens)
                self.corrections.append(c)
                self._shown, self._agreed, self._rewound = shown[:k], k, None
                yield c
        delta = text[len(self._shown):]
        if delta:
            self._shown, self._agreed = text, len(text)
        if self._agreed >= len(self._shown):
            self._rewound = None  # the given-out text is recomputed: a later rewind starts anew
        if delta:
            yield delta

    def _steps(self, session: EngineSession,
               resumed: StepResult | None = None) -> Iterator[StepResult | Rewind]:
        """The sampled tokens in order: the prefill's (or `resumed`, the token at the end of a
        session rolled back after the last token), then by decode steps or verify passes. Each is
        taken into `self.tokens` before the next is asked for (the draft reads them); a `Rewind` of
        the session comes before the token it yields."""
        spec = self._req.speculation
        verify = getattr(session, "verify", None) if spec is not None else None
        if spec is not None:
            if verify is None:
                raise RequestError(f"the {self.telemetry.backend} backend cannot verify drafts: "
                                   "speculative decoding runs on the swarm")
            self.telemetry.speculation = self.telemetry.speculation or Acceptance()
        step = resumed or session.prefill(self._prompt)
        yield step
        policy = None
        if spec is not None and spec.adaptive:
            group = spec.group_rows or session.verify_rows
            policy = KPolicy(spec.k, explore=min(spec.k, max(1, group - 1)))
        # `decode`'s `follow` (this thread waits in decode): will the next step be asked for? (a stop string
        follow = None if spec else lambda t: (  # may still end the text: that step is then never read)
            len(self.tokens) + 1 < self._req.max_new_tokens and not self._tok.is_end(t))
        shadow: tuple[list[int], int] | None = None  # a shadow draft and where it starts in self.tokens
        ahead: list[int] = []  # the pass sent ahead: the guessed token after the draft, then its draft
        while True:
            if shadow is not None and (kept := shadow_kept(shadow[0], self.tokens[shadow[1]:])) is not None:
                policy.observe_acceptance(len(shadow[0]), kept)
                shadow = None
            if ahead:  # the pass sent ahead carries exactly the next rows: its answer is read
                draft, ahead = ahead[1:], []
            else:
                budget = draft_budget(spec.k, len(self.tokens), self._req.max_new_tokens) if spec else 0
                k = budget if policy is None else min(budget, policy.choose())
                draft = self._propose(k, policy)
                if not draft and policy is not None and budget and not k and shadow is None and policy.wants_shadow():
                    if proposal := self._propose(budget, policy):
                        shadow = (proposal, len(self.tokens))
            guesses: list[list[int]] = []  # the pass sent ahead, where the session asked for one
            t0 = time.perf_counter()
            try:
                if not draft:
                    new = [session.decode(step.token, follow)]
                elif self._pipelines(draft, policy):
                    new = verify(step.token, draft, spec.group_rows,
                                 lambda d=draft: guesses.append(self._guess(d, policy)) or guesses[-1])
                else:
                    new = verify(step.token, draft, spec.group_rows)
                if draft:
                    self.telemetry.speculation.add(len(draft), len(new) - 1)
            except Rewind as r:
                yield r  # the loop drops the replaced tokens before it takes the next one
                new, shadow = [r.step], None  # a shadow draft may cover dropped tokens
            else:
                if policy is not None:
                    kept = len(new) - 1 if draft else 0
                    policy.observe_pass(len(draft), kept, (time.perf_counter() - t0) * 1000.0)
                guess = guesses[-1] if guesses else []
                if guess and len(new) == len(draft) + 1 and new[-1].token == guess[0]:
                    ahead = guess  # every draft kept and the guess after them held
            for step in new:
                yield step

    def _propose(self, k: int, policy: KPolicy | None, after: Sequence[int] = ()) -> list[int]:
        """Up to `k` drafted tokens after the text so far and then `after` ([] for k = 0), timed for
        `policy`. Under the draft's lock: a guess for a pass sent ahead runs on another thread."""
        if not k:
            return []
        with self._draft_lock:
            if self._draft_closed:  # a late guess after the generation ended
                return []
            t0 = time.perf_counter()
            draft = self._req.speculation.draft.propose([*self._prompt, *self.tokens, *after], k)[:k]
            if policy is not None:
                policy.observe_draft(len(draft), (time.perf_counter() - t0) * 1000.0)
        return draft

    def _pipelines(self, draft: list[int], policy: KPolicy | None) -> bool:
        """Whether the pass of `draft` may send the next pass ahead (`Speculation.pipeline`): it is
        likely enough to be used (`worth_sending_ahead`) and the request needs tokens after it."""
        if not self._req.speculation.pipeline:
            return False
        counts = self.telemetry.speculation
        acceptance = policy.acceptance if policy is not None else (counts.accepted + 1) / (counts.drafted + 2)
        return (worth_sending_ahead(acceptance, len(draft))
                and len(self.tokens) + len(draft) + 1 < self._req.max_new_tokens)

    def _guess(self, draft: list[int], policy: KPolicy | None) -> list[int]:
        """The verify pass to send ahead of the answer to the pass of `draft`: the guessed token
        after the draft, then up to len(draft) drafted tokens after it, within the request's budget
        (`draft_budget` as if the pass kept every draft); [] when the draft has fewer than two (a
        pass sent ahead carries a draft). Called by the engine session while the pass travels."""
        generated = len(self.tokens) + len(draft) + 1
        k = draft_budget(len(draft), generated, self._req.max_new_tokens)
        guess = self._propose(k + 1, policy, after=draft)
        return guess if len(guess) >= 2 else []

    def run(self) -> Generation:
        """Consume the stream and return the finished generation."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result
