"""check_request: the engine's context and the product's 131,072-token cap."""

import pytest

from swarm.client.generate import GenerationRequest, check_request
from swarm.errors import RequestError
from swarm.limits import MAX_CONTEXT_TOKENS


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
