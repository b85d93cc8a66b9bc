"""Tests in the network lab (sim/netlab.py): every one skips, saying why, where a lab cannot run
(not root, no CAP_NET_ADMIN, a tool missing); CI runs as root and installs the tools (.ci/run)."""

import pytest

from sim.netlab import lab_available


@pytest.fixture(scope="session", autouse=True)
def _lab_or_skip():
    """Session-wide and autouse, so it runs before any module fixture tries to build a lab."""
    reason = lab_available()
    if reason:
        pytest.skip(reason)
