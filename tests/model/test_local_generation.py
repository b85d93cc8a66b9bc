"""Local backend against llama-cpp-python's own whole-model output (the oracle), and several
concurrent sessions on one local Client against their solo runs."""

from __future__ import annotations

import threading

import llama_cpp
import pytest

from swarm import Client
from swarm.errors import Busy, RequestError
from tests.helpers.oracle import oracle

PROMPT = "The three most important inventions of the twentieth century are"


@pytest.mark.parametrize("fixture", ["smollm2_path", "qwen_path"])
def test_greedy_equals_llama_cpp_create_completion(fixture, request):
    path = request.getfixturevalue(fixture)
    expected = oracle(path, PROMPT, 32, n_ctx=2048, n_threads=2)
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
    oracle = llama_cpp.Llama(  # decode steps on 1 thread, as the numeric contract runs them
        model_path=str(smollm2_path), n_ctx=512, n_threads=1, n_threads_batch=2, flash_attn=True, verbose=False
    )
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


# Several sessions on one local Client: each must give exactly its solo output.

PROMPTS = ("The capital of France is", "List three colors:")


def interleave(streams) -> list[str]:
    """Take one delta from each live stream in turn until all end; the texts they gave."""
    texts = [""] * len(streams)
    live = list(range(len(streams)))
    while live:
        for i in list(live):
            try:
                texts[i] += next(streams[i])
            except StopIteration:
                live.remove(i)
    for text, stream in zip(texts, streams):
        assert stream.result.text == text
    return texts


@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.8, seed=7)], ids=["greedy", "seeded"])
def test_interleaved_streams_equal_solo(smol, sampling):
    solo = [smol.generate(p, max_new_tokens=12, **sampling).text for p in PROMPTS]
    assert solo[0] != solo[1] and all(solo)
    streams = [smol.stream(p, max_new_tokens=12, **sampling) for p in PROMPTS]
    assert interleave(streams) == solo
    assert [s.result.telemetry.generated_tokens for s in streams] == [12, 12]


def test_threads_on_one_client_equal_solo(smol):
    solo = [smol.generate(p, max_new_tokens=12).text for p in PROMPTS]
    barrier = threading.Barrier(len(PROMPTS))
    got: list[str | BaseException | None] = [None] * len(PROMPTS)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            got[i] = smol.generate(PROMPTS[i], max_new_tokens=12).text
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            got[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == solo


def test_more_sessions_than_slots_is_busy_and_closing_frees_them(smol):
    n_slots = smol._engine.max_sessions  # noqa: SLF001 - the engine's session limit
    assert n_slots >= 2
    open_streams = [smol.stream(PROMPTS[i % 2], max_new_tokens=12) for i in range(n_slots)]
    try:
        for s in open_streams:
            next(s)  # the session opens with the first step
        extra = smol.stream(PROMPTS[0], max_new_tokens=12)
        with pytest.raises(Busy, match=f"all {n_slots} local sessions are in use"):
            next(extra)
    finally:
        for s in open_streams:
            s.close()
    solo = smol.generate(PROMPTS[0], max_new_tokens=12).text
    assert smol.stream(PROMPTS[0], max_new_tokens=12).run().text == solo


def test_abandoned_streams_free_their_slots(smol):
    solo = [smol.generate(p, max_new_tokens=12).text for p in PROMPTS]
    n_slots = smol._engine.max_sessions  # noqa: SLF001 - the engine's session limit
    streams = [smol.stream(PROMPTS[i % 2], max_new_tokens=12) for i in range(n_slots)]
    try:
        for s in streams:
            next(s)
            next(s)
        streams[0].close()  # closed mid-way
        del streams[1]  # dropped mid-way, never closed: freed when the engine needs the slot
        # Both reuse the freed slots (sequences holding a half generation) and are exact.
        fresh = [smol.stream(p, max_new_tokens=12) for p in PROMPTS]
        assert interleave(fresh) == solo
    finally:
        for s in streams:
            s.close()


def test_shared_cache_overflow_is_busy(smol):
    # smol's context is 512 tokens, shared by all of its sessions.
    big = smol.stream(PROMPTS[0], max_new_tokens=400)
    try:
        next(big)
        n_prompt = len(smol.tokenizer.encode(PROMPTS[1]))
        second = smol.stream(PROMPTS[1], max_new_tokens=200)
        free = 512 - (len(smol.tokenizer.encode(PROMPTS[0])) + 400)
        with pytest.raises(Busy, match=f"needs {n_prompt + 200} KV tokens but only {free} of the 512"):
            next(second)
    finally:
        big.close()
    assert smol.generate(PROMPTS[1], max_new_tokens=200).telemetry.generated_tokens > 0


def test_session_closed_mid_way_leaves_others_exact(smol):
    """Closing a session while another runs must not open a hole under the running one's cells.

    llama.cpp puts new tokens in the first free cell from its search head, and freeing a sequence
    moves that head back: the running session's next tokens would land below its earlier ones, and
    flash attention (which sums over cells in cell order) drifts from the solo run.
    """
    solo = smol.generate(PROMPT, max_new_tokens=32)
    a = smol.stream(PROMPT, max_new_tokens=32)
    try:
        text = next(a) + next(a) + next(a)
        b = smol.stream("List three colors of the rainbow, please, now", max_new_tokens=8)
        next(b)
        text += next(a) + next(a) + next(a) + next(a)
        b.close()
        text += "".join(a)
    finally:
        a.close()
    assert a.result.tokens == solo.tokens
    assert text == solo.text
