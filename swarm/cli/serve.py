"""`swarm serve`: serve a span of a model's layers to the swarm (`swarm.peer.server`)."""

from __future__ import annotations

import argparse
import os

from swarm.cli.args import add_peer_args, add_relay_args, byte_size, check_swarm_choice, layers, positive, relay_limits
from swarm.models import DEFAULT_MODEL
from swarm.peer.config import ServeConfig, check_config
from swarm.peer.quotas import CLIENT_BYTES, CLIENT_STREAMS, MAX_BUFFERED_BYTES, MAX_STREAMS, ClientLimits


def register(sub) -> None:
    """Add `serve` to the `swarm` subparsers `sub`."""
    s = sub.add_parser("serve", help="serve a span of a model's layers to the swarm")
    s.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="NAME or PATH (seeded whole), or a MODEL_ID (only the span is fetched from the swarm)",
    )
    s.add_argument(
        "--layers",
        type=layers,
        default=None,
        metavar="A:B",
        help="global layers [A, B) to serve (default: the span that most raises the swarm's routable "
        "throughput and fits --memory; re-evaluated every --rebalance-period)",
    )
    s.add_argument(
        "--memory",
        type=byte_size,
        default=None,
        metavar="SIZE",
        help="memory for the span's weights and KV cache when --layers is not given, e.g. 2GiB "
        "(default: half of the memory available now)",
    )
    s.add_argument(
        "--max-layers",
        type=positive,
        default=None,
        help="cap on the span's length when --layers is not given",
    )
    s.add_argument(
        "--rebalance-period",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="re-evaluate a chosen span this often and move (after draining) when the swarm gains "
        ">= 20%% routable throughput; 0: never (default 600)",
    )
    add_peer_args(s, bittorrent=True)
    s.add_argument("--new-swarm", action="store_true", help="start a new swarm (no --initial-peers)")
    s.add_argument(
        "--max-sessions", type=int, default=8, help="sessions open at once, each with a KV stream of its own"
    )
    s.add_argument(
        "--cache-tokens", type=int, default=16384,
        help="KV-cache tokens in all; each session holds at most cache-tokens / max-sessions of them "
        "(rounded up to a multiple of 256; 2,048 with the defaults), its longest prompt + generation",
    )
    s.add_argument("--threads", type=int, default=1, help="llama.cpp threads for prefill and batched steps (a one-token step runs on 1)")
    s.add_argument("--announce-period", type=float, default=30.0, help="seconds between DHT refreshes")
    s.add_argument("--public-name", default=None)
    s.add_argument(
        "--prefix-cache-bytes",
        type=int,
        default=256 << 20,
        help="memory for prefix KV snapshots, reused by sessions that share a prompt prefix (0: none)",
    )
    s.add_argument(
        "--prefix-disk-bytes",
        type=int,
        default=0,
        help="disk for prefix snapshots evicted from memory, under the data dir (default 0: none)",
    )
    s.add_argument("--debug-tamper-snapshots", default=None, help=argparse.SUPPRESS)
    s.add_argument("--debug-die-after-pushes", type=int, default=0, help=argparse.SUPPRESS)
    s.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on --host:PORT")
    direct = s.add_mutually_exclusive_group()
    direct.add_argument(
        "--direct-port",
        type=int,
        default=0,
        help="TCP port on --host for direct span streams from clients, set up and authenticated over "
        "libp2p (0: any free port; behind a NAT, forward it and give a fixed one)",
    )
    direct.add_argument(
        "--no-direct", action="store_true", help="offer no direct streams: clients use libp2p streams only"
    )
    add_relay_args(s)
    s.add_argument(
        "--port-mapping", choices=("auto", "off"), default="auto",
        help="auto: ask a UPnP router on the LAN to forward the libp2p, direct and relay ports (a "
        "dial-back confirms them before the router's address is announced; deleted on stop); skipped "
        "with --reachability private, --public-address or a loopback --host (default auto)",
    )
    lim = s.add_argument_group(
        "limits per client", "what one client (one peer id) may hold here; BUSY past them, with the limit named"
    )
    lim.add_argument("--client-sessions", type=positive, default=None,
                     help="sessions per client (default: half of --max-sessions, rounded up)")
    lim.add_argument("--client-kv-tokens", type=positive, default=None,
                     help="KV tokens reserved per client (default: half of the cache)")
    lim.add_argument("--client-streams", type=positive, default=CLIENT_STREAMS,
                     help=f"span and push streams open per client (default {CLIENT_STREAMS})")
    lim.add_argument("--client-bytes", type=byte_size, default=CLIENT_BYTES,
                     help="frame bytes in flight per client, at least 64MiB (default 128MiB)")
    lim.add_argument("--max-streams", type=positive, default=MAX_STREAMS,
                     help=f"span and push streams open from all clients (default {MAX_STREAMS})")
    lim.add_argument("--max-buffered-bytes", type=byte_size, default=MAX_BUFFERED_BYTES,
                     help="frame bytes in flight from all clients; a frame waits for room (default 256MiB)")
    s.add_argument("--inline-max-ms", type=float, default=None, help=argparse.SUPPRESS)  # benchmarks
    s.set_defaults(func=_serve)


def _default_memory() -> int:
    """Half of the memory available now (Linux), else 4 GiB."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def _serve(args) -> None:
    # Options are checked before the peer's own imports (libp2p, hivemind and the torch it imports:
    # 2-3 s of CPU), so a mistyped flag is refused at once.
    check_swarm_choice(args)
    cfg = _config(args)
    check_config(cfg)
    from swarm.peer.server import serve_forever

    serve_forever(cfg)


def _config(args) -> ServeConfig:
    """The parsed `serve` arguments as a `ServeConfig` (not checked yet)."""
    return ServeConfig(
        model=args.model,
        layers=args.layers,
        initial_peers=tuple(args.initial_peers),
        host=args.host,
        port=args.port,
        bt_port=args.bt_port,
        public_address=args.public_address,
        data_dir=args.data_dir,
        max_sessions=args.max_sessions,
        cache_tokens=args.cache_tokens,
        n_threads=args.threads,
        memory_bytes=args.memory if args.memory is not None else _default_memory(),
        max_layers=args.max_layers,
        announce_period_s=args.announce_period,
        public_name=args.public_name,
        rebalance_period_s=args.rebalance_period,
        prefix_cache_bytes=args.prefix_cache_bytes,
        prefix_disk_bytes=args.prefix_disk_bytes,
        debug_tamper_snapshots=args.debug_tamper_snapshots,
        debug_die_after_pushes=args.debug_die_after_pushes,
        metrics_port=args.metrics_port,
        direct_port=None if args.no_direct else args.direct_port,
        reachability=args.reachability,
        relay=args.relay,
        port_mapping=args.port_mapping,
        relay_service=not args.no_relay_service,
        relay_port=args.relay_port,
        relay_limits=relay_limits(args),
        limits=ClientLimits(args.client_sessions, args.client_kv_tokens, args.client_streams,
                            args.client_bytes, args.max_streams, args.max_buffered_bytes),
        **({} if args.inline_max_ms is None else {"inline_max_ms": args.inline_max_ms}),
    )
