"""A named fake engine whose session rolls back, as the swarm's does when a spot check caught a peer.

`ScriptedSession` hands out `given` tokens (the prefill's, then one per decode call), raises `Rewind`
at decode call `rewind_at` (1-based; 0: returns it from `settle`, after the last token, as a late
spot check's verdict does) to `keep` generated tokens, then hands out `honest` tokens from there on.
`Letters` decodes token t to the letter chr(ord("a") + t - 1); token 0 ends the text.
"""

from __future__ import annotations

from swarm.client.generate import Correction, Rewind, StepResult
from swarm.client.telemetry import GenerationTelemetry

PROMPT = [7, 7, 7]


class ScriptedSession:
    def __init__(self, given: list[int], rewind_at: int, keep: int, honest: list[int]):
        self.given, self.rewind_at, self.keep, self.honest = given, rewind_at, keep, honest
        self.calls, self.next = 0, None

    def prefill(self, tokens) -> StepResult:
        assert list(tokens) == PROMPT
        return StepResult(self.given[0])

    def _rollback(self) -> Rewind:
        self.next = self.keep + 1
        return Rewind(len(PROMPT) + self.keep, StepResult(self.honest[self.keep]))

    def decode(self, token: int, follow=None) -> StepResult:
        self.calls += 1
        if self.calls == self.rewind_at:
            raise self._rollback()
        if self.next is None:
            return StepResult(self.given[self.calls])
        self.next += 1
        return StepResult(self.honest[self.next - 1])

    def settle(self) -> Rewind | None:
        return self._rollback() if self.rewind_at == 0 and self.next is None else None

    def close(self) -> None:
        pass


class ScriptedEngine:
    context_limit = 1000

    def __init__(self, session: ScriptedSession):
        self.session = session

    def session_room(self) -> int:
        return self.context_limit

    def open_session(self, n_tokens: int, sampling, telemetry: GenerationTelemetry) -> ScriptedSession:
        return self.session


class Letters:
    def piece(self, token: int) -> bytes:
        return chr(ord("a") + token - 1).encode()

    def is_end(self, token: int) -> bool:
        return token == 0


def shown(events) -> str:
    """The text a consumer shows: deltas appended, each correction cutting it back to its position."""
    text = ""
    for e in events:
        if isinstance(e, Correction):
            assert text[e.position:] == e.text  # it withdraws exactly what was given out
            text = text[: e.position]
        else:
            text += e
    return text
