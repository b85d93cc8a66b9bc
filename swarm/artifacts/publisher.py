"""`swarm publish`: a foreground seeder and DHT peer for one model file."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from swarm.artifacts.distribute import publish
from swarm.artifacts.session import ArtifactSession, SessionConfig
from swarm.dht.node import SwarmDHT
from swarm.manifest import build_manifest
from swarm.models import resolve_model
from swarm.netaddr import NetConfig, bt_hosts, check_net_config


async def publish_until_stopped(
    model: str,
    initial_peers: list[str],
    net: NetConfig,
    data_dir: str | None,
    stop: asyncio.Event | None = None,
) -> None:
    """Seed `model` (name or path) and keep its records fresh until `stop` (or SIGINT/SIGTERM).

    Prints the multiaddrs others join with on stdout, then "publishing <model_id>" on stderr.
    Args:
        net: listen host, libp2p and BitTorrent ports, public address (`swarm.netaddr.NetConfig`).
    Raises:
        AddressError: an unusable address (before anything starts).
        ModelError, ArtifactError, DHTError: set-up failures.
    """
    net = check_net_config(net)
    path = resolve_model(model, progress=True)
    manifest = build_manifest(path)
    artifacts = ArtifactSession(SessionConfig(listen_host=net.host, listen_port=net.bt_port))
    try:
        dht = await SwarmDHT.start(
            initial_peers, host=net.host, port=net.port, data_dir=data_dir, public_address=net.public_address
        )
    except BaseException:
        artifacts.close()
        raise
    try:
        artifacts.advertise(bt_hosts(net, dht.visible_maddrs()))
        for maddr in dht.visible_maddrs():
            print(maddr, flush=True)
        publication = await publish(dht, artifacts, path, manifest)
        print(
            f"publishing {manifest.model_id} (infohash {publication.infohash})", file=sys.stderr, flush=True
        )
        if stop is None:
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        refresher = asyncio.create_task(publication.refresh_forever(dht))
        await stop.wait()
        refresher.cancel()
    finally:
        await asyncio.to_thread(artifacts.close)
        await dht.shutdown()


def run_publisher(model: str, initial_peers: list[str], net: NetConfig, data_dir: str | None) -> None:
    """Blocking entry point for the CLI."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    asyncio.run(publish_until_stopped(model, initial_peers, net, data_dir))
