"""swarm/api/service.py: which HTTP error each failure of a request becomes; max_tokens defaults."""

import pytest

from swarm.api.openai_schema import ApiError
from swarm.api.service import DEFAULT_MAX_TOKENS, RETRY_AFTER_S, api_error, token_limit
from swarm.errors import Busy, NoRoute, PeerUnreachable, RequestError, ShuttingDown
from swarm.limits import MAX_CONTEXT_TOKENS


@pytest.mark.parametrize(
    "error, status, code",
    [
        (RequestError("bad"), 400, None),
        (NoRoute("no chain", missing=(20,)), 503, "no_route"),
        (Busy("full"), 503, "busy"),
        (ShuttingDown("leaving"), 503, "busy"),
        (PeerUnreachable("gone"), 502, "swarm_error"),
        (RuntimeError("bug"), 500, None),
    ],
)
def test_failures_map_to_http_statuses(error, status, code):
    e = api_error(error)
    assert (e.status, e.code) == (status, code)
    assert ("Retry-After" in e.headers()) == (status == 503)
    if status == 503:
        assert e.headers()["Retry-After"] == str(RETRY_AFTER_S)


def test_an_api_error_stays_itself():
    e = ApiError(413, "too long", code="context_length_exceeded")
    assert api_error(e) is e


def test_a_missing_max_tokens_is_what_the_route_holds_past_the_prompt():
    # the swarm's peers take 2,048 tokens per session on an 8,192-token model: a 1,900-token prompt
    # leaves 148, not the model context's 512
    assert token_limit(1900, None, 8192, 2048, "messages") == 148
    assert token_limit(100, None, 8192, 2048, "messages") == DEFAULT_MAX_TOKENS
    assert token_limit(8000, None, 8192, None, "prompt") == 192  # no route now: the context stands in
    assert token_limit(100, None, 8192, 100_000, "prompt") == DEFAULT_MAX_TOKENS
    assert token_limit(8100, None, 8192, 100_000, "prompt") == 92  # a room past the context is capped
    assert token_limit(1900, 1000, 8192, 2048, "messages") == 1000  # the request's own: the route refuses it


@pytest.mark.parametrize("param", ["messages", "prompt"])
def test_length_errors_name_the_requests_own_fields(param):
    e = _raises(lambda: token_limit(2048, None, 8192, 2048, param))
    assert (e.status, e.code, e.param) == (400, "context_length_exceeded", param)
    assert "peers take at most 2048 tokens per session; the prompt has 2048 tokens" in e.message
    e = _raises(lambda: token_limit(8192, None, 8192, None, param))
    assert (e.status, e.param) == (400, param) and "this model's context is 8192 tokens" in e.message
    e = _raises(lambda: token_limit(MAX_CONTEXT_TOKENS + 1, 1, 8192, None, param))
    assert (e.status, e.code, e.param) == (413, "context_length_exceeded", param)
    e = _raises(lambda: token_limit(100, 8100, 8192, None, param))
    assert (e.status, e.code, e.param) == (400, "context_length_exceeded", "max_tokens")


def _raises(call) -> ApiError:
    with pytest.raises(ApiError) as info:
        call()
    return info.value
