"""`swarm api`: the composition root of the HTTP server.

Binds the listen socket first (a busy port fails before anything else starts), then builds the
model's `swarm.Client` (swarm or local), the health monitor on a DHT node of its own, the service,
the metrics and the app, and runs uvicorn on that socket until SIGINT or SIGTERM. On the way out it
cancels every running generation (closing its sessions on the peers) and leaves the swarm.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from swarm.api.app import create_app
from swarm.api.health import HealthMonitor
from swarm.api.metrics import ApiMetrics
from swarm.api.service import ModelService
from swarm.client.api import Client
from swarm.client.connection import SwarmConnection
from swarm.client.status import model_manifest, probe_peers
from swarm.errors import AddressError
from swarm.manifest import build_manifest
from swarm.models import DEFAULT_MODEL, KNOWN_MODELS, is_model_id, resolve_model

GRACEFUL_SHUTDOWN_S = 5.0
"""Open HTTP connections get this long to finish when the server stops."""


@dataclass(frozen=True)
class ApiConfig:
    """Options of `swarm api`.

    Attributes:
        model: known model name, `.gguf` path, or (swarm only) a model_id.
        local: run the whole model in this process instead of on the swarm.
        initial_peers: multiaddrs to join the swarm through (swarm only).
        host: listen address, an IPv4 or IPv6 literal.
        port: TCP port (0: any free port; the ready line on stderr says which).
        n_threads: llama.cpp prompt threads (local only; None: all cores; decode runs on 1).
        draft: the drafts of requests that speculate (swarm only): "lookup", "self", "self:TYPE" or a
            draft GGUF's path (`swarm.Client`'s `draft`).
        status_period_s: seconds between reads of the swarm's announcements for the health page.
    """

    model: str = DEFAULT_MODEL
    local: bool = False
    initial_peers: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    n_threads: int | None = None
    draft: str = "lookup"
    status_period_s: float = 2.0


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening), for uvicorn.

    Raises:
        AddressError: host is not an IP literal, port out of range, or the address is in use.
    """
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise AddressError(f"--host must be an IPv4 or IPv6 literal, got {host!r}") from None
    if not 0 <= port <= 65535:
        raise AddressError(f"--port must be in 0..65535, got {port}")
    sock = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise AddressError(f"cannot listen on {host} port {port}: {e.strerror}") from None
    return sock


def model_names(model: str, model_id: str) -> list[str]:
    """Names a request's `model` may use: the given name (for a path, its file name first), the model_id."""
    if model in KNOWN_MODELS or is_model_id(model):
        return [model, model_id]
    return [Path(model).name, model, model_id]


def run_api(cfg: ApiConfig) -> None:
    """Serve the API until SIGINT (KeyboardInterrupt) or SIGTERM (exit status 0).

    Raises:
        AddressError: the listen address cannot be used.
        ModelError, SwarmError: the model or the swarm could not be reached.
    """
    sock = bind(cfg.host, cfg.port)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    client = conn = service = None
    try:
        client = Client(cfg.model, local=cfg.local, initial_peers=cfg.initial_peers, n_threads=cfg.n_threads,
                        draft=cfg.draft)
        monitor = None
        if cfg.local:
            model_id = build_manifest(resolve_model(cfg.model)).model_id
        else:
            conn = SwarmConnection(list(cfg.initial_peers))
            manifest = model_manifest(conn, cfg.model)
            model_id = manifest.model_id
            monitor = HealthMonitor(
                _announcement_reader(conn, model_id, manifest.n_layers), model_id, manifest.n_layers,
                cfg.status_period_s, _peer_prober(conn),
            )
        service = ModelService(client, model_names(cfg.model, model_id), model_id)
        metrics = ApiMetrics(lambda: None if monitor is None else monitor.report)
        app = create_app(service, monitor, metrics)
        asyncio.run(_serve(app, sock, monitor, _ready_line(sock)))
    finally:
        if service is not None:
            service.shutdown()
        if client is not None:
            client.close()
        if conn is not None:
            conn.close()
        sock.close()


def _exit_on_sigterm(sig, frame) -> None:
    raise SystemExit(0)  # uvicorn stops gracefully first, then re-raises the signal it caught


def _announcement_reader(conn: SwarmConnection, model_id: str, n_layers: int):
    async def read():
        read_now = conn.dht.get_announcements(model_id, n_layers)  # spans past the model dropped, logged
        fut = asyncio.run_coroutine_threadsafe(read_now, conn.loop.loop)
        return await asyncio.wrap_future(fut)

    return read


def _peer_prober(conn: SwarmConnection):
    async def probe(announced):
        fut = asyncio.run_coroutine_threadsafe(probe_peers(conn, announced), conn.loop.loop)
        return await asyncio.wrap_future(fut)

    return probe


def _ready_line(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    return f"swarm api: OpenAI API at {base}/v1, health page at {base}/, metrics at {base}/metrics"


async def _serve(app, sock: socket.socket, monitor: HealthMonitor | None, ready_line: str) -> None:
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    tasks = [asyncio.create_task(monitor.run())] if monitor is not None else []
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started:
            print(ready_line, file=sys.stderr, flush=True)
        await serving
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not serving.done():
            server.should_exit = True
            await asyncio.gather(serving, return_exceptions=True)
