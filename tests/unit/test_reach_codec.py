"""swarm.reach's two messages: a request or answer from another peer decodes or is refused clearly."""

from __future__ import annotations

import msgpack
import pytest

from swarm.reach import NONCE_BYTES, decode_answer, decode_request, encode_request

NONCE = bytes(range(NONCE_BYTES))


def test_a_request_round_trips():
    assert decode_request(encode_request(NONCE, 40003, 0)) == (NONCE, 40003, 0)


@pytest.mark.parametrize("data, words", [
    (b"\xc1", "not msgpack"),
    (msgpack.packb([1, 2]), "must be a map"),
    (msgpack.packb({"nonce": b"short", "direct_port": 1}), "16-byte nonce"),
    (msgpack.packb({"nonce": "x" * 16}), "16-byte nonce"),
    (msgpack.packb({"nonce": NONCE, "direct_port": -1}), "0..65535"),
    (msgpack.packb({"nonce": NONCE, "libp2p_port": 1 << 20}), "0..65535"),
    (msgpack.packb({"nonce": NONCE, "direct_port": True}), "0..65535"),
    (msgpack.packb({"nonce": NONCE, "direct_port": "80"}), "0..65535"),
])
def test_a_bad_request_is_refused_with_its_reason(data, words):
    with pytest.raises(ValueError, match=words):
        decode_request(data)


def test_an_answer_reads_its_four_strings_and_refuses_other_types():
    assert decode_answer(msgpack.packb({"seen": "/ip4/1.2.3.4/tcp/5", "direct": "ok", "extra": 1})) == {
        "seen": "/ip4/1.2.3.4/tcp/5", "direct": "ok", "libp2p": "", "refused": ""}
    for bad in (b"\xc1", msgpack.packb("ok"), msgpack.packb({"direct": 1})):
        with pytest.raises(ValueError):
            decode_answer(bad)
