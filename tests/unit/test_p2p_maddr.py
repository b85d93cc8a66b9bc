"""swarm.p2p._parse_maddr: only a multiaddr's trailing /p2p/<id> is cut (issue 23, "What happens
today" 3: a circuit address was cut at its first /p2p/, which left the relay's own address)."""

from __future__ import annotations

import pytest

from swarm.errors import ProtocolError
from swarm.p2p import _parse_maddr

RELAY = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
PEER = "QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN"


def test_only_the_trailing_peer_id_is_cut():
    assert str(_parse_maddr(f"/ip4/1.2.3.4/tcp/5/p2p/{PEER}")) == "/ip4/1.2.3.4/tcp/5"
    assert str(_parse_maddr("/ip6/::1/tcp/5")) == "/ip6/::1/tcp/5"
    circuit = _parse_maddr(f"/ip4/1.2.3.4/tcp/5/p2p/{RELAY}/p2p-circuit/p2p/{PEER}")
    assert str(circuit) == f"/ip4/1.2.3.4/tcp/5/p2p/{RELAY}/p2p-circuit"  # not the relay's own address


def test_a_malformed_multiaddr_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        _parse_maddr("/ip4/nope/tcp/5")
