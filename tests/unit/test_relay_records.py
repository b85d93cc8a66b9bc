"""swarm.relay.records: relay offers, relay addresses, hello messages; and relay_addrs in announcements."""

from __future__ import annotations

import msgpack
import pytest

from swarm.dht.records import Announcement, decode_announcement, encode_announcement
from swarm.errors import ProtocolError
from swarm.relay.records import (
    RelayOffer,
    decode_message,
    decode_offer,
    encode_message,
    encode_offer,
    parse_relay_addr,
    relay_addr,
)

PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def test_offer_round_trip_and_bounds():
    offer = RelayOffer(PEER, ("/ip4/10.77.0.10/tcp/41000",), 64, 63, 32, 16 << 20)
    assert decode_offer(PEER, encode_offer(offer)) == offer
    assert offer.addrs() == (f"/ip4/10.77.0.10/tcp/41000/p2p/{PEER}",)
    fields = msgpack.unpackb(encode_offer(offer))
    assert decode_offer(PEER, msgpack.packb({**fields, "newer_field": 1})) == offer  # forward-compatible
    for bad in ({"free_peers": 65}, {"endpoints": []}, {"endpoints": ["x"] * 9}, {"bytes_per_s": 0},
                {"max_peers": "64"}, {"endpoints": ["/ip4/1.2.3.4/tcp/1" + "0" * 300]}):
        assert decode_offer(PEER, msgpack.packb({**fields, **bad})) is None, bad
    assert decode_offer(PEER, b"\xc1junk") is None


def test_relay_addr_parses_back_and_refuses_others():
    addr = relay_addr("/ip6/::1/tcp/5000", PEER)
    assert parse_relay_addr(addr) == ("::1", 5000, PEER)
    for bad in ("/ip4/1.2.3.4/tcp/5000", f"/dns/x/tcp/1/p2p/{PEER}", f"/ip4/1.2.3.4/tcp/0/p2p/{PEER}",
                "/ip4/1.2.3.4/tcp/5/p2p/short", f"/ip4/1.2.3.4/tcp/5/x/y/p2p/{PEER}", 7):
        assert parse_relay_addr(bad) is None, bad


def test_messages_round_trip_and_are_checked():
    assert decode_message(encode_message("connect", peer=PEER), "connect") == {"op": "connect", "peer": PEER}
    assert decode_message(encode_message("refused", why="x" * 5000))["why"] == "x" * 300
    with pytest.raises(ProtocolError, match="expected connected/refused, got 'dial'"):
        decode_message(encode_message("dial", token=bytes(16)), "connected", "refused")
    for bad in (msgpack.packb({"op": "dial", "token": bytes(15)}), msgpack.packb({"op": "ping", "x": 1}),
                msgpack.packb({"op": "connect", "peer": "not a peer id"}), msgpack.packb(["op"]),
                msgpack.packb({"op": "nope"}), b"\xc1", bytes(3000)):
        with pytest.raises(ProtocolError):
            decode_message(bad)
    with pytest.raises(ProtocolError):
        encode_message("accept", token=b"short")  # a local bug does not reach the wire


def _announcement(**over) -> Announcement:
    return Announcement(peer_id=PEER, addrs=(), model_id="ab" * 32, start=0, end=10, decode_steps_per_s=1.0,
                        prefill_tokens_per_s=1.0, free_cache_tokens=10, max_sessions=1, sessions_free=1,
                        version="0", protocol=6, public_name=None, expires_at=1.0, **over)


def test_announcement_carries_relay_addrs_and_old_records_parse():
    ann = _announcement(relay_addrs=(relay_addr("/ip4/10.77.0.10/tcp/41000", PEER),))
    assert decode_announcement(encode_announcement(ann)) == ann
    old = encode_announcement(_announcement())
    del old["relay_addrs"]  # a record of a peer from before relays
    assert decode_announcement(old) == _announcement()
    too_many = encode_announcement(ann)
    too_many["relay_addrs"] = ["/ip4/1.2.3.4/tcp/1"] * 17
    assert decode_announcement(too_many) is None
