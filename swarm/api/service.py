"""The model behind the API: requests → token streams of one shared `swarm.Client`, run off the event loop.

Every request gets its own `TokenStream` (its own route and sessions on the swarm, its own llama.cpp
context locally), driven by a worker thread of its own: the generation loop is synchronous, the HTTP
server is not. The worker hands text deltas to the event loop through an asyncio queue and checks a
cancel flag after each one, so a client that goes away stops its generation within one token, and
the stream's sessions are closed on every peer (`TokenStream.close`).

Errors of the swarm become `ApiError`s with the HTTP status the API promises: 400 for a bad request
(and `context_length_exceeded` past the model's context, or past what any peer takes per session),
413 for a prompt over the 131,072-token cap, 503 with Retry-After when no route (or no free session)
exists, 502 for a generation the swarm failed. This module does not know HTTP beyond those numbers.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from swarm.api.openai_schema import ApiError
from swarm.client.api import Client
from swarm.client.generate import Correction, Generation, TokenStream
from swarm.errors import Busy, NoRoute, RequestError, SessionTooLong, SwarmError
from swarm.limits import MAX_CONTEXT_TOKENS

DEFAULT_MAX_TOKENS = 512
"""Tokens generated when a request gives no max_tokens (fewer if a session holds fewer past the prompt)."""
DEFAULT_TEMPERATURE = 1.0
"""OpenAI's default temperature; send 0 for greedy decoding."""
RETRY_AFTER_S = 5
"""Retry-After of a 503: about two refreshes of peers' announcements in a small swarm."""


@dataclass(frozen=True)
class Event:
    """What a generation worker reports: a text delta, a correction of text already reported, the
    finished generation, or its error.

    Attributes:
        kind: "delta", "correction", "done" or "error".
        text: the delta (kind "delta").
        correction: text reported earlier that a repair changed (kind "correction": a peer was
            caught computing wrong; swarm/client/generate.py).
        result: the finished generation (kind "done"): its text is the repaired one.
        error: the exception (kind "error").
    """

    kind: str
    text: str = ""
    correction: Correction | None = None
    result: Generation | None = None
    error: BaseException | None = None


class GenerationJob:
    """One request's `TokenStream`, iterated on a worker thread; its events are read on the event loop.

    Args:
        stream: a fresh (not yet iterated) token stream.
        loop: the event loop that reads `next()`.
    """

    def __init__(self, stream: TokenStream, loop: asyncio.AbstractEventLoop):
        self.stream = stream
        self._loop = loop
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._cancel = threading.Event()
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._work, name="swarm-api-generation", daemon=True)

    def start(self) -> "GenerationJob":
        self._thread.start()
        return self

    async def next(self) -> Event:
        """The next event; after "done" or "error" there are no more."""
        return await self._queue.get()

    def cancel(self) -> None:
        """Stop after the current token and close the stream's sessions (idempotent, never blocks)."""
        self._cancel.set()

    def join(self, timeout_s: float) -> None:
        """Wait for the worker to end (after `cancel`, within one step of the route)."""
        self._thread.join(timeout_s)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _emit(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the server's loop has closed: nobody reads any more
            self._cancel.set()

    def _work(self) -> None:
        try:
            for item in self.stream:
                if self._cancel.is_set():
                    break
                if isinstance(item, Correction):
                    self._emit(Event("correction", correction=item))
                else:
                    self._emit(Event("delta", text=item))
            else:
                self._emit(Event("done", result=self.stream.result))
        except BaseException as e:  # noqa: BLE001 - every failure is reported to the request
            self._emit(Event("error", error=e))
        finally:
            try:
                self.stream.close()  # ends the generator: its sessions close on every peer
            finally:
                self.finished.set()


def api_error(e: BaseException) -> ApiError:
    """The HTTP error a failure of a request becomes (see the module docstring)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, RequestError):
        return ApiError(400, str(e))
    if isinstance(e, SessionTooLong):  # no peer takes a session this long: retrying cannot help
        return ApiError(400, str(e), code="context_length_exceeded")
    if isinstance(e, (NoRoute, Busy)):
        code = "no_route" if isinstance(e, NoRoute) else "busy"
        return ApiError(503, str(e), type="server_error", code=code, retry_after_s=RETRY_AFTER_S)
    if isinstance(e, SwarmError):
        return ApiError(
            502, f"the swarm failed this generation: {e}", type="server_error", code="swarm_error"
        )
    return ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")


def token_limit(n: int, max_tokens: int | None, context_limit: int, room: int | None, prompt_param: str) -> int:
    """The tokens a request may generate: its own `max_tokens`, or the default.

    Args:
        n: prompt tokens.
        max_tokens: the request's max_tokens; None: the least of DEFAULT_MAX_TOKENS and what a
            session holds past the prompt.
        context_limit: tokens one generation may hold on this model (its context, at most 131,072).
        room: tokens a session opened now could hold (`Client.session_room`); None: unknown (no
            route now: opening the route will say why), then `context_limit` stands in.
        prompt_param: the request's field holding the prompt, named by errors about its length.
    Raises:
        ApiError: 413 past the 131,072-token cap; 400 `context_length_exceeded` when the prompt
            leaves no room for a token (param: prompt_param) or prompt + max_tokens passes the
            model's context (param: max_tokens). A max_tokens past what the route's peers take per
            session is refused when the route is planned (`SessionTooLong`, also a 400).
    """
    if n > MAX_CONTEXT_TOKENS:
        raise ApiError(
            413,
            f"the prompt has {n} tokens, over the cap of {MAX_CONTEXT_TOKENS} tokens per request",
            code="context_length_exceeded",
            param=prompt_param,
        )
    if max_tokens is None:
        limit = context_limit if room is None else min(room, context_limit)
        if n >= limit:
            where = (
                f"this model's context is {context_limit} tokens"
                if limit == context_limit
                else f"the swarm's peers take at most {limit} tokens per session"
            )
            raise ApiError(
                400,
                f"{where}; the prompt has {n} tokens, which leaves no room for a new token",
                code="context_length_exceeded",
                param=prompt_param,
            )
        return min(DEFAULT_MAX_TOKENS, limit - n)
    if n + max_tokens > context_limit:
        raise ApiError(
            400,
            f"this model's context is {context_limit} tokens; the prompt has {n} tokens and max_tokens is "
            f"{max_tokens} (together {n + max_tokens})",
            code="context_length_exceeded",
            param="max_tokens",
        )
    return max_tokens


class ModelService:
    """The served model: a shared `Client`, the names requests may use for it, running generations.

    Args:
        client: the model's client (swarm or local); shared by every request.
        names: model names this server answers to; the first is the one /v1/models lists.
        model_id: the model's id (sha256 of its manifest).
    """

    def __init__(self, client: Client, names: Sequence[str], model_id: str):
        self.client = client
        self.names = tuple(dict.fromkeys(names))
        self.name = self.names[0]
        self.model_id = model_id
        self.jobs: set[GenerationJob] = set()

    def check_model(self, requested: str) -> None:
        """Raises ApiError 404 when `requested` names another model."""
        if requested not in self.names:
            raise ApiError(
                404,
                f"model {requested!r:.120} is not served here; this server serves {self.name!r}",
                code="model_not_found",
                param="model",
            )

    async def chat_tokens(self, messages: list[dict]) -> list[int]:
        """Token ids of the chat prompt (the model's template), rendered off the event loop.

        Raises:
            ApiError: 400 for a message the template cannot take.
        """
        return await self._tokenize(self.client.tokenizer.chat_prompt, messages)

    async def prompt_tokens(self, prompt: str) -> list[int]:
        """Token ids of a plain prompt (BOS added when the model wants it). Raises ApiError 400."""
        if not prompt:
            raise ApiError(400, "empty prompt", param="prompt")
        return await self._tokenize(self.client.tokenizer.encode, prompt)

    async def _tokenize(self, fn, arg) -> list[int]:
        try:
            return await asyncio.to_thread(fn, arg)
        except RequestError as e:
            raise ApiError(400, str(e)) from None

    async def start(
        self,
        tokens: list[int],
        max_tokens: int | None,
        sampling: tuple[float | None, float | None, int | None, int | None],
        stop: tuple[str, ...],
        prompt_param: str,
        speculate: int = 0,
    ) -> GenerationJob:
        """Start generating after `tokens` on a worker thread (call on the event loop).

        Args:
            tokens: prompt token ids.
            max_tokens: tokens to generate at most; None: DEFAULT_MAX_TOKENS or what a session
                holds past the prompt, whichever is less (`Client.session_room`: on the swarm, what
                the best route's peers take per session).
            sampling: temperature, top_p, top_k, seed (None: 1.0, 1.0, 0, drawn at random);
                temperature 0 is greedy; each request without a seed samples differently, as OpenAI's do.
            stop: strings that end the text (not included).
            prompt_param: the request's field that holds the prompt ("messages" or "prompt"), named
                by errors about its length.
            speculate: drafted tokens per verify pass (0: no speculative decoding).
        Raises:
            ApiError: see `token_limit`; 400 for bad sampling values.
        """
        room = None
        if max_tokens is None and len(tokens) <= MAX_CONTEXT_TOKENS:
            try:
                room = await asyncio.to_thread(self.client.session_room)
            except SwarmError as e:
                raise api_error(e) from None
        max_tokens = token_limit(len(tokens), max_tokens, self.client.context_limit, room, prompt_param)
        temperature, top_p, top_k, seed = sampling
        try:
            stream = self.client.stream_tokens(
                tokens,
                max_new_tokens=max_tokens,
                temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
                top_p=1.0 if top_p is None else top_p,
                top_k=top_k or 0,
                seed=random.getrandbits(63) if seed is None else seed,
                stop=stop,
                speculate=speculate,
            )
        except RequestError as e:
            raise ApiError(400, str(e)) from None
        job = GenerationJob(stream, asyncio.get_running_loop())
        self.jobs.add(job)
        return job.start()

    def forget(self, job: GenerationJob) -> None:
        """Drop a finished or abandoned job from `jobs` (it was cancelled if it still runs)."""
        self.jobs.discard(job)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Cancel every running generation and wait for their sessions to close."""
        for job in list(self.jobs):
            job.cancel()
        for job in list(self.jobs):
            job.join(timeout_s)
        self.jobs.clear()
