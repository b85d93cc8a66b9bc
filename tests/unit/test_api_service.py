"""swarm/api/service.py: which HTTP error each failure of a request becomes; max_tokens defaults; a
repaired generation's answer, whole and streamed (with swarm/api/app.py's answers, over the scripted
engine of tests/helpers/scripted.py)."""

import asyncio
import json

import pytest

from swarm.api.app import _Answer, _events, _whole
from swarm.api.openai_schema import ApiError
from swarm.api.service import DEFAULT_MAX_TOKENS, RETRY_AFTER_S, GenerationJob, api_error, token_limit
from swarm.client.generate import GenerationRequest, TokenStream
from swarm.errors import Busy, NoRoute, PeerUnreachable, RequestError, ShuttingDown
from swarm.limits import MAX_CONTEXT_TOKENS

from tests.helpers.scripted import PROMPT, Letters, ScriptedEngine, ScriptedSession


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


def _job(given, rewind_at, keep, honest, n_new):
    """A GenerationJob over the scripted engine whose session rolls back (tests/helpers/scripted.py)."""
    engine = ScriptedEngine(ScriptedSession(given, rewind_at, keep, honest))
    stream = TokenStream(engine, Letters(), PROMPT, GenerationRequest(max_new_tokens=n_new), backend="sim")
    return GenerationJob(stream, asyncio.get_running_loop()).start()


def _sent(given, rewind_at, keep, honest, n_new) -> tuple[list[dict], list[str]]:
    """The server-sent events of a streamed completion, and the outcomes `done` recorded."""
    async def go():
        job = _job(given, rewind_at, keep, honest, n_new)
        outcomes: list[str] = []
        answer = _Answer("completions", "cmpl-1", "m", "fp")
        events = [json.loads(e["data"]) for e in [x async for x in _events(job, await job.next(), answer, False, 3,
                                                                            outcomes.append)]
                  if e["data"] != "[DONE]"]
        job.join(5)
        return events, outcomes

    return asyncio.run(go())


def test_a_stream_whose_sent_text_a_repair_changed_ends_with_502_repaired_after_streaming():
    events, outcomes = _sent([1, 2, 3, 4], 4, 2, [1, 2, 3, 9, 10, 11], 6)
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "abcd"  # sent before the repair
    err = events[-1]["error"]
    assert (err["code"], err["type"]) == ("repaired_after_streaming", "server_error")
    assert outcomes[0] == "502"


def test_a_stream_the_repair_did_not_change_goes_on_and_a_whole_answer_is_the_repaired_text():
    events, outcomes = _sent([1, 2, 3, 4], 4, 2, [1, 2, 3, 4, 5, 6], 6)
    assert "".join(e["choices"][0]["text"] for e in events) == "abcdef" and outcomes[0] == "length"

    async def whole():
        job = _job([1, 2, 3, 4], 4, 2, [1, 2, 3, 9, 10, 11], 6)
        outcomes: list[str] = []
        reply = await _whole(job, await job.next(), _Answer("completions", "cmpl-2", "m", "fp"), 3, None,
                             outcomes.append)
        return json.loads(reply.body), outcomes

    body, outcomes = asyncio.run(whole())
    assert body["choices"][0]["text"] == "abcijk" and outcomes == ["length"]
