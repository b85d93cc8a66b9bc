"""Fixtures for tests with real peer processes and in-process nodes."""

import asyncio

import pytest
from tests.helpers.peers import PeerSet


@pytest.fixture
def peers(tmp_path):
    """A `PeerSet` for one test; every peer is stopped at teardown."""
    ps = PeerSet(tmp_path)
    yield ps
    ps.stop_all()


@pytest.fixture(scope="module")
def loop():
    """One asyncio loop for a module's in-process nodes (run with `loop.run_until_complete`)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
