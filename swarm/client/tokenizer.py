"""Tokenizer and chat template of a GGUF, through llama.cpp's own vocabulary code.

The swarm client loads the GGUF with `vocab_only=True` (no weights, no compute context), so it
tokenizes exactly as llama.cpp does; the local backend reuses the vocabulary of its loaded model.
Chat prompts are rendered with the GGUF's `tokenizer.chat_template` by llama-cpp-python's Jinja2
formatter, the same path as its `create_chat_completion`.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from swarm.client.text import check_utf8
from swarm.errors import ModelError, RequestError

_ROLES = {"system", "user", "assistant", "tool"}


@llama_cpp.llama_log_callback
def _quiet_log(level, text, user_data):  # llama.cpp's load chatter would corrupt `swarm chat` output
    pass


if not os.environ.get("SWARM_LLAMA_LOG"):
    llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))


def context_length(llama: llama_cpp.Llama) -> int:
    """The model's training context in tokens, from GGUF metadata (also for vocab-only loads)."""
    arch = llama.metadata.get("general.architecture", "")
    return int(llama.metadata.get(f"{arch}.context_length", 0)) or llama.n_ctx()


def load_llama(path: Path, **kwargs) -> llama_cpp.Llama:
    """Load a GGUF with llama-cpp-python, turning its failures into `ModelError`.

    Raises:
        ModelError: llama.cpp refused the file, or its path is not UTF-8 (llama-cpp-python passes
            paths as UTF-8 text, so a Latin-1 file name cannot reach it).
    """
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise ModelError(
            f"model path {path} is not UTF-8, which llama.cpp needs: rename the file or link it"
        ) from None
    try:
        return llama_cpp.Llama(model_path=str(path), verbose=False, **kwargs)
    except (ValueError, RuntimeError) as e:
        raise ModelError(f"llama.cpp cannot load {path}: {e}") from e


class Tokenizer:
    """Text ↔ token ids for one model.

    Args:
        llama: a loaded `llama_cpp.Llama` (full model or `vocab_only=True`).
    """

    def __init__(self, llama: llama_cpp.Llama):
        self._llama = llama
        self._vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self.n_vocab = llama.n_vocab()

    @classmethod
    def from_gguf(cls, path: Path) -> "Tokenizer":
        """Load only the vocabulary of the GGUF at `path` (no weights). Raises ModelError."""
        return cls(load_llama(path, vocab_only=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with BOS when the model asks for it; special tokens are parsed
        (as llama-cpp-python's `create_completion` does).

        Raises:
            RequestError: `text` is not a str or not valid UTF-8 (`swarm.client.text.check_utf8`).
        """
        return self._llama.tokenize(check_utf8(text, "prompt").encode("utf-8"), add_bos=True, special=True)

    def piece(self, token: int) -> bytes:
        """The bytes of one generated token (may be part of a UTF-8 character)."""
        # A buffer per call: ctypes releases the GIL, so streams of one Client on several threads
        # would otherwise write one shared buffer at once.
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of several tokens (invalid UTF-8 replaced)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_end(self, token: int) -> bool:
        """Whether `token` ends generation (EOS, EOT and the model's other end-of-generation ids)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def _text(self, token: int) -> str:
        if token < 0:
            return ""
        return llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of `messages` rendered with the GGUF's chat template and a generation prompt.

        Args:
            messages: [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...]
        Raises:
            RequestError: no messages, a malformed message, content that is not valid UTF-8, or a
                model without a chat template.
        """
        try:
            messages = [] if isinstance(messages, (str, bytes, dict)) else list(messages)
        except TypeError:
            messages = []
        if not messages:
            raise RequestError("chat needs a non-empty list of messages")
        for i, m in enumerate(messages):
            if (
                not isinstance(m, dict)
                or m.get("role") not in _ROLES
                or not isinstance(m.get("content"), str)
            ):
                raise RequestError(
                    f"malformed chat message {m!r:.200}: need role in {sorted(_ROLES)} and str content"
                )
            check_utf8(m["content"], f"chat message {i} content")
        template = self._llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise RequestError("this model has no chat template; use generate() with a plain prompt")
        eos, bos = self._llama.token_eos(), self._llama.token_bos()
        formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._text(eos),
            bos_token=self._text(bos),
        )
        try:
            rendered = formatter(messages=messages)
        except Exception as e:  # noqa: BLE001 - a template error must reach the user as one line
            raise RequestError(f"chat template failed: {e}") from e
        return self._llama.tokenize(
            rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
        )
