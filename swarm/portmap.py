"""UPnP IGD port mapping: a peer behind a home router asks it to forward the peer's listen ports.

`PortMapper` wraps the miniupnpc client (the C library's Python module): `start_discovery()` sends
the SSDP search at once, in the background, so the search's wait (DISCOVER_MS) overlaps the DHT
node's start; `map()` waits for it (until FIRST_ANSWER_S after the start: a router answers the first
search, and without one the peer does not wait out all SEARCHES) and asks the router for each port
(same number outside, a lease of portmap_rules.LEASE_S); `run()` renews them at half the lease;
`close()` deletes them (a clean stop leaves nothing on the router; a crash leaves them until their
lease ends).

Every miniupnpc call blocks (SSDP, HTTP/SOAP to the router), so each runs on the mapper's one
thread, in order (the client object is not thread-safe), and the event loop waits at most
CALL_TIMEOUT_S for it. Mapping is not confirmation: the peer announces the router's address only
after a dial-back reached it there (swarm/reach.py).

What to map, for how long and when to skip are swarm/portmap_rules.py. Not built: NAT-PMP and PCP
(routers that speak only those are not asked), IPv6 pinholes (UPnP IGDv2 WANIPv6FirewallControl).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import miniupnpc

from swarm.portmap_rules import (
    LEASE_S,
    PortToMap,
    description,
    internal_host,
    lease_after_refusal,
    mapped_words,
    renew_after_s,
)

logger = logging.getLogger(__name__)

DISCOVER_MS = 1000
"""How long the SSDP search waits for routers to answer, ms (miniupnpc's `discoverdelay`), per
device type searched: a router answers the first (~1 s); with no router all SEARCHES go unanswered
(~4 s, overlapped with the DHT node's start)."""
SEARCHES = 4
"""Device types miniupnpc searches for, one after another, while none answers."""
FIRST_ANSWER_S = DISCOVER_MS / 1000 + 1.0
"""`map` gives up on the search this long after it started: a router answers the first device type
searched within DISCOVER_MS, and the peer's start should not wait out the other SEARCHES."""
CALL_TIMEOUT_S = 10.0
"""The event loop waits this long for one call to the router (the discovery included)."""


class PortMapper:
    """This peer's port mappings on its UPnP router (see the module docstring).

    Args:
        lease_s: the lease to ask for, seconds (0: permanent).
    """

    def __init__(self, lease_s: int = LEASE_S):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="upnp")
        self._lease_s = lease_s
        self._upnp: Any = None  # miniupnpc.UPnP once a router answered
        self._found: asyncio.Task | None = None
        self._search_started_s = 0.0  # time.monotonic()
        self._host, self._peer_id = "", ""
        self.router = ""
        """The router's external address as it reports it ("" until found)."""
        self.mapped: list[PortToMap] = []
        """The ports the router forwards for this peer now."""

    def start_discovery(self) -> None:
        """Send the SSDP search now, in the background (`map` waits for its answer)."""
        self._search_started_s = time.monotonic()
        wait_s = CALL_TIMEOUT_S + SEARCHES * DISCOVER_MS / 1000
        self._found = asyncio.ensure_future(self._call(self._discover, timeout_s=wait_s))

    async def map(self, host: str, ports: Sequence[PortToMap], peer_id: str) -> str:
        """Ask the router found to forward `ports` to `host`; never raises.

        Args:
            host: the listen address (a wildcard: the address the router is reached from).
            ports: the listen ports (portmap_rules.ports_to_map).
            peer_id: this peer's id, in each mapping's description.
        Returns:
            One log line: what was mapped and refused, or why no router was found.
        """
        if self._found is None:
            self.start_discovery()
        left_s = self._search_started_s + FIRST_ANSWER_S - time.monotonic()
        try:
            self._upnp, self.router = await asyncio.wait_for(asyncio.shield(self._found), max(left_s, 0.0))
        except TimeoutError:
            return f"no port mapping: no UPnP router answered within {FIRST_ANSWER_S:.1f} s"
        except Exception as e:  # miniupnpc raises plain Exception with UPnP's error text
            return f"no port mapping: {_why(e)}"
        self._host, self._peer_id = internal_host(host, self._upnp.lanaddr), peer_id
        failed = []
        for port in ports:
            why = await self._add(port)
            if why is None:
                self.mapped.append(port)
            else:
                failed.append((port, why))
        return mapped_words(self.mapped, failed, self.router, self._lease_s)

    async def run(self) -> None:
        """Renew the mappings at half their lease until cancelled (a permanent one: nothing to do).
        A refused renewal is logged and tried again at the next turn."""
        while self.mapped and (wait_s := renew_after_s(self._lease_s)) is not None:
            await asyncio.sleep(wait_s)
            for port in list(self.mapped):
                why = await self._add(port)
                if why is not None:
                    logger.warning("UPnP router %s did not renew port %d (%s): %s",
                                   self.router, port.port, port.role, why)

    async def close(self) -> None:
        """Delete every mapping made (a failure is logged: the lease ends it) and stop the thread."""
        if self._found is not None:
            if self._found.done() and not self._found.cancelled():
                self._found.exception()  # retrieved: a search that failed before `map` is no error here
            self._found.cancel()
        for port in self.mapped:
            try:
                await self._call(self._upnp.deleteportmapping, port.port, "TCP")
            except Exception as e:  # miniupnpc raises plain Exception with UPnP's error text
                logger.warning("UPnP router %s did not delete the mapping of port %d: %s",
                               self.router, port.port, _why(e))
        self.mapped.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _add(self, port: PortToMap) -> str | None:
        """Ask for `port` at the mapper's lease; None when granted, else why not. A router that
        grants permanent leases only changes the lease for every later call."""
        while True:
            try:
                await self._call(self._upnp.addportmapping, port.port, "TCP", self._host, port.port,
                                 description(port.role, self._peer_id), "", self._lease_s)
                return None
            except Exception as e:  # miniupnpc raises plain Exception with UPnP's error text
                lease = lease_after_refusal(str(e), self._lease_s)
                if lease is None:
                    return _why(e)
                self._lease_s = lease

    async def _call(self, fn: Callable, *args, timeout_s: float = CALL_TIMEOUT_S):
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._pool, fn, *args), timeout_s)

    @staticmethod
    def _discover() -> tuple[Any, str]:
        """(the client, the router's external address); raises LookupError when no router answers."""
        upnp = miniupnpc.UPnP()
        upnp.discoverdelay = DISCOVER_MS
        try:
            found, why = upnp.discover(), ""
        except Exception as e:  # miniupnpc raises with errno's text: "Success" when nobody answered
            found, why = 0, "" if str(e) == "Success" else f" ({e})"
        if found == 0:
            raise LookupError(f"no UPnP router answered the search{why}")
        upnp.selectigd()
        return upnp, upnp.externalipaddress()


def _why(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return f"the router did not answer within {CALL_TIMEOUT_S:.0f} s"
    return str(e) or type(e).__name__
