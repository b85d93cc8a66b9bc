"""swarm.portmap_rules: when a peer maps its ports on a UPnP router, which ports, leases and renewal;
and the lab's STUN responder's answer (sim/stunlab.py), which miniupnpd in the lab depends on."""

from __future__ import annotations

import socket
import struct

import pytest

from sim.stunlab import MAGIC_COOKIE, binding_response
from swarm.portmap_rules import (
    DESCRIPTION_CHARS,
    LEASE_S,
    PortToMap,
    description,
    internal_host,
    lease_after_refusal,
    mapped_words,
    ports_to_map,
    renew_after_s,
    skip_reason,
)


def test_a_peer_on_a_lan_address_tries_port_mapping():
    assert skip_reason("auto", "auto", "192.168.1.20", None) is None
    assert skip_reason("auto", "public", "0.0.0.0", None) is None


@pytest.mark.parametrize("mode, reachability, host, public, why", [
    ("off", "auto", "192.168.1.20", None, "--port-mapping off"),
    ("auto", "private", "192.168.1.20", None, "--reachability private"),
    ("auto", "auto", "192.168.1.20", "203.0.113.7", "--public-address"),
    ("auto", "auto", "127.0.0.1", None, "loopback only"),
    ("auto", "auto", "::1", None, "loopback only"),
    ("auto", "auto", "fd00::5", None, "UPnP IGD maps IPv4"),
])
def test_port_mapping_is_skipped_where_it_cannot_help_or_is_not_wanted(mode, reachability, host, public, why):
    assert why in skip_reason(mode, reachability, host, public)


def test_an_unknown_port_mapping_mode_is_refused():
    with pytest.raises(ValueError, match="--port-mapping must be one of auto, off"):
        skip_reason("upnp", "auto", "192.168.1.20", None)


def test_the_libp2p_direct_and_relay_ports_are_mapped_in_that_order():
    assert ports_to_map(41001, 41003, 41004) == (
        PortToMap("libp2p", 41001), PortToMap("direct", 41003), PortToMap("relay", 41004))


def test_listeners_that_do_not_run_and_privileged_ports_are_not_mapped():
    assert ports_to_map(41001, None, 0) == (PortToMap("libp2p", 41001),)
    assert ports_to_map(80, 41003, None) == (PortToMap("direct", 41003),)


def test_a_wildcard_listener_is_mapped_at_the_address_the_router_is_reached_from():
    assert internal_host("0.0.0.0", "192.168.1.20") == "192.168.1.20"
    assert internal_host("192.168.1.30", "192.168.1.20") == "192.168.1.30"


def test_a_lease_is_renewed_at_half_and_a_permanent_one_never():
    assert renew_after_s(LEASE_S) == LEASE_S / 2 == 1800
    assert renew_after_s(0) is None


def test_only_a_router_that_grants_permanent_leases_only_is_asked_again_for_lease_0():
    assert lease_after_refusal("OnlyPermanentLeasesSupported", 3600) == 0
    assert lease_after_refusal("OnlyPermanentLeasesSupported", 0) is None  # no loop
    assert lease_after_refusal("ConflictInMappingEntry", 3600) is None


def test_the_description_names_the_role_and_the_peer_within_the_routers_limit():
    d = description("direct", "Qm" + "x" * 44)
    assert d.startswith("swarm direct Qmxx") and len(d) == DESCRIPTION_CHARS


def test_the_log_line_says_what_was_mapped_and_refused():
    refused = [(PortToMap("direct", 41003), "ConflictInMappingEntry")]
    words = mapped_words([PortToMap("libp2p", 41001)], refused, "198.51.100.4", 3600)
    assert words == ("UPnP router 198.51.100.4 forwards TCP 41001 (libp2p) for 3600 s; "
                     "UPnP router 198.51.100.4 refused 41003 (direct): ConflictInMappingEntry")
    assert "permanently" in mapped_words([PortToMap("libp2p", 41001)], [], "r", 0)


def test_the_lab_stun_server_answers_a_binding_request_with_the_source_address():
    txid = bytes(range(12))
    request = struct.pack("!HHI12s", 0x0001, 0, MAGIC_COOKIE, txid)
    answer = binding_response(request, ("10.77.0.11", 37352))
    kind, length, cookie, got_txid = struct.unpack_from("!HHI12s", answer)
    assert (kind, length, cookie, got_txid) == (0x0101, 12, MAGIC_COOKIE, txid)
    attr, attr_len, _, family, xport, xaddr = struct.unpack_from("!HHBBHI", answer, 20)
    assert (attr, attr_len, family) == (0x0020, 8, 1)
    assert xport ^ (MAGIC_COOKIE >> 16) == 37352
    assert socket.inet_ntoa(struct.pack("!I", xaddr ^ MAGIC_COOKIE)) == "10.77.0.11"
    assert binding_response(b"\x00\x01" + bytes(18), ("10.77.0.11", 1)) is None  # no magic cookie
    assert binding_response(b"short", ("10.77.0.11", 1)) is None
