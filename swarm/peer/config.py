"""Options of `swarm serve`, and the check that refuses a config that cannot serve before anything
starts (addresses, ports, counts, periods, the public name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from swarm.dht.records import MAX_PUBLIC_NAME_CHARS
from swarm.errors import AddressError, SwarmError
from swarm.limits import EXPIRY_PERIODS, MAX_CONTEXT_TOKENS, MAX_LAYERS, MAX_RECORD_TTL_S
from swarm.netaddr import NetConfig, check_net_config
from swarm.peer.quotas import ClientLimits, limits_refusal
from swarm.peer.step_plan import INLINE_MAX_MS
from swarm.portmap_rules import MODES as PORT_MAPPING_MODES
from swarm.relay.rules import RELAY_MODES, RelayLimits
from swarm.reach_rules import MODES


@dataclass(frozen=True)
class ServeConfig:
    """Options of `swarm serve`.

    Attributes:
        model: known model name, `.gguf` path (seeded whole), or a model_id (only the span's
            tensors are fetched from the swarm).
        layers: (start, end) global half-open span, or None to pick the least-covered span.
        initial_peers: multiaddrs to join through; empty with new_swarm starts a swarm.
        host, port: listen address (IPv4 or IPv6 literal; a wildcard listens on every interface and
            advertises each interface address) and libp2p port (0: any free port).
        bt_port: BitTorrent port on the same host (0: any free port, the same on every interface).
        public_address: the only address advertised (libp2p and BitTorrent), e.g. a NAT's public
            IP that forwards `port` and `bt_port` here; needs a fixed `port`.
        data_dir: peer identity directory (None: $SWARM_HOME or the XDG data dir).
        max_sessions: concurrent sessions (llama.cpp sequences).
        cache_tokens: KV-cache tokens in all; each session's own KV stream holds cache_tokens /
            max_sessions of them (llama.cpp rounds up to a multiple of 256), its longest length.
        n_threads: llama.cpp threads for multi-row steps (prefill, batches); a one-row decode step
            runs on 1 thread (the numeric contract, swarm/numeric.py).
        memory_bytes: bytes for the span's weights and KV cache, which size the span when `layers`
            is None (`swarm.kv.budget.SpanBudget`).
        max_layers: an extra cap on the span's length when `layers` is None (None: memory decides).
        announce_period_s: seconds between announcement refreshes; records expire after 2.5 periods
            (so at most limits.MAX_RECORD_TTL_S / 2.5 = 240 s).
        public_name: optional display name in the announcement.
        rebalance_period_s: seconds between re-evaluations of a chosen span (0: never move).
        prefix_cache_bytes: memory budget for prefix KV snapshots (0: keep none, restore none).
        prefix_disk_bytes: disk budget for snapshots evicted from memory (0: no disk tier); files
            live in <data dir>/snapshots/.
        debug_tamper_snapshots: test hook: damage served snapshots this way (swarm.peer.snapshots.TAMPERS).
        debug_die_after_pushes: test hook: after this many pushes (0: never) the whole peer dies at
            once, as under kill -9, between pushing a step and answering its client.
        metrics_port: serve Prometheus metrics on host:metrics_port (`swarm.peer.metrics`); None: don't.
        direct_port: TCP port on `host` for direct span streams from clients (`swarm.direct`; 0: any
            free port); None: offer none (clients then use libp2p streams).
        reachability: "auto" (ask other peers to dial this one back, swarm/reach.py), or "public"
            (others can dial this peer) / "private" (behind a NAT without port forwards) to announce
            that without asking; a private peer registers with a relay and announces only relay
            addresses (unless `relay` is "off").
        relay: "auto" (a private peer is relayed) or "off" (never relayed).
        port_mapping: "auto" (ask a UPnP router on the LAN to forward the libp2p, direct and relay
            ports, swarm/portmap.py; skipped for a private, loopback-only or `public_address` peer)
            or "off".
        relay_service: a public peer relays streams for private ones (`swarm.relay.service`).
        relay_port: TCP port on `host` of the relay service (0: any free port).
        relay_limits: the relay service's budget, announced in its offer.
        inline_max_ms: units of executor work measured under this many ms run on the event loop
            thread (`swarm.peer.step_plan.INLINE_MAX_MS`); benchmarks vary it.
        limits: what one remote client may hold (sessions, KV tokens, streams, frame bytes in
            flight) and the caps over all clients (`swarm.peer.quotas.ClientLimits`); announced.
    """

    model: str
    layers: tuple[int, int] | None = None
    initial_peers: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 0
    data_dir: str | None = None
    max_sessions: int = 8
    cache_tokens: int = 16384
    n_threads: int = 1
    memory_bytes: int = 4 << 30
    max_layers: int | None = None
    announce_period_s: float = 30.0
    public_name: str | None = None
    rebalance_period_s: float = 600.0
    prefix_cache_bytes: int = 256 << 20
    prefix_disk_bytes: int = 0
    debug_tamper_snapshots: str | None = None
    debug_die_after_pushes: int = 0
    bt_port: int = 0
    public_address: str | None = None
    metrics_port: int | None = None
    direct_port: int | None = 0
    inline_max_ms: float = INLINE_MAX_MS
    reachability: str = "auto"
    relay: str = "auto"
    port_mapping: str = "auto"
    relay_service: bool = True
    relay_port: int = 0
    relay_limits: RelayLimits = RelayLimits()
    limits: ClientLimits = ClientLimits()


def check_config(cfg: ServeConfig) -> NetConfig:
    """Refuse a config that cannot serve, before anything starts; return its checked addresses.

    Raises:
        AddressError: host, ports or public address unusable (`swarm.netaddr.check_net_config`).
        SwarmError: a count, limit or period out of range, or a public name that is empty, too long, not
            printable or not UTF-8.
    """
    net = check_net_config(NetConfig(cfg.host, cfg.port, cfg.bt_port, cfg.public_address))
    for name, value, lo, hi in (
        ("max_sessions", cfg.max_sessions, 1, 256),
        ("cache_tokens", cfg.cache_tokens, 1, MAX_CONTEXT_TOKENS),
        ("threads", cfg.n_threads, 1, 1024),
        ("memory_bytes", cfg.memory_bytes, 0, 1 << 60),
        ("max_layers", 1 if cfg.max_layers is None else cfg.max_layers, 1, MAX_LAYERS),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise SwarmError(f"{name} must be an integer in [{lo}, {hi}], got {value!r:.40}")
    why = limits_refusal(cfg.limits)
    if why is not None:
        raise SwarmError(why)
    port = cfg.direct_port
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535):
        raise AddressError(f"--direct-port must be an integer in 0..65535, got {port!r:.40}")
    if cfg.reachability not in MODES or cfg.relay not in RELAY_MODES:
        raise SwarmError(f"--reachability must be one of {', '.join(MODES)} and --relay one of "
                         f"{', '.join(RELAY_MODES)}, got {cfg.reachability!r:.40} and {cfg.relay!r:.40}")
    if cfg.port_mapping not in PORT_MAPPING_MODES:
        raise SwarmError(f"--port-mapping must be one of {', '.join(PORT_MAPPING_MODES)}, "
                         f"got {cfg.port_mapping!r:.40}")
    port = cfg.relay_port
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise AddressError(f"--relay-port must be an integer in 0..65535, got {port!r:.40}")
    port = cfg.metrics_port
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port <= 65535):
        raise AddressError(f"--metrics-port must be in 1..65535, got {port!r:.40}")
    for name, value, zero_ok in (
        ("announce_period_s", cfg.announce_period_s, False),
        ("rebalance_period_s", cfg.rebalance_period_s, True),
    ):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not 0 <= value < math.inf or (value == 0 and not zero_ok):
            bound = ">= 0" if zero_ok else "> 0"
            raise SwarmError(f"{name} must be a finite number of seconds {bound}, got {value!r:.40}")
    if cfg.announce_period_s * EXPIRY_PERIODS > MAX_RECORD_TTL_S:  # DHT nodes refuse longer-lived records
        raise SwarmError(
            f"announce_period_s must be at most {MAX_RECORD_TTL_S / EXPIRY_PERIODS:.0f} s (a record lives "
            f"{EXPIRY_PERIODS} periods, at most {MAX_RECORD_TTL_S:.0f} s), got {cfg.announce_period_s}"
        )
    if cfg.public_name is not None and not _printable_utf8(cfg.public_name, MAX_PUBLIC_NAME_CHARS):
        raise SwarmError(
            f"public name must be printable UTF-8 text of 1..{MAX_PUBLIC_NAME_CHARS} characters, "
            f"got {cfg.public_name!r:.80}"
        )
    return net


def _printable_utf8(text: object, max_chars: int) -> bool:
    if not isinstance(text, str) or not 1 <= len(text) <= max_chars or not text.isprintable():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
