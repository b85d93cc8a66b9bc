"""swarm/api/openai_schema.py: what requests are accepted or refused, and the shape of error bodies."""

import pytest
from pydantic import ValidationError

from swarm.api.openai_schema import ApiError, ChatCompletionRequest, CompletionRequest

MSG = [{"role": "user", "content": "hi"}]


def test_stop_is_a_string_or_a_list():
    assert ChatCompletionRequest(model="m", messages=MSG, stop="\n").stop_strings() == ("\n",)
    assert ChatCompletionRequest(model="m", messages=MSG, stop=["a", "b"]).stop_strings() == ("a", "b")
    assert ChatCompletionRequest(model="m", messages=MSG).stop_strings() == ()


@pytest.mark.parametrize(
    "extra",
    [
        {"n": 2},
        {"stop": [""]},
        {"stop": ["x"] * 17},
        {"temperature": -0.1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"seed": -1},
        {"seed": 1 << 64},
        {"logprobs": True},
        {"tools": [{"type": "function"}]},
        {"messages": []},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
    ],
)
def test_chat_requests_that_cannot_be_served_are_refused(extra):
    with pytest.raises(ValidationError):
        ChatCompletionRequest(**{"model": "m", "messages": MSG, **extra})


def test_chat_messages_render_as_template_messages():
    req = ChatCompletionRequest(
        model="m",
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
        ],
        unknown_field=1,
    )
    assert [m.as_template_message() for m in req.messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""},
    ]


def test_max_completion_tokens_wins_over_max_tokens():
    assert ChatCompletionRequest(model="m", messages=MSG, max_tokens=5).token_limit() == 5
    assert (
        ChatCompletionRequest(model="m", messages=MSG, max_tokens=5, max_completion_tokens=7).token_limit()
        == 7
    )
    assert ChatCompletionRequest(model="m", messages=MSG).token_limit() is None


@pytest.mark.parametrize("extra", [{"prompt": ["a", "b"]}, {"echo": True}, {"suffix": "x"}])
def test_completion_requests_that_cannot_be_served_are_refused(extra):
    with pytest.raises(ValidationError):
        CompletionRequest(**{"model": "m", "prompt": "p", **extra})


def test_completion_prompt_may_be_a_list_of_one():
    assert CompletionRequest(model="m", prompt=["p"]).prompt_text() == "p"


def test_api_error_body_and_retry_after():
    e = ApiError(503, "no route", type="server_error", code="no_route", retry_after_s=5)
    assert e.body() == {
        "error": {"message": "no route", "type": "server_error", "param": None, "code": "no_route"}
    }
    assert e.headers() == {"Retry-After": "5"}
    assert ApiError(400, "bad").headers() == {}


def test_speculate_is_an_extension_bounded_by_the_verify_pass():
    assert ChatCompletionRequest(model="m", messages=MSG).speculate is None
    assert CompletionRequest(model="m", prompt="x", speculate=4).speculate == 4
    for bad in (-1, 64, "four"):
        with pytest.raises(ValidationError):
            ChatCompletionRequest(model="m", messages=MSG, speculate=bad)
