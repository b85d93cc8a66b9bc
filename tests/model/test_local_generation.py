"""Local backend against llama-cpp-python's own whole-model output (the oracle)."""

from __future__ import annotations

import llama_cpp
import pytest

from swarm import Client
from swarm.errors import RequestError

PROMPT = "The three most important inventions of the twentieth century are"


@pytest.mark.parametrize("fixture", ["smollm2_path", "qwen_path"])
def test_greedy_equals_llama_cpp_create_completion(fixture, request):
    path = request.getfixturevalue(fixture)
    oracle = llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_threads=2, flash_attn=True, verbose=False)
    expected = oracle.create_completion(PROMPT, max_tokens=32, temperature=0.0)["choices"][0]["text"]
    del oracle
    client = Client(str(path), local=True, n_ctx=2048, n_threads=2)
    got = client.generate(PROMPT, max_new_tokens=32, temperature=0.0)
    assert got.text == expected
    assert got.telemetry.generated_tokens == len(got.tokens) > 0
    assert got.telemetry.prompt_tokens == len(client.tokenizer.encode(PROMPT))
    assert got.telemetry.ttft_ms > 0 and got.telemetry.decode_tokens_per_s > 0


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return Client(str(smollm2_path), local=True, n_ctx=512, n_threads=2)


@pytest.mark.parametrize("prompt", ["中文：你好，世界！我们", "Emoji: 😀😃😄😁 "])
def test_streamed_deltas_are_utf8_and_concatenate(smol, prompt):
    stream = smol.stream(prompt, max_new_tokens=24)
    deltas = list(stream)
    pieces = [smol.tokenizer.piece(t) for t in stream.result.tokens]
    partial = 0
    for p in pieces:
        try:
            p.decode("utf-8")
        except UnicodeDecodeError:
            partial += 1
    assert partial > 0, "the prompt must make tokens that split characters, or the test proves nothing"
    assert "".join(deltas) == stream.result.text
    raw = b"".join(pieces)
    assert stream.result.text == raw.decode("utf-8", errors="replace")
    body = "".join(deltas[:-1])
    assert "\ufffd" not in body  # only an incomplete character cut off at the very end may be replaced
    assert any(ord(ch) > 0x2FFF for ch in stream.result.text)
    for d in deltas:
        assert d.encode("utf-8").decode("utf-8") == d


def test_seeded_sampling_replays(smol):
    a = smol.generate("Once upon a time", max_new_tokens=16, temperature=0.9, top_p=0.95, seed=7)
    b = smol.generate("Once upon a time", max_new_tokens=16, temperature=0.9, top_p=0.95, seed=7)
    c = smol.generate("Once upon a time", max_new_tokens=16, temperature=0.9, top_p=0.95, seed=8)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


def test_stop_string_ends_generation(smol):
    full = smol.generate("Count: 1, 2, 3,", max_new_tokens=16)
    assert " 5" in full.text
    cut = smol.generate("Count: 1, 2, 3,", max_new_tokens=16, stop=[" 5"])
    assert cut.text == full.text[: full.text.index(" 5")]
    assert cut.telemetry.finish_reason == "stop"


def test_chat_equals_llama_cpp_chat_completion(smol, smollm2_path):
    messages = [
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    oracle = llama_cpp.Llama(model_path=str(smollm2_path), n_ctx=512, n_threads=2, flash_attn=True, verbose=False)
    expected = oracle.create_chat_completion(messages, max_tokens=24, temperature=0.0)
    got = smol.chat(messages, max_new_tokens=24)
    assert got.text == expected["choices"][0]["message"]["content"]
    ids = smol.tokenizer.chat_prompt(messages)
    im_start = smol.tokenizer.encode("<|im_start|>")[-1]
    assert ids.count(im_start) == 3  # SmolLM2's ChatML template: system, user, assistant turns


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt=""), "empty prompt"),
        (dict(prompt="hi", max_new_tokens=0), "max_new_tokens must be >= 1"),
        (dict(prompt="hi " * 600, max_new_tokens=4), "exceeds the model's context of 512"),
        (dict(prompt="hi", max_new_tokens=600), "exceeds the model's context of 512"),
        (dict(prompt="hi", temperature=-1.0), "temperature"),
    ],
)
def test_bad_requests_are_refused(smol, kwargs, message):
    with pytest.raises(RequestError, match=message):
        smol.generate(**kwargs)
