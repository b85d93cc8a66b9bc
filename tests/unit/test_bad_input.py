"""Bad input from users, peers and networks: one clear error of the project's own type, never a crash.

Pure checks (no model, no network): text that is not UTF-8, sampling parameters at and past their
edges (a temperature so small that 1/T overflows), the Open frame's sampling fields as a peer
decodes them, listen and advertised addresses (IPv4, IPv6, wildcard, public), seeder records with
several addresses, manifest bounds, and the serve config checked before anything starts.
"""

from __future__ import annotations

import math
import re

import msgpack
import numpy as np
import pytest

from swarm.artifacts.records import MAX_SEEDER_ADDRS, SeederRecord, decode_seeder, encode_seeder
from swarm.cli import main
from swarm.client.generate import GenerationRequest, check_request
from swarm.client.text import check_utf8
from swarm.errors import AddressError, ProtocolError, RequestError, SwarmError
from swarm.manifest import Manifest
from swarm.netaddr import (
    NetConfig,
    advertised_hosts,
    bt_hosts,
    bt_listen_string,
    check_net_config,
    is_ip_maddr,
    maddr_host_port,
    parse_host,
    reachable_first,
    tcp_multiaddr,
)
from swarm.peer.server import ServeConfig, check_config
from swarm.sampling import SamplingParams, distribution, sample
from swarm.wire import Open, decode_frame, encode_frame

# ---- text ---------------------------------------------------------------------------------------------


def test_bytes_that_were_not_utf8_are_named_as_bytes():
    argv_text = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")  # how argv and stdin arrive
    with pytest.raises(RequestError, match=r"prompt is not valid UTF-8 text: byte 0xe9 at character 3"):
        check_utf8(argv_text, "prompt")


def test_a_lone_surrogate_is_named_as_one():
    with pytest.raises(RequestError, match=r"lone surrogate U\+D83D at character 3"):
        check_utf8("hi \ud83d", "prompt")


@pytest.mark.parametrize("text", ["", "café au lait", "😀 中文", "\x00 nul is valid UTF-8"])
def test_valid_text_passes_unchanged(text):
    assert check_utf8(text, "prompt") is text


def test_non_text_is_a_request_error():
    with pytest.raises(RequestError, match="must be a string, got bytes"):
        check_utf8(b"hi", "prompt")


# ---- sampling -------------------------------------------------------------------------------------------

X = np.random.default_rng(5).standard_normal(4000).astype(np.float32)


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-300, 1e-45])
@pytest.mark.parametrize("filters", [{}, {"top_k": 40}, {"top_p": 0.9}, {"top_k": 40, "top_p": 0.5}])
def test_a_temperature_so_small_it_overflows_is_greedy(temperature, filters):
    params = SamplingParams(temperature=temperature, seed=11, **filters)
    with np.errstate(all="raise"):  # no overflow or invalid-value warning on the way
        ids, probs = distribution(X, params)
    assert np.isfinite(probs).all() and probs.sum() == pytest.approx(1.0)
    want = int(np.argmax(X))
    assert ids[np.argmax(probs)] == want and probs.max() == 1.0
    assert {sample(X, params, pos).token for pos in range(20)} == {want}


def test_tied_maxima_at_a_tiny_temperature_share_the_mass():
    x = np.array([1.0, 3.0, 3.0, -np.inf], np.float32)
    ids, probs = distribution(x, SamplingParams(temperature=1e-310))
    assert dict(zip(ids.tolist(), probs.tolist())) == {0: 0.0, 1: 0.5, 2: 0.5, 3: 0.0}


def test_huge_temperature_is_near_uniform_and_finite():
    ids, probs = distribution(X, SamplingParams(temperature=1e300))
    assert np.isfinite(probs).all() and probs.max() == pytest.approx(1 / X.size)


@pytest.mark.parametrize("top_k", [X.size, X.size + 1, 10**12])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_top_k_at_or_above_the_vocabulary_is_the_same_as_none(top_k, top_p):
    """It once reordered the candidates, so the same seed drew another token than top_k 0."""
    params = SamplingParams(temperature=0.8, top_p=top_p, seed=3)
    wide = SamplingParams(temperature=0.8, top_p=top_p, seed=3, top_k=top_k)
    (ia, pa), (ib, pb) = distribution(X, wide), distribution(X, params)
    assert np.array_equal(ia, ib) and np.array_equal(pa, pb)
    assert [sample(X, wide, i).token for i in range(50)] == [sample(X, params, i).token for i in range(50)]


def test_float128_logits_that_overflow_float64_are_refused():
    if np.finfo(np.longdouble).max <= np.finfo(np.float64).max:
        pytest.skip("longdouble is float64 here")
    x = np.array([1.0, np.finfo(np.longdouble).max], dtype=np.longdouble)
    with pytest.raises(RequestError, match="overflow float64"):
        sample(x, SamplingParams(temperature=1.0), 0)


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.0000001}, "top_p must be in (0, 1]"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_k": -1}, "top_k must be an integer >= 0"),
        ({"top_k": 2.0}, "top_k must be an integer"),
        ({"seed": 2**64}, "seed must be an integer in [0, 2**64)"),
        ({"seed": -1}, "seed must be an integer in [0, 2**64)"),
        ({"temperature": math.inf}, "temperature must be a finite number >= 0"),
        ({"temperature": "0.5"}, "temperature must be a finite number"),
    ],
)
def test_sampling_parameters_out_of_range(kw, needle):
    with pytest.raises(RequestError, match="^" + re.escape(needle)):
        SamplingParams(**kw)


@pytest.mark.parametrize("max_new_tokens", [0, -3, 2.5, "8", None, True])
def test_max_new_tokens_must_be_a_positive_integer(max_new_tokens):
    with pytest.raises(RequestError, match="max_new_tokens must be"):
        check_request(5, GenerationRequest(max_new_tokens=max_new_tokens), context_limit=1000)


def test_huge_max_new_tokens_names_the_context():
    with pytest.raises(RequestError, match="exceeds the model's context of 1000 tokens"):
        check_request(5, GenerationRequest(max_new_tokens=10**12), context_limit=1000)


def _open_body(**sampling) -> bytes:
    """An Open frame whose sampling map holds `sampling` (encoded by hand: the constructor refuses it)."""
    good = encode_frame(Open(bytes(16), "client", "ab" * 32, 0, 30, 64))
    hlen = int.from_bytes(good[1:3], "big")
    header = msgpack.unpackb(good[3 : 3 + hlen], raw=False)
    header["sampling"].update(sampling)
    packed = msgpack.packb(header, use_bin_type=True)
    return good[:1] + len(packed).to_bytes(2, "big") + packed


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 2.0},
        {"top_k": -5},
        {"seed": -1},
        {"n_top_logprobs": 21},
        {"temperature": "0"},
    ],
)
def test_peers_refuse_bad_sampling_in_the_open_frame(sampling):
    with pytest.raises(ProtocolError, match="field 'sampling'"):
        decode_frame(_open_body(**sampling))


def test_peers_accept_a_tiny_temperature_and_sample_greedily():
    frame = decode_frame(_open_body(temperature=1e-310))
    assert frame.sampling.temperature == 1e-310
    assert sample(X, frame.sampling, 9).token == int(np.argmax(X))


# ---- the chat command refuses before loading anything ------------------------------------------------------


@pytest.mark.parametrize(
    "extra, needle",
    [
        (("--prompt", "caf\udce9 au lait"), "--prompt is not valid UTF-8 text: byte 0xe9 at character 3"),
        (("--prompt", "hi", "--temperature", "nan"), "temperature must be a finite number >= 0"),
        (("--prompt", "hi", "--top-p", "0"), "top_p must be in (0, 1]"),
        (("--prompt", "hi", "--top-k", "-1"), "top_k must be an integer >= 0"),
        (("--prompt", "hi", "--seed", str(2**64)), "seed must be an integer in [0, 2**64)"),
        (("--prompt", "hi", "--max-new-tokens", "0"), "max_new_tokens must be >= 1"),
        (("--prompt", "hi", "--max-new-tokens", str(10**9)), "exceeds the product's hard cap of 131072"),
        (("--prompt", "hi", "--speculate", "-1"), "--speculate must be in [0, 63], got -1"),
        (("--prompt", "hi", "--speculate", "4"), "--speculate runs on the swarm"),
        (("--prompt", "hi", "--draft", "self"), "--draft chooses the guesses of --speculate"),
    ],
)
def test_chat_refuses_bad_input_in_one_line_without_loading_a_model(capsys, extra, needle):
    # A model that does not exist: reaching it would be a different error.
    assert main(["chat", "--local", "--model", "/nonexistent/never-loaded.gguf", *extra]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("swarm: error: ") and needle in err[0]


# ---- addresses ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, want",
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("::", "::"),
        ("0.0.0.0", "0.0.0.0"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("2001:DB8::1", "2001:db8::1"),
    ],
)
def test_hosts_are_ip_literals_v4_or_v6(text, want):
    assert str(parse_host(text)) == want


@pytest.mark.parametrize("text", ["localhost", "", "1.2.3", "::1:0:", "[::1", "fe80::1%eth0", "1.2.3.4:80"])
def test_other_hosts_are_refused(text):
    with pytest.raises(AddressError):
        parse_host(text)


def test_listen_strings_and_multiaddrs_for_both_families():
    assert bt_listen_string("::1", 0) == "[::1]:0"  # libtorrent cannot parse "::1:0"
    assert bt_listen_string("[::]", 6881) == "[::]:6881"
    assert bt_listen_string("127.0.0.1", 6881) == "127.0.0.1:6881"
    assert tcp_multiaddr("::1", 5) == "/ip6/::1/tcp/5"
    assert tcp_multiaddr("0.0.0.0", 0) == "/ip4/0.0.0.0/tcp/0"


@pytest.mark.parametrize(
    "maddr, want",
    [
        ("/ip4/1.2.3.4/tcp/80/p2p/QmX", ("1.2.3.4", 80)),
        ("/ip6/::1/tcp/4001", ("::1", 4001)),
        ("/ip6/1.2.3.4/tcp/80", None),  # family and address disagree
        ("/ip4/1.2.3.4/udp/80", None),
        ("/dns/example.com/tcp/80", None),
        ("/ip4/1.2.3.4/tcp/0", None),
        ("/ip4/1.2.3.4/tcp/+80", None),
        ("ip4/1.2.3.4/tcp/80", None),
    ],
)
def test_multiaddr_host_and_port(maddr, want):
    assert maddr_host_port(maddr) == want


def test_ip6_lines_count_as_peer_addresses():
    assert is_ip_maddr("/ip6/::1/tcp/4001/p2p/QmX") and is_ip_maddr("/ip4/1.2.3.4/tcp/1/p2p/QmX")
    assert not is_ip_maddr("serving layers 0:10") and not is_ip_maddr("/ip6/::1/tcp/4001")


def test_wildcard_advertises_interface_addresses_reachable_first():
    maddrs = ["/ip4/127.0.0.1/tcp/5/p2p/Q", "/ip4/10.0.0.2/tcp/5/p2p/Q", "/ip4/0.0.0.0/tcp/5/p2p/Q"]
    assert reachable_first(maddrs)[0] == "/ip4/10.0.0.2/tcp/5/p2p/Q"
    assert advertised_hosts(maddrs) == ["10.0.0.2", "127.0.0.1"]
    assert bt_hosts(check_net_config(NetConfig(host="0.0.0.0")), maddrs) == ["10.0.0.2", "127.0.0.1"]
    assert bt_hosts(check_net_config(NetConfig(host="127.0.0.1")), maddrs) == ["127.0.0.1"]
    public = check_net_config(NetConfig(host="0.0.0.0", port=4000, public_address="203.0.113.5"))
    assert bt_hosts(public, maddrs) == ["203.0.113.5"]


@pytest.mark.parametrize(
    "cfg, needle",
    [
        (NetConfig(host="localhost"), "--host must be an IP address"),
        (NetConfig(port=65536), "--port must be an integer in 0..65535"),
        (NetConfig(bt_port=-1), "--bt-port must be an integer in 0..65535"),
        (NetConfig(port=True), "--port must be an integer"),
        (NetConfig(public_address="203.0.113.5"), "needs a fixed --port"),
        (NetConfig(port=4000, public_address="::"), "not ::"),
        (NetConfig(port=4000, public_address="2001:db8::1"), "is IPv6 but --host 127.0.0.1 is IPv4"),
        (NetConfig(port=4000, public_address="example.com"), "--public-address must be an IP address"),
    ],
)
def test_net_configs_that_cannot_work(cfg, needle):
    with pytest.raises(AddressError, match=re.escape(needle)):
        check_net_config(cfg)


# ---- seeder records ----------------------------------------------------------------------------------------

IH = "ab" * 20
MODEL = "cd" * 32


def test_seeder_record_carries_every_address():
    rec = SeederRecord(IH, "192.0.2.2", 6881, more=(("127.0.0.1", 6881), ("2001:db8::1", 6882)))
    back = decode_seeder(encode_seeder(rec), MODEL)
    assert back == rec and back.addresses[0] == ("192.0.2.2", 6881) and len(back.addresses) == 3


def test_a_record_without_more_addresses_still_decodes():
    old = msgpack.packb({"v": 1, "infohash": IH, "host": "::1", "port": 6881})
    assert decode_seeder(old, MODEL).addresses == (("::1", 6881),)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "224.0.0.1", "ff02::1", "fe80::1%eth0"])
def test_seeder_hosts_nobody_can_dial_are_refused(host):
    with pytest.raises(ProtocolError, match="not an address other peers can connect to"):
        encode_seeder(SeederRecord(IH, "127.0.0.1", 1, more=((host, 2),)))
    with pytest.raises(ProtocolError, match="not an address other peers can connect to"):
        decode_seeder(msgpack.packb({"v": 1, "infohash": IH, "host": host, "port": 6881}), MODEL)


def test_seeder_address_count_and_shape_are_bounded():
    many = tuple(("127.0.0.1", p) for p in range(1, MAX_SEEDER_ADDRS + 1))
    with pytest.raises(ProtocolError, match="at most"):
        encode_seeder(SeederRecord(IH, "127.0.0.1", 1, more=many))
    for more in ([["127.0.0.1"]], [["127.0.0.1", "80"]], "x", [[1, 2]]):
        with pytest.raises(ProtocolError):
            decode_seeder(
                msgpack.packb({"v": 1, "infohash": IH, "host": "::1", "port": 1, "more": more}), MODEL
            )


# ---- manifest bounds --------------------------------------------------------------------------------------


def _doc(**changes) -> bytes:
    import json

    body = {
        "arch": "llama",
        "n_layers": 2,
        "n_embd": 8,
        "n_vocab": 3,
        "hparams": {"llama.context_length": 64},
        "tokenizer_sha256": "0" * 64,
        "header_sha256": "0" * 64,
        "file_size": 100,
        "data_offset": 10,
        "tensors": [
            {
                "name": "blk.1.w",
                "ggml_type": 0,
                "shape": [8],
                "offset": 10,
                "nbytes": 32,
                "sha256": "0" * 64,
                "layer": 1,
            }
        ],
        "version": 1,
        **changes,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def test_a_well_formed_manifest_passes():
    assert Manifest.from_bytes(_doc()).n_layers == 2


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"n_layers": True}, "n_layers must be an integer"),
        ({"n_layers": 10**12}, "n_layers 1000000000000 is outside"),
        ({"n_layers": 0}, "n_layers 0 is outside"),
        ({"n_embd": "8"}, "n_embd must be an integer"),
        ({"hparams": {"llama.context_length": "64"}}, "llama.context_length must be an integer"),
        ({"data_offset": 101}, "data_offset 101 is outside"),
        ({"header_sha256": "X" * 64}, "header_sha256 must be 64 lowercase hex"),
        (
            {
                "tensors": [
                    {
                        "name": "blk.1.w",
                        "ggml_type": 0,
                        "shape": [8],
                        "offset": 90,
                        "nbytes": 32,
                        "sha256": "0" * 64,
                        "layer": 1,
                    }
                ]
            },
            "nbytes 32 is outside",
        ),
        (
            {
                "tensors": [
                    {
                        "name": "blk.1.w",
                        "ggml_type": 0,
                        "shape": [8],
                        "offset": 10,
                        "nbytes": 32,
                        "sha256": "0" * 64,
                        "layer": 0,
                    }
                ]
            },
            "has layer 0, expected 1",
        ),
        (
            {
                "tensors": [
                    {
                        "name": "blk.5.w",
                        "ggml_type": 0,
                        "shape": [8],
                        "offset": 10,
                        "nbytes": 32,
                        "sha256": "0" * 64,
                        "layer": 5,
                    }
                ]
            },
            "expected 5 < n_layers",
        ),
        (
            {
                "tensors": [
                    {
                        "name": "w",
                        "ggml_type": 0,
                        "shape": [1, 1, 1, 1, 1],
                        "offset": 10,
                        "nbytes": 1,
                        "sha256": "0" * 64,
                        "layer": None,
                    }
                ]
            },
            "1..4 dims",
        ),
    ],
)
def test_manifest_fields_out_of_bounds_are_protocol_errors(changes, needle):
    with pytest.raises(ProtocolError, match=re.escape(needle)):
        Manifest.from_bytes(_doc(**changes))


@pytest.mark.parametrize("data", [b"[" * 100_000, _doc().replace(b'"n_vocab":3', b'"n_vocab":NaN'), "text"])
def test_manifest_garbage_never_escapes_as_another_exception(data):
    with pytest.raises(ProtocolError):
        Manifest.from_bytes(data)


# ---- serve config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"host": "::1:0:"}, "--host must be an IP address"),
        ({"max_sessions": 0}, "max_sessions must be an integer in [1, 256]"),
        ({"cache_tokens": 10**9}, "cache_tokens must be an integer"),
        ({"n_threads": -1}, "threads must be an integer"),
        ({"memory_bytes": -1}, "memory_bytes"),
        ({"max_layers": 0}, "max_layers"),
        ({"announce_period_s": 0.0}, "announce_period_s must be a finite number of seconds > 0"),
        ({"announce_period_s": math.inf}, "announce_period_s"),
        ({"announce_period_s": 241.0}, "announce_period_s must be at most 240 s"),
        ({"rebalance_period_s": -1.0}, "rebalance_period_s must be a finite number of seconds >= 0"),
        ({"public_name": ""}, "public name must be printable UTF-8 text of 1..64"),
        ({"public_name": "a\nb"}, "public name"),
        ({"public_name": "\ud83d"}, "public name"),
        ({"port_mapping": "natpmp"}, "--port-mapping must be one of auto, off"),
    ],
)
def test_serve_configs_that_cannot_serve(changes, needle):
    with pytest.raises(SwarmError, match=re.escape(needle)):
        check_config(ServeConfig(model="m", **changes))


def test_serve_config_passes_checked_addresses_on():
    net = check_config(
        ServeConfig(model="m", host="[::]", port=4001, bt_port=6881, public_address="2001:db8::5")
    )
    assert net == NetConfig(host="::", port=4001, bt_port=6881, public_address="2001:db8::5")
    assert (
        check_config(ServeConfig(model="m", rebalance_period_s=0.0, public_name="café ☕")).host
        == "127.0.0.1"
    )
