"""check_request: the engine's context and the product's 131,072-token cap; and an engine that
cannot roll a session back gets no speculation."""

import pytest

from swarm.client.engine import StepResult
from swarm.client.generate import GenerationRequest, Speculation, TokenStream, check_request
from swarm.errors import RequestError
from swarm.limits import MAX_CONTEXT_TOKENS
from tests.helpers.scripted import Letters


def test_within_limits_passes():
    check_request(100, GenerationRequest(max_new_tokens=28), context_limit=128)


@pytest.mark.parametrize(
    "n_prompt, max_new, limit, message",
    [
        (0, 10, 1000, "empty prompt"),
        (5, 0, 1000, "max_new_tokens must be >= 1"),
        (100, 29, 128, "exceeds the model's context of 128 tokens"),
        (130_000, 2000, 1_000_000, f"exceeds the product's hard cap of {MAX_CONTEXT_TOKENS} tokens"),
    ],
)
def test_refusals(n_prompt, max_new, limit, message):
    with pytest.raises(RequestError, match=message):
        check_request(n_prompt, GenerationRequest(max_new_tokens=max_new), context_limit=limit)


class _Session:
    """Decodes token t to t % 5 + 1; verifies a draft by accepting none of it (counted)."""

    verify_rows = 1

    def __init__(self):
        self.verified = 0

    def prefill(self, tokens) -> StepResult:
        return StepResult(1)

    def decode(self, token: int, follow=None) -> StepResult:
        return StepResult(token % 5 + 1)

    def verify(self, token: int, draft, group_rows) -> list[StepResult]:
        self.verified += 1
        return [self.decode(token)]

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Engine:
    context_limit = 1000

    def __init__(self, rollback_exact: bool):
        self.rollback_exact, self.session = rollback_exact, _Session()

    def open_session(self, n_tokens, sampling, telemetry):
        return self.session


class _AlwaysDraft:
    def propose(self, tokens, k: int) -> list[int]:
        return [3] * k


@pytest.mark.parametrize("rollback_exact", [True, False])
def test_an_engine_that_cannot_roll_back_decodes_a_speculative_request_plainly(rollback_exact):
    # a verify pass keeps the accepted rows by rolling the rejected ones back: an engine whose
    # sessions cannot (deepseek4's compressed cache, a hybrid model's recurrent state) never verifies
    engine = _Engine(rollback_exact)
    req = GenerationRequest(max_new_tokens=6, speculation=Speculation(_AlwaysDraft(), k=2, adaptive=False))
    result = TokenStream(engine, Letters(), [7, 7], req, backend="swarm").run()
    assert result.tokens == [1, 2, 3, 4, 5, 1]  # what plain decoding gives either way
    assert (engine.session.verified > 0) == rollback_exact
    assert (result.telemetry.speculation is None) == (not rollback_exact)
