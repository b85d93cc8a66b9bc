"""The network lab itself (sim/netlab.py): NAT blocks inbound, masquerade keeps or randomises source
ports, port forwards reach the home site, the delay line holds every frame at least as long as set,
rate limits hold, and teardown leaves nothing behind, also when the body raises.

Observed with TCP probes run inside the sites (sim/netprobe.py); no model, no peers.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

import pytest

from sim.netlab import Lab, LabError, lab_namespaces
from sim.netprobe import listen, ping
from tests.helpers.lab import needs_lab

pytestmark = needs_lab

PORT = 7000
NOT_ANSWERED_S = 1.0
"""A dial that a NAT drops gets no answer at all: it ends by this timeout. On a lab link without
delay a dial that works completes in milliseconds, so this only bounds the test's wait."""
SOURCE_PORTS = (40001, 40002, 40003)


@pytest.fixture(scope="module")
def lab():
    """One lab for the module's read-only checks: two public sites and two homes (NAT keeping ports,
    NAT randomising them), with a probe server on each."""
    with Lab() as lab:
        for name in ("pub1", "pub2"):
            listen(lab, lab.public(name), PORT)
        for name, nat in (("home1", "keep"), ("home2", "random")):
            listen(lab, lab.home(name, nat=nat), PORT)
        yield lab


def test_a_nat_blocks_inbound_dials_and_lets_the_inside_in(lab):
    home, pub = lab.sites["home1"], lab.sites["pub1"]
    at_router = ping(lab, pub, home.public_address, PORT, count=1, timeout_s=NOT_ANSWERED_S)
    at_private = ping(lab, pub, home.address, PORT, count=1, timeout_s=NOT_ANSWERED_S)
    from_lan = ping(lab, home.router, home.address, PORT, count=1)
    assert "timed out" in at_router.error  # dropped silently, as a home router does: no RST
    assert "timed out" in at_private.error  # the internet does not route private addresses
    assert from_lan.error == "" and len(from_lan.rtt_ms) == 1
    assert from_lan.observed.split(":")[0] == home.router.lan_address


def test_masquerade_keeps_the_source_port_and_shows_the_router_address(lab):
    home, pub = lab.sites["home1"], lab.sites["pub1"]
    for port in SOURCE_PORTS:
        got = ping(lab, home, pub.address, PORT, count=1, bind_port=port)
        assert got.error == ""
        assert got.local == f"{home.address}:{port}"
        assert got.observed == f"{home.public_address}:{port}"


def test_port_randomising_nat_changes_the_source_port(lab):
    home, pub = lab.sites["home2"], lab.sites["pub1"]
    observed = [ping(lab, home, pub.address, PORT, count=1, bind_port=p).observed for p in SOURCE_PORTS]
    assert {o.split(":")[0] for o in observed} == {home.public_address}
    # a random port equals the one asked for with odds ~1/28,000 each: three all kept means no randomising
    assert [int(o.split(":")[1]) for o in observed] != list(SOURCE_PORTS)


def test_a_port_forward_reaches_the_home_site_and_shows_the_dialler(lab):
    home, pub = lab.sites["home2"], lab.sites["pub2"]
    lab.forward(home, PORT)
    got = ping(lab, pub, home.public_address, PORT, count=2)
    assert got.error == "" and len(got.rtt_ms) == 2
    assert got.observed.split(":")[0] == pub.address  # dnat only: the home sees who dialled
    from_other_home = ping(lab, lab.sites["home1"], home.public_address, PORT, count=1)
    assert from_other_home.observed.split(":")[0] == lab.sites["home1"].public_address


@pytest.mark.parametrize("rtt_ms", [20.0, 50.0])
def test_the_delay_line_holds_frames_at_least_as_long_as_set(lab, rtt_ms):
    pub1, pub2, home = lab.sites["pub1"], lab.sites["pub2"], lab.sites["home1"]
    lab.set_rtt(0)
    plain = ping(lab, pub1, pub2.address, PORT, count=10)
    lab.set_rtt(rtt_ms)
    try:
        between_publics = ping(lab, pub1, pub2.address, PORT, count=10)
        from_home = ping(lab, home, pub2.address, PORT, count=10)
    finally:
        lab.set_rtt(0)
    for got in (plain, between_publics, from_home):
        assert got.error == "" and len(got.rtt_ms) == 10
    # every round trip crosses two held links twice: never less than the RTT set, and the TCP
    # handshake too; without the delay line every round trip is shorter than that
    assert min(between_publics.rtt_ms) >= rtt_ms
    assert min(from_home.rtt_ms) >= rtt_ms
    assert between_publics.connect_ms >= rtt_ms
    assert median(plain.rtt_ms) < rtt_ms


def test_one_link_delay_adds_to_its_paths_only(lab):
    pub1, pub2, home = lab.sites["pub1"], lab.sites["pub2"], lab.sites["home1"]
    lab.set_delay({pub2: 10.0})  # 10 ms each way on pub2's link only
    try:
        to_pub2 = ping(lab, pub1, pub2.address, PORT, count=5)
        to_home = ping(lab, pub1, home.public_address, PORT, count=5, timeout_s=NOT_ANSWERED_S)
        home_to_pub1 = ping(lab, home, pub1.address, PORT, count=5)
    finally:
        lab.set_rtt(0)
    assert min(to_pub2.rtt_ms) >= 20.0
    assert "timed out" in to_home.error  # the NAT still holds with the delay line in the path
    assert median(home_to_pub1.rtt_ms) < 10.0


def test_a_rate_limit_holds_bulk_transfers_to_its_rate():
    rate_mbit, bulk = 8.0, 2_000_000
    with Lab() as lab:
        slow, fast = lab.public("slow", rate_mbit=rate_mbit), lab.public("fast")
        listen(lab, fast, PORT)
        got = ping(lab, slow, fast.address, PORT, count=1, bulk_bytes=bulk)
    assert got.error == "" and got.bulk_bytes == bulk
    burst_bytes = rate_mbit * 1e6 / 8 / 100  # tbf may send this much at once (sim/netlab.py)
    assert got.bulk_s >= (bulk - burst_bytes) * 8 / (rate_mbit * 1e6)


def test_teardown_removes_everything_also_when_the_body_raises():
    with pytest.raises(RuntimeError, match="the test body failed"):
        with Lab() as lab:
            home = lab.home("h1")
            lab.public("p1")
            lab.set_rtt(20)
            sleeper = lab.spawn(home, ["sleep", "600"])
            listen(lab, home, PORT)
            made, running = set(lab_namespaces()), lab.pids()
            raise RuntimeError("the test body failed")
    assert {f"{lab.prefix}{n}" for n in ("wan", "h1", "h1-gw", "p1")} <= made
    assert len(running) == 3  # the sleeper, the probe server and the delay line
    assert not {ns for ns in lab_namespaces() if ns.startswith(lab.prefix)}
    assert sleeper.poll() is not None
    assert not [pid for pid in running if Path(f"/proc/{pid}").exists()]


def test_bad_requests_are_refused_with_a_reason():
    with Lab() as lab:
        pub = lab.public("p1")
        with pytest.raises(LabError, match="exists already"):
            lab.public("p1")
        with pytest.raises(LabError, match="nat must be one of"):
            lab.home("h1", nat="full-cone")
        with pytest.raises(LabError, match="no router"):
            lab.forward(pub, 80)
        with pytest.raises(LabError, match="site name"):
            lab.public("Bad_Name")
