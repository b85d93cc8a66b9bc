"""Request and response bodies of the OpenAI API subset that `swarm api` speaks (pydantic models).

Requests accept the fields the official `openai` client sends; fields that change nothing here
(`user`, `frequency_penalty` at 0, ...) are ignored, fields whose meaning this server cannot honour
(`n` other than 1, `logprobs`, `echo`, `suffix`, tools) are refused with a 400. Sampling values
are checked again by `swarm.sampling.SamplingParams` when the generation starts. Extension:
`speculate` (drafted tokens per verify pass) turns speculative decoding on; its counts come back in
`usage.speculation`.

This module does not tokenize, generate or do I/O.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from swarm.limits import MAX_VERIFY_ROWS
from swarm.spec.verify import Acceptance

MAX_STOP_STRINGS = 16
"""Stop strings one request may give (OpenAI allows 4; llama-server more)."""
MAX_STOP_CHARS = 256
"""Longest stop string, characters."""


class ApiError(Exception):
    """A request that gets an HTTP error with an OpenAI-style body instead of a completion.

    Args:
        status: HTTP status code (400, 404, 413, 502, 503, ...).
        message: one line for the user.
        type: OpenAI error type, e.g. "invalid_request_error".
        code: machine-readable code, e.g. "context_length_exceeded", or None.
        param: the request field at fault, or None.
        retry_after_s: sets the Retry-After header (503), or None.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.retry_after_s = retry_after_s
        self.counted = False  # set once the request's outcome is in the metrics

    def body(self) -> dict:
        """The JSON body: {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        """Extra response headers (Retry-After on a 503)."""
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class _Request(BaseModel):
    """Fields shared by both completion endpoints."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, description="extension (llama-server): 0 means off")
    seed: int | None = Field(default=None, ge=0, lt=1 << 64)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: dict | None = None
    logprobs: bool | int | None = None
    speculate: int | None = Field(
        default=None, ge=0, lt=MAX_VERIFY_ROWS,
        description="extension: speculative decoding with up to this many drafted tokens per verify "
                    "pass (0 or absent: off); the text is the same as without it",
    )

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"each stop string must have 1..{MAX_STOP_CHARS} characters")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: bool | int | None) -> bool | int | None:
        if v:
            raise ValueError("logprobs are not supported")
        return v

    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple (empty when none)."""
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def include_usage(self) -> bool:
        """Whether a streamed answer ends with a chunk carrying `usage` (stream_options.include_usage)."""
        return bool((self.stream_options or {}).get("include_usage"))


class TextPart(BaseModel):
    """One part of a message's content given as a list: only text parts are accepted."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat message: role and text content (a string or a list of text parts)."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = ""

    def as_template_message(self) -> dict:
        """{"role", "content"} for the chat template ("developer" is rendered as "system")."""
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list | None = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, v: list | None) -> list | None:
        if v:
            raise ValueError("tools are not supported")
        return v

    def token_limit(self) -> int | None:
        """max_completion_tokens, else max_tokens, else None (the server's default)."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Request):
    """POST /v1/completions (a plain prompt, no chat template)."""

    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt is supported")
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v

    def prompt_text(self) -> str:
        """The one prompt."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def token_limit(self) -> int | None:
        """max_tokens, or None (the server's default)."""
        return self.max_tokens


class Usage(BaseModel):
    """Token counts of one request: prompt tokens as tokenized here, generated tokens; a request
    that speculated also gets the extension `speculation` (`usage`)."""

    model_config = ConfigDict(extra="allow")

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def usage(prompt_tokens: int, completion_tokens: int, speculation: Acceptance | None = None) -> Usage:
    """A `Usage` with the total filled in, and with speculation's counts when the request speculated:
    `{"passes", "drafted_tokens", "accepted_tokens", "acceptance_rate", "tokens_per_pass",
    "passes_sent_ahead", "passes_sent_ahead_used"}` (the last two: pipelined passes)."""
    extra = {}
    if speculation is not None:
        extra["speculation"] = {
            "passes": speculation.passes,
            "drafted_tokens": speculation.drafted,
            "accepted_tokens": speculation.accepted,
            "acceptance_rate": round(speculation.rate, 4),
            "tokens_per_pass": round(speculation.tokens_per_pass, 4),
            "passes_sent_ahead": speculation.ahead_sent,
            "passes_sent_ahead_used": speculation.ahead_used,
        }
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        **extra,
    )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    """The body of a non-streamed chat completion."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class TextCompletion(BaseModel):
    """The body of a /v1/completions answer, and (object "text_completion") of each streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[TextChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """One entry of GET /v1/models."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "swarm"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def completion_id(prefix: str) -> str:
    """A fresh id such as "chatcmpl-3f2a…" (prefix "chatcmpl") or "cmpl-…"."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    """Unix time in whole seconds, for the `created` fields."""
    return int(time.time())
