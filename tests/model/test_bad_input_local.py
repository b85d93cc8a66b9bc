"""Bad user input with the real model (SmolLM2 on llama.cpp): text that is not UTF-8 in argv, on
stdin in the REPL and from Python, and sampling values at their edges. One error line and a
non-zero exit on the CLI; the REPL keeps chatting; Python raises RequestError and the client stays
usable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from swarm import Client
from swarm.errors import RequestError


def swarm(
    *args: str | bytes, stdin: bytes | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swarm.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.decode(errors="replace").splitlines() if ln.startswith("swarm: error:")]


@pytest.fixture(scope="module")
def client(smollm2_path):
    with Client(str(smollm2_path), local=True, n_threads=2) as c:
        yield c


def test_latin1_byte_in_argv_is_one_error_line(smollm2_path):
    proc = swarm("chat", "--local", "--model", str(smollm2_path), "--prompt", b"caf\xe9 au lait")
    assert proc.returncode == 1
    assert b"Traceback" not in proc.stderr and proc.stdout == b""
    assert error_lines(proc) == [
        "swarm: error: --prompt is not valid UTF-8 text: byte 0xe9 at character 3 "
        "(is the terminal's encoding UTF-8?)"
    ]


# A UTF-8 desktop locale reads stdin strictly (input() would raise UnicodeDecodeError); the C and
# C.UTF-8 locales of containers use surrogateescape. The REPL must survive both.
@pytest.mark.parametrize("io_encoding", [None, "utf-8:strict"])
def test_repl_reports_a_line_that_is_not_utf8_and_keeps_chatting(smollm2_path, client, io_encoding):
    env = {"PYTHONIOENCODING": io_encoding} if io_encoding else None
    proc = swarm(
        "chat",
        "--local",
        "--model",
        str(smollm2_path),
        "--threads",
        "2",
        "--max-new-tokens",
        "16",
        stdin=b"caf\xe9 au lait\nWhat is 2+2?\n/quit\n",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
    [error] = error_lines(proc)
    assert "chat message 0 content is not valid UTF-8 text: byte 0xe9 at character 3" in error
    # The bad turn was dropped: the answer is that of a fresh chat with only the good question.
    expected = client.chat([{"role": "user", "content": "What is 2+2?"}], max_new_tokens=16)
    assert proc.stdout.decode() == "> > " + expected.text + "\n> "


def test_a_temperature_that_overflows_is_greedy_on_the_cli(smollm2_path):
    args = ("chat", "--local", "--model", str(smollm2_path), "--threads", "2", "--max-new-tokens", "8")
    greedy = swarm(*args, "--prompt", "The capital of France is", "--temperature", "0")
    tiny = swarm(*args, "--prompt", "The capital of France is", "--temperature", "1e-310")
    assert greedy.returncode == tiny.returncode == 0
    assert tiny.stdout == greedy.stdout and greedy.stdout.strip()
    assert b"Warning" not in tiny.stderr and b"overflow" not in tiny.stderr


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda c: c.generate("hi \ud83d"), r"prompt is not valid UTF-8 text: lone surrogate U\+D83D"),
        (lambda c: c.generate("caf\udce9"), "prompt is not valid UTF-8 text: byte 0xe9"),
        (lambda c: c.chat([{"role": "user", "content": "\ud83d\ude00 ok \udc00"}]), "chat message 0 content"),
        (lambda c: c.chat("hello"), "non-empty list of messages"),
        (lambda c: c.generate("hi", stop=["\ud83d"]), "stop string 0 is not valid UTF-8"),
        (lambda c: c.generate("hi", stop=[7]), "stop string 0 must be a string"),
        (lambda c: c.generate("hi", stop=None), "stop must be a list of strings"),
        (lambda c: c.generate("hi", max_new_tokens="8"), "max_new_tokens must be an integer"),
        (lambda c: c.generate("hi", max_new_tokens=10**9), "exceeds the model's context"),
        (lambda c: c.generate("hi", temperature=-1e-310), "temperature must be a finite number >= 0"),
        (lambda c: c.generate("hi", top_p=0.0), r"top_p must be in \(0, 1\]"),
        (lambda c: c.generate("hi", seed=2**64), "seed must be an integer"),
    ],
)
def test_python_api_raises_request_error(client, call, needle):
    with pytest.raises(RequestError, match=needle):
        call(client)


def test_client_stays_usable_and_edge_values_work(client):
    greedy = client.generate("The capital of France is", max_new_tokens=8)
    assert (
        client.generate("The capital of France is", max_new_tokens=8, temperature=1e-310).text == greedy.text
    )
    assert (
        client.generate("The capital of France is", max_new_tokens=8, temperature=5e-324).text == greedy.text
    )
    # top_k far above the vocabulary is the same as no top_k
    a = client.generate("Once upon a time", max_new_tokens=8, temperature=0.8, seed=3, top_k=10**12)
    b = client.generate("Once upon a time", max_new_tokens=8, temperature=0.8, seed=3)
    assert a.text == b.text
    assert client.generate("caf\u00e9 au lait \U0001f600", max_new_tokens=4).tokens  # valid UTF-8 is fine
