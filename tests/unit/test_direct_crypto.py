"""Direct streams' frame sealing and tickets (swarm.direct): what opens, what does not, and when a
ticket stops admitting. Pure: no sockets (tests/integration/test_direct.py runs real connections)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.direct import KEY_BYTES, TICKET_BYTES, AeadFrameCipher, TicketBook
from swarm.errors import ProtocolError

KEY = bytes(range(KEY_BYTES))


def pair() -> tuple[AeadFrameCipher, AeadFrameCipher]:
    return AeadFrameCipher(KEY, initiator=True), AeadFrameCipher(KEY, initiator=False)


def test_frames_open_in_order_both_ways():
    client, peer = pair()
    for i in range(3):
        sealed = client.seal(b"forward %d" % i)
        assert b"forward" not in sealed  # encrypted, not only signed
        assert len(sealed) == len(b"forward %d" % i) + client.overhead
        assert peer.open(sealed) == b"forward %d" % i
        assert client.open(peer.seal(b"hidden %d" % i)) == b"hidden %d" % i


@pytest.mark.parametrize("position", [0, 5, -1])
def test_an_altered_frame_does_not_open(position):
    client, peer = pair()
    sealed = bytearray(client.seal(b"a hidden state of 2304 bytes" * 4))
    sealed[position] ^= 0x01
    with pytest.raises(ProtocolError, match="authentication"):
        peer.open(bytes(sealed))


def test_a_replayed_or_reordered_frame_does_not_open():
    client, peer = pair()
    first = client.seal(b"step 1")
    assert peer.open(first) == b"step 1"
    with pytest.raises(ProtocolError):
        peer.open(first)  # the same frame again
    client2, peer2 = pair()
    client2.seal(b"step 1")
    with pytest.raises(ProtocolError):
        peer2.open(client2.seal(b"step 2"))  # the second before the first


def test_a_frame_sent_back_to_its_sender_does_not_open():
    client, _ = pair()
    with pytest.raises(ProtocolError):
        client.open(client.seal(b"echo"))  # directions have their own nonces


def test_another_key_does_not_open():
    client = AeadFrameCipher(KEY, initiator=True)
    other = AeadFrameCipher(bytes(KEY_BYTES), initiator=False)
    with pytest.raises(ProtocolError):
        other.open(client.seal(b"x"))


def test_a_key_of_the_wrong_size_is_refused():
    with pytest.raises(ProtocolError, match="32 bytes"):
        AeadFrameCipher(b"short", initiator=True)


def test_a_ticket_admits_once_whom_it_was_issued_to():
    book = TicketBook(ttl_s=30.0)
    ticket, key = book.issue("QmClient", "/swarm/span/1", now_s=100.0)
    assert len(ticket) == TICKET_BYTES and len(key) == KEY_BYTES
    grant = book.redeem(ticket, now_s=101.0)
    assert (grant.peer_id, grant.protocol, grant.key) == ("QmClient", "/swarm/span/1", key)
    assert book.redeem(ticket, now_s=101.0) is None  # used
    assert book.redeem(bytes(TICKET_BYTES), now_s=101.0) is None  # never issued


def test_a_ticket_expires():
    book = TicketBook(ttl_s=30.0)
    ticket, _ = book.issue("QmClient", "/swarm/span/1", now_s=100.0)
    assert book.redeem(ticket, now_s=130.0) is None


def test_outstanding_tickets_are_bounded():
    book = TicketBook(ttl_s=30.0, max_tickets=4)
    tickets = [book.issue(f"Qm{i}", "/p", now_s=float(i))[0] for i in range(10)]
    assert len(book) == 4
    assert book.redeem(tickets[0], now_s=10.0) is None  # the oldest were dropped
    assert book.redeem(tickets[-1], now_s=10.0).peer_id == "Qm9"
    # expired ones go first when a new ticket is issued
    book.issue("QmLate", "/p", now_s=1000.0)
    assert len(book) == 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_any_bytes_from_the_network_open_or_raise_protocol_error(data):
    _, peer = pair()
    with pytest.raises(ProtocolError):
        peer.open(data)  # no key, no valid tag: never anything but ProtocolError


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=TICKET_BYTES, max_size=TICKET_BYTES))
def test_a_guessed_ticket_admits_nobody(guess):
    book = TicketBook()
    book.issue("QmClient", "/swarm/span/1", now_s=0.0)
    assert book.redeem(guess, now_s=1.0) is None
