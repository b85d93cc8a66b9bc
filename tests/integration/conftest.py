"""Fixtures for tests with real peer processes and in-process nodes.

`smol_swarm` is the session's one read-only SmolLM2 swarm: a test that uses it only opens sessions
and reads. A test that kills, freezes, restarts or reconfigures peers, or needs other flags or
spans, starts its own (`peers`, or a module fixture: test_api, test_failover, test_push,
test_routing_faults, test_peer_robustness, test_session_independence assert on theirs).
"""

import asyncio

import pytest
from tests.helpers.peers import PeerSet, serve_args


@pytest.fixture
def peers(tmp_path):
    """A `PeerSet` for one test; every peer is stopped at teardown."""
    ps = PeerSet(tmp_path)
    yield ps
    ps.stop_all()


@pytest.fixture(scope="session")
def smol_swarm(smollm2_path, tmp_path_factory):
    """A first peer serving 0:10 plus peers for 10:20 and 20:30 of SmolLM2 (default `serve` flags)."""
    ps = PeerSet(tmp_path_factory.mktemp("smol_swarm"))
    first = ps.start("p0", *serve_args(smollm2_path, "0:10", "--new-swarm"))
    ps.start_together([(name, serve_args(smollm2_path, span, "--initial-peers", first.maddrs[0]))
                       for name, span in (("p1", "10:20"), ("p2", "20:30"))])
    yield ps
    ps.stop_all()


@pytest.fixture(scope="module")
def loop():
    """One asyncio loop for a module's in-process nodes (run with `loop.run_until_complete`)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
