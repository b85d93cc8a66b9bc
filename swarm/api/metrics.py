"""Prometheus metrics of `swarm api` (GET /metrics, text format), in a registry of their own.

Per request: counts by endpoint and outcome, latency histograms (whole request, time to first
token, time between tokens), prompt and completion tokens, requests in flight. Per peer, from each
finished request's Generation Telemetry: steps, compute and network seconds, bytes, mean step
latency per request, failovers. And, read at scrape time from the health monitor's last status
report: whether a route exists, its estimated speed, and each announced peer's span, speed, free
sessions and free cache.

This module does not time anything itself: callers pass the telemetry and durations in.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from swarm.client.status import StatusReport
from swarm.client.telemetry import GenerationTelemetry

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Histogram buckets, seconds: from one decode step on loopback to a long generation."""


class ApiMetrics:
    """The API's metrics.

    Args:
        status: returns the health monitor's latest report, or None (local backend, not read yet).
    """

    def __init__(self, status: Callable[[], StatusReport | None]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "swarm_api_requests",
            "Finished requests by endpoint and outcome",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge("swarm_api_requests_in_flight", "Requests being answered", registry=r)
        self.request_seconds = Histogram(
            "swarm_api_request_duration_seconds",
            "Whole request",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.ttft_seconds = Histogram(
            "swarm_api_time_to_first_token_seconds",
            "Request start to first token",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.token_seconds = Histogram(
            "swarm_api_inter_token_latency_seconds",
            "Time between generated tokens",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.tokens = Counter("swarm_api_tokens", "Tokens by kind (prompt, completion)", ["kind"], registry=r)
        self.peer_steps = Counter(
            "swarm_api_peer_steps", "Frames exchanged with each peer", ["peer"], registry=r
        )
        self.peer_compute_s = Counter(
            "swarm_api_peer_compute_seconds", "Compute time peers reported", ["peer"], registry=r
        )
        self.peer_network_s = Counter(
            "swarm_api_peer_network_seconds", "Round trip minus compute, per peer", ["peer"], registry=r
        )
        self.peer_bytes = Counter("swarm_api_peer_bytes", "Frame bytes", ["peer", "direction"], registry=r)
        self.peer_step_seconds = Histogram(
            "swarm_api_peer_step_seconds",
            "Mean step time (compute + network) of each request at each peer",
            ["peer"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.peer_failovers = Counter(
            "swarm_api_peer_failovers", "Hops replaced mid-generation", ["peer", "reason"], registry=r
        )
        self.speculation = Counter(
            "swarm_api_speculation",
            "Speculative decoding: verify passes, drafted and accepted tokens, passes sent ahead and used",
            ["kind"], registry=r,
        )
        r.register(_StatusCollector(status))

    def observe(
        self,
        endpoint: str,
        outcome: str,
        duration_s: float,
        telemetry: GenerationTelemetry | None,
        completion_tokens: int,
    ) -> None:
        """Record one finished request.

        Args:
            endpoint: "chat" or "completions".
            outcome: finish reason ("stop", "length"), "disconnected", or an error's HTTP status.
            duration_s: from the request's arrival to its last byte, seconds.
            telemetry: the generation's record (None when none started).
            completion_tokens: tokens generated (also for a generation cut short).
        """
        self.requests.labels(endpoint, outcome).inc()
        self.request_seconds.labels(endpoint).observe(duration_s)
        if telemetry is None:
            return
        self.tokens.labels("prompt").inc(telemetry.prompt_tokens)
        self.tokens.labels("completion").inc(completion_tokens)
        lat = telemetry.token_latencies_ms
        if lat:
            self.ttft_seconds.labels(endpoint).observe(lat[0] / 1000.0)
        for ms in lat[1:]:
            self.token_seconds.observe(ms / 1000.0)
        for hop in telemetry.route:
            self.peer_steps.labels(hop.peer_id).inc(hop.steps)
            self.peer_compute_s.labels(hop.peer_id).inc(hop.compute_ms / 1000.0)
            self.peer_network_s.labels(hop.peer_id).inc(max(hop.network_ms, 0.0) / 1000.0)
            self.peer_bytes.labels(hop.peer_id, "sent").inc(hop.bytes_sent)
            self.peer_bytes.labels(hop.peer_id, "received").inc(hop.bytes_received)
            if hop.steps:
                self.peer_step_seconds.labels(hop.peer_id).observe(
                    (hop.compute_ms + max(hop.network_ms, 0.0)) / hop.steps / 1000.0
                )
        for f in telemetry.failovers:
            self.peer_failovers.labels(f.peer_id, f.reason).inc()
        if telemetry.speculation is not None:
            spec = telemetry.speculation
            self.speculation.labels("passes").inc(spec.passes)
            self.speculation.labels("drafted").inc(spec.drafted)
            self.speculation.labels("accepted").inc(spec.accepted)
            self.speculation.labels("sent_ahead").inc(spec.ahead_sent)
            self.speculation.labels("sent_ahead_used").inc(spec.ahead_used)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _StatusCollector:
    """Gauges read at scrape time from the latest status report."""

    def __init__(self, status: Callable[[], StatusReport | None]):
        self._status = status

    def collect(self):
        report = self._status()
        if report is None:
            return
        yield GaugeMetricFamily(
            "swarm_route_exists",
            "1 when a chain of spans covers every layer",
            value=float(report.chains.complete),
        )
        yield GaugeMetricFamily(
            "swarm_best_route_tokens_per_second",
            "Estimated decode speed of the best route",
            value=report.best_route_tokens_per_s or 0.0,
        )
        yield GaugeMetricFamily(
            "swarm_routable_tokens_per_second",
            "Max flow through the chains",
            value=report.chains.routable_tokens_per_s,
        )
        yield GaugeMetricFamily("swarm_peers", "Announced peers of the model", value=len(report.peers))
        labels = ["peer", "span", "name"]
        families = {
            "decode": GaugeMetricFamily(
                "swarm_peer_decode_steps_per_second", "Announced decode steps/s", labels=labels
            ),
            "prefill": GaugeMetricFamily(
                "swarm_peer_prefill_tokens_per_second", "Announced prefill tokens/s", labels=labels
            ),
            "cache": GaugeMetricFamily(
                "swarm_peer_free_cache_tokens", "Announced free KV-cache tokens", labels=labels
            ),
            "free": GaugeMetricFamily(
                "swarm_peer_sessions_free", "Announced free session slots", labels=labels
            ),
            "max": GaugeMetricFamily("swarm_peer_max_sessions", "Announced session slots", labels=labels),
        }
        for p in report.peers:
            values = [p.peer_id, f"{p.start}:{p.end}", p.public_name or ""]
            families["decode"].add_metric(values, p.decode_steps_per_s)
            families["prefill"].add_metric(values, p.prefill_tokens_per_s)
            families["cache"].add_metric(values, p.free_cache_tokens)
            families["free"].add_metric(values, p.sessions_free)
            families["max"].add_metric(values, p.max_sessions)
        yield from families.values()
