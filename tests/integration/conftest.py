"""Fixtures for tests with real peer processes."""

import pytest
from peerproc import PeerSet


@pytest.fixture
def peers(tmp_path):
    """A `PeerSet` for one test; every peer is stopped at teardown."""
    ps = PeerSet(tmp_path)
    yield ps
    ps.stop_all()
