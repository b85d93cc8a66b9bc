"""`swarm serve --metrics-port N`: a peer's Prometheus metrics over HTTP (text format, GET /metrics).

Per session (one span stream): sessions served, how long each lasted. Per step (one frame answered):
frames and bytes each way, the time from a client frame's arrival to its reply (the peer's share of
a step's latency, compute included). Frames another peer pushed in (server push) count as direction
"push_in"; their steps are not timed (they arrive on another stream than the one answered). Read
at scrape time from the span's state: the span, open and free session slots, free KV-cache tokens,
the measured throughput, whether it drains or shuts down; and the limits per client
(swarm/peer/quotas.py): streams open, frame bytes in flight now and at most since start, the byte
budget, refusals by limit, and the scheduler's fairness (the longest run of units a client with
work queued waited unserved).

The metrics wrap the stream handler from outside (`PeerMetrics.wrap`) and read the session table;
they never change either. The HTTP server is prometheus_client's own, on a daemon thread.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from swarm.errors import AddressError
from swarm.peer.quotas import ClientLedger
from swarm.peer.span import Span

STEP_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Step latency buckets, seconds: from a decode step of a few layers to a long prefill chunk."""
SESSION_BUCKETS_S = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
"""Session duration buckets, seconds."""


class PeerMetrics:
    """A peer's metrics registry and the wrapper that feeds it.

    Args:
        span: the served span: read at scrape time.
        ledger: the streams' limits per client: read at scrape time.
    """

    def __init__(self, span: Span, ledger: ClientLedger):
        self.span, self.ledger = span, ledger
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Counter("swarm_peer_streams", "Span streams (client sessions) served", registry=r)
        self.session_seconds = Histogram(
            "swarm_peer_stream_duration_seconds",
            "Span stream lifetimes",
            buckets=SESSION_BUCKETS_S,
            registry=r,
        )
        self.frames = Counter("swarm_peer_frames", "Frames on span streams", ["direction"], registry=r)
        self.bytes = Counter(
            "swarm_peer_frame_bytes", "Frame bytes on span streams", ["direction"], registry=r
        )
        self.step_seconds = Histogram(
            "swarm_peer_step_seconds",
            "From a frame's arrival to the reply",
            buckets=STEP_BUCKETS_S,
            registry=r,
        )
        r.register(_SpanCollector(self))

    def wrap(self, handler):
        """The stream handler `handler(stream)`, counting its session and timing each frame it answers."""

        async def counted(stream) -> None:
            self.sessions.inc()
            t0 = time.perf_counter()
            try:
                await handler(_TimedStream(stream, self))
            finally:
                self.session_seconds.observe(time.perf_counter() - t0)

        return counted

    def wrap_push(self, handler):
        """The push stream handler `handler(stream)`, counting the frames and bytes pushed in."""

        async def counted(stream) -> None:
            await handler(_PushedStream(stream, self))

        return counted

    def serve(self, host: str, port: int) -> None:
        """Start the HTTP server for GET /metrics on host:port (a daemon thread).

        Raises:
            AddressError: the port is out of range or in use.
        """
        if not 0 < port <= 65535:
            raise AddressError(f"--metrics-port must be in 1..65535, got {port}")
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise AddressError(f"cannot serve metrics on {host} port {port}: {e.strerror}") from None


class _TimedStream:
    """A span stream that reports frames, bytes and reply latency to `PeerMetrics`."""

    def __init__(self, stream, metrics: PeerMetrics):
        self._stream, self._m = stream, metrics
        self._received_at: float | None = None

    async def recv(self, *args, **kwargs) -> bytes:
        data = await self._stream.recv(*args, **kwargs)
        self._received_at = time.perf_counter()
        self._m.frames.labels("in").inc()
        self._m.bytes.labels("in").inc(len(data))
        return data

    async def send(self, data: bytes) -> None:
        await self._stream.send(data)
        if self._received_at is not None:
            self._m.step_seconds.observe(time.perf_counter() - self._received_at)
            self._received_at = None
        self._m.frames.labels("out").inc()
        self._m.bytes.labels("out").inc(len(data))

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _PushedStream:
    """A push stream that reports the frames and bytes it receives to `PeerMetrics`."""

    def __init__(self, stream, metrics: PeerMetrics):
        self._stream, self._m = stream, metrics

    async def recv(self, *args, **kwargs) -> bytes:
        data = await self._stream.recv(*args, **kwargs)
        self._m.frames.labels("push_in").inc()
        self._m.bytes.labels("push_in").inc(len(data))
        return data

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _SpanCollector:
    """Gauges read from the span's state at scrape time."""

    def __init__(self, metrics: PeerMetrics):
        self._m = metrics

    def collect(self):
        served = self._m.span
        s = served.sessions
        span = [f"{served.start}:{served.end}"]
        for name, doc, value in (
            ("swarm_peer_sessions_open", "Sessions holding a slot now", len(s)),
            ("swarm_peer_sessions_free", "Free session slots", s.sessions_free),
            ("swarm_peer_max_sessions", "Session slots", s.max_sessions),
            (
                "swarm_peer_free_cache_tokens",
                "KV-cache tokens a new session can reserve",
                s.free_cache_tokens,
            ),
            ("swarm_peer_cache_tokens", "KV-cache tokens in all", s.cache_tokens),
            ("swarm_peer_shutting_down", "1 while the peer leaves", float(served.shutting_down)),
        ):
            family = GaugeMetricFamily(name, doc, labels=["span"])
            family.add_metric(span, value)
            yield family
        tp = served.throughput
        for name, doc, value in (
            ("swarm_peer_decode_steps_per_second", "Measured decode steps/s of the span",
             tp.decode_steps_per_s),
            ("swarm_peer_prefill_tokens_per_second", "Measured prefill tokens/s", tp.prefill_tokens_per_s),
        ):
            family = GaugeMetricFamily(name, doc, labels=["span"])
            family.add_metric(span, value)
            yield family
        ledger = self._m.ledger
        for name, doc, value in (
            ("swarm_peer_streams_open", "Span and push streams open now", ledger.open_streams),
            ("swarm_peer_buffered_bytes", "Frame bytes in flight now", ledger.reserved_bytes),
            ("swarm_peer_buffered_bytes_peak", "Most frame bytes in flight at once since start",
             ledger.peak_reserved_bytes),
            ("swarm_peer_buffered_bytes_budget", "Frame bytes in flight allowed (max_buffered_bytes)",
             ledger.limits.max_buffered_bytes),
            ("swarm_peer_client_wait_units_max", "Most units a client with work queued waited unserved",
             served.scheduler.fairness.max_wait_units),
        ):
            family = GaugeMetricFamily(name, doc, labels=["span"])
            family.add_metric(span, value)
            yield family
        for name, doc, value in (
            ("swarm_peer_scheduler_holds", "Units held back for a lighter client's due decode step",
             served.scheduler.holds),
            ("swarm_peer_scheduler_held_ms", "ms the executor stood idle in those holds",
             served.scheduler.held_ms),
            ("swarm_peer_scheduler_preemptions", "Prefill chunks stopped for a lighter client's work",
             served.scheduler.preemptions),
            ("swarm_peer_scheduler_preempted_ms", "Compute ms those chunks had spent (done again)",
             served.scheduler.preempted_ms),
        ):
            family = CounterMetricFamily(name, doc, labels=["span"])
            family.add_metric(span, value)
            yield family
        refusals = CounterMetricFamily("swarm_peer_limit_refusals", "Streams and frames refused BUSY by a limit",
                                       labels=["limit"])
        for limit, count in sorted(ledger.refusals.items()):
            refusals.add_metric([limit], count)
        yield refusals
