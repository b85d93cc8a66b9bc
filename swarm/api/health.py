"""The swarm's health, as the API's page and JSON show it: `swarm status`, refreshed every few seconds.

`HealthMonitor` reads the model's announcements from the DHT every `period_s`, pings the peers (as
`swarm status` does, so that a peer announced but unreachable is told apart from a layer nobody
announces) and keeps the latest `swarm.client.status.StatusReport` (the same analysis `swarm status`
prints: peers and spans, each one's transport, whether a complete route exists, its estimated
tokens/s, routable throughput, dead ends, unreachable layers with the likely cause). `health_page()` is
the HTML of `/`: a static page whose script polls `/v1/swarm/status` and redraws itself.

This module does not plan routes or analyse chains itself (swarm/client/status.py does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources

from swarm.client.status import StatusReport, status_report
from swarm.dht.records import Announcement
from swarm.errors import SwarmError

logger = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0
"""One DHT read of the announcements gives up after this long."""


class HealthMonitor:
    """Keeps the latest status report of one model.

    Args:
        read: coroutine function returning the model's live announcements (a DHT read).
        model_id: the model.
        n_layers: its layer count.
        period_s: seconds between reads.
        probe: coroutine function: announcements -> (peer id -> ping ms or None, peer id ->
            transport, peer id -> clock offset), as `swarm.client.status.probe_peers`; None: nobody is pinged.
    Attributes:
        report: the latest report, or None before the first read.
        error: the last read's failure, or None when it succeeded.
        updated_at: Unix time of the last successful read (0.0: never).
    """

    def __init__(
        self,
        read: Callable[[], Awaitable[list[Announcement]]],
        model_id: str,
        n_layers: int,
        period_s: float,
        probe: Callable[[list[Announcement]], Awaitable[tuple[dict, dict]]] | None = None,
    ):
        self._read, self.model_id, self.n_layers, self.period_s = read, model_id, n_layers, period_s
        self._probe = probe
        self.report: StatusReport | None = None
        self.error: str | None = None
        self.updated_at = 0.0

    async def refresh(self) -> StatusReport:
        """Read the announcements now and analyse them.

        Raises:
            SwarmError: the DHT did not answer within READ_TIMEOUT_S (also kept in `error`).
        """
        rtt_ms, transport, clocks = None, None, None
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                announced = await self._read()
                if self._probe is not None:
                    rtt_ms, transport, clocks = await self._probe(announced)
        except TimeoutError:
            self.error = f"the DHT did not answer within {READ_TIMEOUT_S:.0f} s"
            raise SwarmError(self.error) from None
        except SwarmError as e:
            self.error = str(e)
            raise
        self.report = status_report(self.model_id, self.n_layers, announced, rtt_ms, transport, clocks)
        self.error, self.updated_at = None, time.time()
        return self.report

    async def run(self) -> None:
        """Refresh every period_s until cancelled; a failed read is kept in `error` and retried."""
        while True:
            try:
                await self.refresh()
            except SwarmError as e:
                logger.warning("status read failed: %s", e)
            await asyncio.sleep(self.period_s)


def status_json(monitor: HealthMonitor | None, served: dict) -> dict:
    """The body of GET /v1/swarm/status.

    Args:
        monitor: the swarm's monitor, or None for the local backend.
        served: what the API serves and does: {"model", "model_id", "backend", "in_flight", ...}.
    Returns:
        dict: `served`, plus "status" (StatusReport.to_dict() or None), "status_error" and
            "updated_at" (Unix seconds of the report, 0.0 if none yet).
    """
    if monitor is None:
        return {**served, "status": None, "status_error": None, "updated_at": time.time()}
    report = monitor.report
    return {
        **served,
        "status": None if report is None else report.to_dict(),
        "status_error": monitor.error,
        "updated_at": monitor.updated_at,
    }


def health_page() -> str:
    """The HTML of the health page (static; its script fetches /v1/swarm/status)."""
    return resources.files("swarm.api").joinpath("health.html").read_text(encoding="utf-8")
