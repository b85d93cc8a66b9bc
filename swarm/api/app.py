"""The HTTP routes of `swarm api` (FastAPI): the OpenAI API, the health page, /metrics.

    GET  /                      health page (swarm/api/health.html)
    GET  /v1/swarm/status       the page's JSON: what is served, the latest `swarm status` report
    GET  /metrics               Prometheus text
    GET  /v1/models             the served model
    POST /v1/chat/completions   chat (the model's chat template), streamed as server-sent events or not
    POST /v1/completions        plain prompt, streamed or not

Every failure is an OpenAI-style body {"error": {...}} with a proper status (see
`swarm.api.service.api_error`); a request body that does not validate is a 400. A stream that fails
after its first event ends with an error event instead of `[DONE]`. When a peer is caught computing
wrong, the generation is repaired (swarm/client/generate.py): a whole answer is simply the repaired
text; a stream whose already-sent text the repair changed cannot take it back, and ends with the
error event 502 `repaired_after_streaming` (the request may be sent again: the caught peer is left
out of later routes). A client that disconnects
cancels its generation, and the generation's sessions close on every peer.

This module does not generate (swarm/api/service.py) or read the swarm (swarm/api/health.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from swarm.api import openai_schema as oa
from swarm.api.health import HealthMonitor, health_page, status_json
from swarm.api.metrics import ApiMetrics
from swarm.api.service import GenerationJob, ModelService, api_error
from swarm.client.generate import Correction

_ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
"""Metric label of each generating route."""
MAX_BODY_BYTES = 32 << 20
"""Largest request body: room for a prompt at the 131,072-token cap in any script."""
DISCONNECT_POLL_S = 0.5
"""A non-streamed request checks this often whether its client is still there."""


@dataclass
class _Answer:
    """How one endpoint words its answers (chat messages or plain text)."""

    endpoint: str
    id: str
    model: str
    fingerprint: str
    created: int = field(default_factory=oa.now_s)

    def first_chunks(self) -> list[str]:
        if self.endpoint != "chat":
            return []
        return [self._chat_chunk(oa.ChatDelta(role="assistant", content=""), None)]

    def delta(self, text: str) -> str:
        if self.endpoint == "chat":
            return self._chat_chunk(oa.ChatDelta(content=text), None)
        return self._text(text, None, None).model_dump_json()

    def finish(self, reason: str) -> str:
        if self.endpoint == "chat":
            return self._chat_chunk(oa.ChatDelta(), reason)
        return self._text("", reason, None).model_dump_json()

    def usage_chunk(self, usage: oa.Usage) -> str:
        kind = oa.ChatCompletionChunk if self.endpoint == "chat" else oa.TextCompletion
        chunk = kind(
            id=self.id,
            created=self.created,
            model=self.model,
            system_fingerprint=self.fingerprint,
            choices=[],
            usage=usage,
        )
        return chunk.model_dump_json()

    def whole(self, text: str, reason: str, usage: oa.Usage) -> dict:
        if self.endpoint == "chat":
            return oa.ChatCompletion(
                id=self.id,
                created=self.created,
                model=self.model,
                system_fingerprint=self.fingerprint,
                choices=[oa.ChatChoice(message=oa.AssistantMessage(content=text), finish_reason=reason)],
                usage=usage,
            ).model_dump()
        return self._text(text, reason, usage).model_dump()

    def _chat_chunk(self, delta: oa.ChatDelta, reason: str | None) -> str:
        chunk = oa.ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.model,
            system_fingerprint=self.fingerprint,
            choices=[oa.ChatChunkChoice(delta=delta, finish_reason=reason)],
        )
        return chunk.model_dump_json(exclude_none=True)

    def _text(self, text: str, reason: str | None, usage: oa.Usage | None) -> oa.TextCompletion:
        return oa.TextCompletion(
            id=self.id,
            created=self.created,
            model=self.model,
            system_fingerprint=self.fingerprint,
            choices=[oa.TextChoice(text=text, finish_reason=reason)],
            usage=usage,
        )


class _BodyLimit:
    """ASGI middleware: a request whose Content-Length is over MAX_BODY_BYTES gets a 413 unread."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            size = dict(scope["headers"]).get(b"content-length", b"0")
            if not size.isdigit() or int(size) > MAX_BODY_BYTES:
                err = oa.ApiError(
                    413, f"the request body is over {MAX_BODY_BYTES} bytes", code="body_too_large"
                )
                await JSONResponse(err.body(), status_code=413)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(service: ModelService, monitor: HealthMonitor | None, metrics: ApiMetrics) -> FastAPI:
    """The ASGI app of `swarm api`.

    Args:
        service: the served model and its running generations.
        monitor: the swarm's health monitor, or None for the local backend.
        metrics: the API's Prometheus metrics.
    """
    app = FastAPI(title="swarm", summary="OpenAI-compatible API of a swarm", docs_url=None, redoc_url=None)
    served = {"count": 0}
    backend = "local" if service.client.local else "swarm"
    fingerprint = f"fp_{service.model_id[:12]}"

    app.add_middleware(_BodyLimit)
    started = oa.now_s()

    def count_refusal(request: Request, status: int) -> None:
        endpoint = _ENDPOINTS.get(request.url.path)
        if endpoint is not None:
            metrics.requests.labels(endpoint, str(status)).inc()

    @app.exception_handler(oa.ApiError)
    async def on_api_error(request: Request, e: oa.ApiError):
        if not e.counted:
            count_refusal(request, e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers())

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
            why = (first.get("ctx") or {}).get("error", "")
            message, param = f"the request body is not valid JSON: {why or first.get('msg', '')}", None
        else:
            param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
            message = f"{param or 'body'}: {first.get('msg', 'invalid request')}"
        count_refusal(request, 400)
        return JSONResponse(oa.ApiError(400, message, param=param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, e: StarletteHTTPException):
        code = "not_found" if e.status_code == 404 else None
        return JSONResponse(
            oa.ApiError(e.status_code, str(e.detail), code=code).body(), status_code=e.status_code
        )

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(health_page())

    @app.get("/v1/swarm/status")
    async def swarm_status() -> dict:
        return status_json(
            monitor,
            {
                "model": service.name,
                "model_id": service.model_id,
                "backend": backend,
                "in_flight": len(service.jobs),
                "requests_served": served["count"],
            },
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        return oa.ModelList(data=[oa.ModelCard(id=service.name, created=started)]).model_dump()

    @app.post("/v1/chat/completions")
    async def chat(body: oa.ChatCompletionRequest, request: Request):
        t0 = time.perf_counter()
        service.check_model(body.model)
        tokens = await service.chat_tokens([m.as_template_message() for m in body.messages])
        answer = _Answer("chat", oa.completion_id("chatcmpl"), service.name, fingerprint)
        return await _respond(service, metrics, served, answer, body, tokens, body.token_limit(), request, t0)

    @app.post("/v1/completions")
    async def completions(body: oa.CompletionRequest, request: Request):
        t0 = time.perf_counter()
        service.check_model(body.model)
        tokens = await service.prompt_tokens(body.prompt_text())
        answer = _Answer("completions", oa.completion_id("cmpl"), service.name, fingerprint)
        return await _respond(service, metrics, served, answer, body, tokens, body.token_limit(), request, t0)

    return app


async def _respond(
    service: ModelService,
    metrics: ApiMetrics,
    served: dict,
    answer: _Answer,
    body,
    tokens: list[int],
    max_tokens: int | None,
    request: Request,
    t0: float,
):
    """Start the generation and answer it, streamed or whole; record its metrics when it ends."""
    job = await service.start(
        tokens,
        max_tokens,
        (body.temperature, body.top_p, body.top_k, body.seed),
        body.stop_strings(),
        prompt_param="messages" if answer.endpoint == "chat" else "prompt",
        speculate=body.speculate or 0,
    )
    metrics.in_flight.inc()
    finished = False

    def done(outcome: str) -> None:
        nonlocal finished
        if finished:
            return
        finished = True
        job.cancel()
        service.forget(job)
        metrics.in_flight.dec()
        served["count"] += 1
        stream = job.stream
        metrics.observe(
            answer.endpoint, outcome, time.perf_counter() - t0, stream.telemetry, len(stream.tokens)
        )

    try:
        first = await job.next()
    except BaseException:
        done("disconnected")
        raise
    if first.kind == "error":
        err = api_error(first.error)
        done(str(err.status))
        err.counted = True
        raise err
    if body.stream:
        return EventSourceResponse(
            _events(job, first, answer, body.include_usage(), len(tokens), done),
            ping=15,
            sep="\n",
            background=BackgroundTask(_on_loop, done, "disconnected"),  # also if the stream never started
        )
    try:
        return await _whole(job, first, answer, len(tokens), request, done)
    except BaseException:
        done("disconnected")
        raise


async def _on_loop(fn, *args) -> None:
    """Call `fn(*args)` on the event loop (a BackgroundTask runs plain functions on other threads)."""
    fn(*args)


async def _events(job: GenerationJob, first, answer: _Answer, include_usage: bool, n_prompt: int, done):
    """The server-sent events of a streamed answer: one chunk per text delta, then [DONE]."""
    try:
        for chunk in answer.first_chunks():
            yield {"data": chunk}
        event = first
        while True:
            if event.kind == "delta":
                yield {"data": answer.delta(event.text)}
            elif event.kind == "correction":
                err = repaired_after_streaming(event.correction)
                yield {"data": json.dumps(err.body())}
                done(str(err.status))
                return
            elif event.kind == "done":
                reason = event.result.telemetry.finish_reason or "stop"
                yield {"data": answer.finish(reason)}
                if include_usage:
                    used = oa.usage(n_prompt, len(event.result.tokens), event.result.telemetry.speculation)
                    yield {"data": answer.usage_chunk(used)}
                yield {"data": "[DONE]"}
                done(reason)
                return
            else:
                err = api_error(event.error)
                yield {"data": json.dumps(err.body())}
                done(str(err.status))
                return
            event = await job.next()
    finally:
        done("disconnected")  # a no-op after a normal end; else the client went away mid-stream


def repaired_after_streaming(c: Correction) -> oa.ApiError:
    """The error that ends a stream whose sent text a repair changed (see the module docstring)."""
    return oa.ApiError(
        502,
        f"a peer of the route was caught computing wrong after {c.position} characters of this answer "
        f"were sent; the repaired text differs from what was sent from there on ({len(c.text)} characters "
        f"withdrawn). Send the request again: the peer is left out of later routes",
        type="server_error",
        code="repaired_after_streaming",
    )


async def _whole(job: GenerationJob, first, answer: _Answer, n_prompt: int, request: Request, done):
    """Collect a generation into one body; stop it if the client goes away meanwhile."""
    event = first
    while event.kind in ("delta", "correction"):  # the result holds the repaired text
        try:
            event = await asyncio.wait_for(job.next(), DISCONNECT_POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                done("disconnected")
                return Response(status_code=499)
    if event.kind == "error":
        err = api_error(event.error)
        done(str(err.status))
        err.counted = True
        raise err
    result = event.result
    reason = result.telemetry.finish_reason or "stop"
    done(reason)
    used = oa.usage(n_prompt, len(result.tokens), result.telemetry.speculation)
    return JSONResponse(answer.whole(result.text, reason, used))
