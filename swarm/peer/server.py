"""`swarm serve`: the composition root of a peer.

Builds the parts in order and wires them together; the parts receive their collaborators:
config check → BitTorrent, direct-stream and relay ports (and a UPnP router searched for, in the
background: swarm/portmap.py) → DHT node → the ports mapped on that router → reachability (a dial-back
probe, swarm/reach.py; `reach.current` is what later parts read: a private peer takes a relay, a
public one offers one) → the span (swarm/peer/build.py: model file, layers, executor, measured
`Span`) → stream handlers → metrics → relay registration (a private peer) → announcer → relay offer
(a public one) → rebalancer. On SIGINT/SIGTERM it withdraws the announcement, tells every open
session's client, and stops.

A peer started without `--layers` chooses its span with `swarm.route.placement.choose_span`, sized
by the memory it gives, and re-evaluates it every `rebalance_period_s` (`swarm.peer.rebalance`);
a peer given `--layers` keeps them, and warns at start when they cannot chain with the swarm's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from functools import partial

from swarm import eventloop
from swarm.arch import arch_row
from swarm.artifacts.session import ArtifactSession, SessionConfig
from swarm.dialing import open_stream
from swarm.direct import DirectServer, direct_maddrs
from swarm.dht.identity import load_or_create_identity
from swarm.dht.node import SwarmDHT
from swarm.errors import SwarmError
from swarm.limits import PING_PROTOCOL, PUSH_PROTOCOL, SNAPSHOT_PROTOCOL, SPAN_PROTOCOL
from swarm.manifest import build_manifest
from swarm.models import is_model_id, resolve_model
from swarm.netaddr import bt_hosts, listen_port
from swarm.peer.announce import Announcer
from swarm.peer.build import Mover, check_span, open_span
from swarm.peer.config import ServeConfig, check_config
from swarm.peer.handler import PeerStreams, handle_push, handle_stream
from swarm.peer.metrics import PeerMetrics
from swarm.peer.quotas import ClientLedger
from swarm.peer.rules import SHUTTING_DOWN_MESSAGE
from swarm.peer.span import Span
from swarm.p2p import answer_pings
from swarm.portmap import PortMapper
from swarm.portmap_rules import ports_to_map, skip_reason
from swarm.peer import testlie
from swarm.proctree import descendants
from swarm.relay import dial as relay_dial
from swarm.relay.handshake import RelayIdentity
from swarm.relay.registrar import RelayRegistrar
from swarm.relay.rules import relay_roles
from swarm.relay.service import RelayServer, publish_forever
from swarm.reach import DialBackResponder, ReachabilityMonitor
from swarm.reach_rules import PRIVATE, announced_direct_addrs
from swarm.wire import Error, ErrorCode, encode_frame

logger = logging.getLogger(__name__)

PUSH_DIAL_TIMEOUT_S = 10.0
"""Opening a push stream to the next hop gives up after this long (its pushes then go by the client)."""
SHUTDOWN_STEP_S = 10.0
"""Each shutdown step (withdraw, DHT stop) gives up after this long, so a peer always exits."""
RELAY_WAIT_S = 30.0
"""A private peer waits this long for its first relay registration before announcing without one."""


async def serve(
    cfg: ServeConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run a peer until `stop` is set (or SIGINT/SIGTERM when `stop` is None).

    Raises:
        AddressError: host, ports or public address unusable (before anything starts).
        SwarmError: the config, model, span, BitTorrent port or DHT could not be set up (before
            serving starts; whatever started is stopped again).
    """
    net = check_config(cfg)
    local_path = None if is_model_id(cfg.model) else resolve_model(cfg.model, progress=True)
    if local_path is not None:
        manifest = build_manifest(local_path)  # before anything is announced or printed
        arch_row(manifest.arch)  # refuses architectures without a row, naming the supported ones
        if cfg.layers is not None:
            check_span(manifest, *cfg.layers)
    # BitTorrent and the direct-stream port first: a port in use fails before the DHT node (its own
    # process) starts.
    artifacts = ArtifactSession(SessionConfig(listen_host=net.host, listen_port=net.bt_port))
    direct = None if cfg.direct_port is None else DirectServer()
    # the relay listener opens with the other ports; a peer the probe finds private closes it again
    relay = None
    if cfg.relay_service and cfg.reachability != "private":
        relay = RelayServer(load_or_create_identity(cfg.data_dir).peer_id, cfg.relay_limits)
    why_not_mapped = skip_reason(cfg.port_mapping, cfg.reachability, net.host, net.public_address)
    mapper = None if why_not_mapped else PortMapper()
    if mapper is not None:
        mapper.start_discovery()  # the search's wait overlaps the DHT node's start
    else:
        logger.info("no port mapping: %s", why_not_mapped)
    try:
        direct_port = None if direct is None else await direct.listen(net.host, cfg.direct_port)
        relay_port = None if relay is None else await relay.listen(net.host, cfg.relay_port)
        dht = await SwarmDHT.start(
            cfg.initial_peers,
            host=net.host,
            port=net.port,
            data_dir=cfg.data_dir,
            public_address=net.public_address,
            # a peer nobody can dial must not sit in others' DHT routing tables: every lookup that
            # tried it would wait out a timeout
            client_mode=cfg.reachability == PRIVATE,
        )
    except BaseException:
        for server in (direct, relay, mapper):
            if server is not None:
                await server.close()
        artifacts.close()
        raise
    try:
        artifacts.advertise(bt_hosts(net, dht.visible_maddrs()))
        for maddr in dht.visible_maddrs():
            print(maddr, flush=True)
        # Reachability first (the direct listener already answers dial-back nonces): what a peer
        # does next (take a relay, offer one) depends on it.
        await DialBackResponder().serve(dht.transport)
        if mapper is not None:  # mapped before the probe: its dial-back confirms the mapping
            logger.info("%s", await mapper.map(net.host, ports_to_map(
                listen_port(dht.visible_maddrs()), direct_port, relay_port), dht.peer_id))
        model_id = cfg.model if local_path is None else manifest.model_id
        reach = ReachabilityMonitor(
            cfg.reachability, dht.transport, partial(_dialback_helpers, dht, cfg.initial_peers, model_id),
            None if direct is None else direct.expect_nonce,
            (lambda nonce: None) if direct is None else direct.forget_nonce,
            direct_port, listen_port(dht.visible_maddrs()), retry_s=cfg.announce_period_s,
        )
        await reach.probe()
        roles = relay_roles("private" if reach.current.private else "public", cfg.relay, cfg.relay_service)
        if relay is not None and not roles.serve:  # found private: nobody could dial its relay service
            await relay.close()
            relay = relay_port = None
        liar = testlie.from_env()
        span, path, manifest, publication = await open_span(cfg, dht, artifacts, local_path,
                                                            lazy=liar.lazy if liar else "")
        if liar is not None:
            span.throughput = liar.boast(span.throughput)
        identity = RelayIdentity(dht.identity.private_key)
        streams = PeerStreams(span, dial=partial(_dial_push, dht.transport, identity), liar=liar,
                              ledger=ClientLedger(cfg.limits))
        if cfg.debug_die_after_pushes:
            streams.after_push = partial(_die_after, [cfg.debug_die_after_pushes])
        span_handler = partial(handle_stream, streams)
        push_handler = partial(handle_push, streams)
        if cfg.metrics_port is not None:
            metrics = PeerMetrics(span, streams.ledger)
            metrics.serve(net.host, cfg.metrics_port)
            span_handler = metrics.wrap(span_handler)
            push_handler = metrics.wrap_push(push_handler)
        await dht.transport.serve(SPAN_PROTOCOL, span_handler)
        await dht.transport.serve(PUSH_PROTOCOL, push_handler)
        direct_addrs: tuple[str, ...] = ()
        if direct is not None:
            await direct.open(dht.transport, {SPAN_PROTOCOL: span_handler, PUSH_PROTOCOL: push_handler})
            direct_addrs = direct_maddrs(bt_hosts(net, dht.visible_maddrs()), direct_port)
        if span.prefixes is not None:
            await dht.transport.serve(
                SNAPSHOT_PROTOCOL, partial(_serve_snapshot, span, cfg.debug_tamper_snapshots)
            )
        announcer = Announcer(dht, span, cfg.announce_period_s, cfg.public_name, direct_addrs, roles.use,
                              tuple(cfg.initial_peers), cfg.limits, reach=reach, direct_port=direct_port)
        tasks = []
        if roles.use:
            registrar = RelayRegistrar(dht, identity, dht.transport, {
                SPAN_PROTOCOL: span_handler, PUSH_PROTOCOL: push_handler, PING_PROTOCOL: answer_pings,
            }, announcer.set_relay)
            tasks.append(asyncio.create_task(registrar.run()))
            try:
                await asyncio.wait_for(registrar.registered.wait(), RELAY_WAIT_S)
            except asyncio.TimeoutError:
                logger.warning("no relay registration within %.0f s: clients cannot reach this peer yet",
                               RELAY_WAIT_S)
        if relay is not None:  # behind a forward or a UPnP mapping, at the address a dial-back confirmed
            local = direct_maddrs(bt_hosts(net, dht.visible_maddrs()), relay_port)
            endpoints = announced_direct_addrs(local, reach.current, relay_port)
            tasks.append(asyncio.create_task(publish_forever(dht, relay, endpoints, cfg.announce_period_s)))
        await announcer.announce_once()
        print(
            f"serving layers {span.start}:{span.end} of {manifest.model_id} as {dht.peer_id}"
            + (f", direct streams on port {direct_port}" if direct is not None else "")
            + (f", relaying for others on port {relay_port}" if relay is not None else "")
            + (f", reached through relay {announcer.relay_addrs[0]}" if announcer.relay_addrs else "")
            + f"; reachability {reach.current.status} ({reach.current.reason})"
            + f"; event loop {type(asyncio.get_running_loop()).__module__.split('.')[0]}",
            file=sys.stderr,
            flush=True,
        )
        if ready is not None:
            ready.set()
        tasks.append(asyncio.create_task(publication.refresh_forever(dht)))
        tasks.append(asyncio.create_task(reach.run()))
        if mapper is not None:
            tasks.append(asyncio.create_task(mapper.run()))
        if span.prefixes is not None:
            tasks.append(asyncio.create_task(span.prefixes.publish_forever(cfg.announce_period_s)))
        if cfg.layers is None and cfg.rebalance_period_s > 0:
            mover = Mover(cfg, dht, artifacts, path, manifest, span, announcer)
            tasks.append(asyncio.create_task(mover.rebalancer().run()))
        try:
            await _run_until_stopped(announcer, stop)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await _shutdown(span, streams, announcer)
    finally:
        for server in (direct, relay):
            if server is not None:
                await server.close()
        if mapper is not None:
            try:
                await asyncio.wait_for(mapper.close(), SHUTDOWN_STEP_S)
            except asyncio.TimeoutError:
                logger.warning("UPnP mappings not deleted within %.0f s (their lease ends them)",
                               SHUTDOWN_STEP_S)
        await asyncio.to_thread(artifacts.close)
        try:
            await asyncio.wait_for(dht.shutdown(), SHUTDOWN_STEP_S)
        except asyncio.TimeoutError:
            logger.warning("the DHT node did not stop within %.0f s", SHUTDOWN_STEP_S)


def _die_after(left: list[int]) -> None:
    """Test hook: count a push down; at zero kill this peer's whole process tree (its DHT process
    and p2pd daemons too), as a machine that dies does."""
    left[0] -= 1
    if left[0] == 0:
        for pid in [*descendants(os.getpid()), os.getpid()]:
            os.kill(pid, signal.SIGKILL)


async def _dial_push(transport, identity: RelayIdentity, peer_id: str, addrs: tuple[str, ...],
                     endpoints: tuple[str, ...], relays: tuple[str, ...]):
    """A push stream to the next hop (swarm.peer.handler.Chain): through its relay when it has one,
    else direct when it can, else libp2p."""
    if relays:
        return await relay_dial.dial(identity, relays, peer_id, PUSH_PROTOCOL, PUSH_DIAL_TIMEOUT_S)
    opened = await open_stream(transport, peer_id, addrs, endpoints, PUSH_PROTOCOL, PUSH_DIAL_TIMEOUT_S)
    return opened.stream


async def _dialback_helpers(dht: SwarmDHT, initial_peers, model_id: str) -> list[tuple[str, tuple[str, ...]]]:
    """Peers to ask for a dial-back: the initial peers, then the model's other announced peers, except
    those that announce themselves private: nobody can dial them, so asking one costs a full timeout."""
    helpers: dict[str, tuple[str, ...]] = {}
    for maddr in initial_peers:
        if "/p2p/" in maddr:
            helpers.setdefault(maddr.rsplit("/p2p/", 1)[1], ())
            helpers[maddr.rsplit("/p2p/", 1)[1]] += (maddr,)
    for ann in await dht.get_announcements(model_id):
        if ann.reachability != PRIVATE:
            helpers.setdefault(ann.peer_id, ann.addrs)
    helpers.pop(dht.peer_id, None)
    return list(helpers.items())


async def _serve_snapshot(span: Span, tamper: str | None, stream) -> None:
    if span.prefixes is None:
        await stream.close()
        return
    await span.prefixes.serve_fetch(stream, tamper)


async def _run_until_stopped(announcer: Announcer, stop: asyncio.Event | None) -> None:
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    refresher = asyncio.create_task(announcer.run())
    try:
        await stop.wait()
    finally:
        refresher.cancel()
        await asyncio.gather(refresher, return_exceptions=True)


async def _shutdown(span: Span, streams: PeerStreams, announcer: Announcer) -> None:
    span.shutting_down = True
    try:
        await asyncio.wait_for(announcer.withdraw(), SHUTDOWN_STEP_S)
    except (SwarmError, asyncio.TimeoutError) as e:
        why = str(e) or f"no answer within {SHUTDOWN_STEP_S:.0f} s"
        logger.warning("could not withdraw the announcement (it expires by itself): %s", why)
    goodbye = encode_frame(Error(ErrorCode.SHUTTING_DOWN, SHUTTING_DOWN_MESSAGE))
    for stream in list(streams.open):
        try:
            await stream.send(goodbye)
        except SwarmError:
            pass
        await stream.close()
    span.close()


def serve_forever(cfg: ServeConfig) -> None:
    """Blocking entry point for the CLI."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    eventloop.run(serve(cfg), role="peer")
