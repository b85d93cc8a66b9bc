"""Addresses as users give them: IPv6 end to end, a wildcard host, a public address, and refusals.

Real peer processes on this machine. IPv6 loopback works here (checked by `ipv6_loopback`), so
`--host ::1` must carry a whole generation: DHT and streams over `/ip6/` multiaddrs, a fresh peer
fetching its span over BitTorrent from `[::1]`, a client that knows only the model_id. A wildcard
`--host 0.0.0.0` must advertise every interface address (never the wildcard) with the configured
`--bt-port`, each of them reachable; `--public-address` must be the only address advertised.
Bad addresses are refused with one error line before any address is handed out.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys

import pytest
from tests.helpers.oracle import oracle
from tests.helpers.peers import RawClient

from swarm import Client
from swarm.artifacts.distribute import find_seeders
from swarm.manifest import build_manifest
from swarm.netaddr import maddr_host_port

PROMPT = "The capital of France is"
SERVE = ("--threads", "1", "--cache-tokens", "2048")


@pytest.fixture(scope="module")
def ipv6_loopback() -> None:
    """Skip unless this machine can listen on and connect to ::1 (it can where these tests run)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            s.listen()
            socket.create_connection(("::1", s.getsockname()[1]), timeout=5).close()
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")


def _expected(path, n: int) -> str:
    return oracle(path, PROMPT, n, n_ctx=512)


def _seeders(peer, model_id: str, tmp_path) -> list:
    """The seeder records of model_id as a client-mode DHT node joined through `peer` reads them."""
    raw = RawClient(peer, model_id, tmp_path / "reader")
    try:
        return raw.loop.run(find_seeders(raw.dht, model_id), 30)
    finally:
        raw.close()


def _free_port(family: int = socket.AF_INET, host: str = "0.0.0.0") -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def test_ipv6_end_to_end(ipv6_loopback, peers, smollm2_path, tmp_path):
    model_id = build_manifest(smollm2_path).model_id
    a = peers.start(
        "a", "serve", "--model", str(smollm2_path), "--layers", "0:15", "--new-swarm", "--host", "::1", *SERVE
    )
    assert a.maddrs and all(m.startswith("/ip6/::1/tcp/") for m in a.maddrs)
    # A fresh peer knows only the model_id: its span comes over BitTorrent from [::1].
    b = peers.start(
        "b",
        "serve",
        "--model",
        model_id,
        "--layers",
        "15:30",
        "--initial-peers",
        a.maddrs[0],
        "--host",
        "::1",
        *SERVE,
    )
    assert "fetched" in b.stderr_text() and "[::1]:" in b.stderr_text()
    seeders = _seeders(a, model_id, tmp_path)
    assert {h for s in seeders for h, _ in s.addresses} == {"::1"}
    with Client(model_id, initial_peers=a.maddrs) as client:  # header and embeddings also over IPv6
        got = client.generate(PROMPT, max_new_tokens=16)
    assert got.text == _expected(smollm2_path, 16)
    assert [(h.start, h.end, h.peer_id) for h in got.telemetry.route] == [
        (0, 15, a.peer_id),
        (15, 30, b.peer_id),
    ]


def test_wildcard_host_advertises_each_interface_with_the_bt_port(peers, smollm2_path, tmp_path):
    model_id = build_manifest(smollm2_path).model_id
    bt_port = _free_port()
    a = peers.start(
        "a",
        "serve",
        "--model",
        str(smollm2_path),
        "--layers",
        "0:15",
        "--new-swarm",
        "--host",
        "0.0.0.0",
        "--bt-port",
        str(bt_port),
        *SERVE,
    )
    hosts = [maddr_host_port(m)[0] for m in a.maddrs]
    assert "0.0.0.0" not in hosts and "127.0.0.1" in hosts
    [record] = _seeders(a, model_id, tmp_path)
    assert {h for h, _ in record.addresses} == set(hosts)
    assert {p for _, p in record.addresses} == {bt_port}
    assert not ipaddress.ip_address(record.host).is_loopback or hosts == ["127.0.0.1"]  # reachable first
    for host, port in record.addresses:  # every advertised address accepts connections
        socket.create_connection((host, port), timeout=10).close()
    b = peers.start(
        "b", "serve", "--model", model_id, "--layers", "15:30", "--initial-peers", a.maddrs[0], *SERVE
    )
    assert "fetched" in b.stderr_text()
    with Client(str(smollm2_path), initial_peers=a.maddrs) as client:
        assert client.generate(PROMPT, max_new_tokens=8).text == _expected(smollm2_path, 8)


def test_public_address_is_the_only_one_advertised(peers, smollm2_path, tmp_path):
    model_id = build_manifest(smollm2_path).model_id
    port, bt_port = _free_port(), _free_port()
    pub = peers.start(
        "pub",
        "publish",
        str(smollm2_path),
        "--new-swarm",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--bt-port",
        str(bt_port),
        "--public-address",
        "127.0.0.1",
        ready_marker="publishing",
    )
    assert [m.split("/p2p/")[0] for m in pub.maddrs] == [f"/ip4/127.0.0.1/tcp/{port}"]
    [record] = _seeders(pub, model_id, tmp_path)
    assert record.addresses == (("127.0.0.1", bt_port),)
    fresh = peers.start(
        "fresh", "serve", "--model", model_id, "--layers", "0:30", "--initial-peers", pub.maddrs[0], *SERVE
    )
    assert "fetched" in fresh.stderr_text()


def _swarm(home, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swarm.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "SWARM_HOME": str(home)},
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--host", "localhost"), "--host must be an IP address"),
        (("--host", "::1:0"), "cannot listen for BitTorrent on [::1:0]:0"),  # the old `::1:0` mistake
        (("--host", "fe80::1%lo"), "scoped IPv6 addresses are not supported"),
        (("--port", "70000"), "--port must be an integer in 0..65535"),
        (("--bt-port", "-1"), "--bt-port must be an integer in 0..65535"),
        (("--direct-port", "70000"), "--direct-port must be an integer in 0..65535"),
        (("--metrics-port", "0"), "--metrics-port must be in 1..65535"),
        (("--public-address", "192.0.2.7"), "--public-address needs a fixed --port"),
        (("--public-address", "0.0.0.0", "--port", "4000"), "not 0.0.0.0"),
        (("--public-address", "::1", "--port", "4000"), "is IPv6 but --host 127.0.0.1 is IPv4"),
        (("--public-name", "x" * 65), "public name must be printable UTF-8 text of 1..64"),
        (("--public-name", "caf\udce9"), "public name must be printable UTF-8"),
        (("--announce-period", "0"), "announce_period_s must be a finite number of seconds > 0"),
        (("--rebalance-period", "nan"), "rebalance_period_s must be a finite number"),
        (("--threads", "0"), "threads must be an integer in [1, 1024]"),
        (("--max-sessions", "0"), "max_sessions must be an integer in [1, 256]"),
        (("--cache-tokens", "0"), "cache_tokens must be an integer"),
        (("--client-bytes", "1MiB"), "client_bytes must be an integer >= 67108864 (the largest frame)"),
        (("--client-streams", "300"), "client_streams 300 > max_streams 256"),
    ],
)
def test_bad_serve_options_are_refused_before_anything_starts(smollm2_path, tmp_path, args, needle):
    proc = _swarm(tmp_path, "serve", "--model", str(smollm2_path), "--layers", "0:30", "--new-swarm", *args)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("swarm: error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
    assert "/p2p/" not in proc.stdout  # no DHT node started


@pytest.mark.parametrize(
    "flag, needle",
    [
        ("--bt-port", "cannot listen for BitTorrent on 127.0.0.1:{port}"),
        ("--direct-port", "--direct-port {port}: cannot listen on 127.0.0.1: Address already in use"),
    ],
)
def test_busy_port_is_refused_before_the_dht_starts(smollm2_path, tmp_path, flag, needle):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        serve = ("serve", "--model", str(smollm2_path), "--layers", "0:30", "--new-swarm")
        proc = _swarm(tmp_path, *serve, flag, str(port))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("swarm: error:")]
    assert len(errors) == 1 and needle.format(port=port) in errors[0], proc.stderr
    assert "/p2p/" not in proc.stdout  # refused before the DHT node started


def test_direct_port_and_no_direct_exclude_each_other(smollm2_path, tmp_path):
    proc = _swarm(tmp_path, "serve", "--model", str(smollm2_path), "--no-direct", "--direct-port", "5000")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


@pytest.mark.parametrize("command", [("dht",), ("publish", "smollm2-135m", "--new-swarm")])
def test_other_commands_refuse_bad_hosts_too(tmp_path, command):
    proc = _swarm(tmp_path, *command, "--host", "my-laptop.local")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "swarm: error: --host must be an IP address" in proc.stderr
    assert "/p2p/" not in proc.stdout
