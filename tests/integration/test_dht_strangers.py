"""A stranger's announcements of spans outside the model, stored in the shared SmolLM2 swarm by a third
DHT node built on hivemind directly (as issue 24 did): every reader that knows the model ignores them.

0:100000 is refused by every node's validator (past limits.MAX_LAYERS); 25:31 passes it (the
validator does not know the model) but ends past SmolLM2's 30 layers, so `swarm status`, the API's
health reader and chat drop it. The stranger's record is erased (a tombstone) at the end, so the
shared swarm is as before.
"""

from __future__ import annotations

import asyncio
import functools

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time

import swarm
from swarm import Client
from swarm.api.health import HealthMonitor
from swarm.api.server import _announcement_reader
from swarm.client.connection import SwarmConnection
from swarm.client.status import swarm_status
from swarm.dht.identity import load_or_create_identity
from swarm.dht.records import ANNOUNCE_SUBKEY_TAG, Announcement, announcements_key, encode_announcement
from swarm.manifest import build_manifest

from tests.helpers.oracle import oracle
from tests.helpers.peers import wait_for

PROMPT = "The three most important inventions of the twentieth century are"


@pytest.fixture
def stranger_span(smol_swarm, smollm2_path, tmp_path):
    """Store the stranger's 25:31 announcement (fast, free, signed by its own key) under SmolLM2's
    spans key; yield the stranger's peer id; erase the record afterwards."""
    model_id = build_manifest(smollm2_path).model_id
    ident = load_or_create_identity(tmp_path / "stranger")
    signer = RSASignatureValidator(ident.private_key)
    subkey = ANNOUNCE_SUBKEY_TAG + signer.local_public_key
    key = announcements_key(model_id)
    stranger = hivemind.DHT(initial_peers=smol_swarm.started[0].maddrs, start=True, client_mode=True,
                            record_validators=[signer])

    def offer(start: int, end: int) -> dict:
        """A fast, free-looking record (built valid, then its span replaced as a raw writer can)."""
        ann = Announcement(ident.peer_id, ("/ip4/127.0.0.1/tcp/9",), model_id, 0, 30, 1e6, 1e6, 1 << 20,
                           64, 64, swarm.__version__, 5, "stranger", get_dht_time() + 60)
        return dict(encode_announcement(ann), start=start, end=end)

    # exclude_self: the stranger's own storage takes anything; only the swarm's nodes' answers count
    store = functools.partial(stranger.store, key, subkey=subkey, exclude_self=True)
    try:
        assert store(offer(0, 100_000), get_dht_time() + 60) is False
        assert store(offer(25, 31), get_dht_time() + 60) is True
        yield ident.peer_id
    finally:
        store(None, get_dht_time() + 90)
        stranger.shutdown()


def test_spans_outside_the_model_are_ignored_by_status_health_and_chat(
    stranger_span, smol_swarm, smollm2_path
):
    manifest = build_manifest(smollm2_path)
    real = {p.peer_id for p in smol_swarm.started}
    conn = SwarmConnection(smol_swarm.started[0].maddrs)
    try:
        # the record is there for a reader that does not know the model ...
        wait_for(lambda: {a.peer_id for a in conn.announcements(manifest.model_id)},
                 "a reader that does not know the model reads the record", until=lambda ids: stranger_span in ids)
        # ... and ignored by one that does: the API's health page reads through this reader
        monitor = HealthMonitor(_announcement_reader(conn, manifest.model_id, manifest.n_layers),
                                manifest.model_id, manifest.n_layers, 1.0)
        report = asyncio.run(monitor.refresh())
    finally:
        conn.close()
    assert {p.peer_id for p in report.peers} == real
    status = swarm_status(str(smollm2_path), smol_swarm.started[0].maddrs)
    assert {p.peer_id for p in status.peers} == real and status.chains.complete
    with Client(str(smollm2_path), initial_peers=smol_swarm.started[0].maddrs) as client:
        got = client.generate(PROMPT, max_new_tokens=8)
    assert got.text == oracle(smollm2_path, PROMPT, 8)
    assert {h.peer_id for h in got.telemetry.route} <= real
