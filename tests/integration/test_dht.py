"""Real hivemind DHT nodes (each its own process and p2pd) on 127.0.0.1: announce, read, withdraw,
expire, reject forged records, persistent identity."""

from __future__ import annotations

import dataclasses
import functools

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarm.dht.identity import IdentityError, load_or_create_identity
from swarm.dht.node import DHTError, SwarmDHT
from swarm.dht.records import ANNOUNCE_SUBKEY_TAG, Announcement, announcements_key, encode_announcement
from swarm.errors import ProtocolError
from swarm.limits import MAX_RECORD_TTL_S, MAX_SUBKEYS_PER_OWNER

from tests.helpers.peers import wait_for

MODEL = "c0ffee" * 8


@pytest.fixture(scope="module")
def nodes(loop, tmp_path_factory):
    """A bootstraps; B and C join through A's multiaddrs."""

    async def start():
        a = await SwarmDHT.start(data_dir=tmp_path_factory.mktemp("a"))
        b = await SwarmDHT.start(a.visible_maddrs(), data_dir=tmp_path_factory.mktemp("b"))
        c = await SwarmDHT.start(a.visible_maddrs(), data_dir=tmp_path_factory.mktemp("c"))
        return a, b, c

    started = loop.run_until_complete(start())
    yield started
    for node in reversed(started):
        loop.run_until_complete(node.shutdown())


def poll(loop, probe, what: str, want):
    """Run coroutine factory `probe` until its result equals `want` (or, when `want` is a callable,
    satisfies it) and return that result; past wait_for's deadline, fail naming `what` and the last
    result."""
    until = want if callable(want) else lambda got: got == want
    return wait_for(lambda: loop.run_until_complete(probe()), what, until=until)


def announcement(node: SwarmDHT, model_id: str = MODEL, **changes) -> Announcement:
    ann = Announcement(
        peer_id=node.peer_id,
        addrs=tuple(node.visible_maddrs()),
        model_id=model_id,
        start=10,
        end=20,
        decode_steps_per_s=150.25,
        prefill_tokens_per_s=480.5,
        free_cache_tokens=32768,
        max_sessions=4,
        sessions_free=3,
        version="0.1.0",
        protocol=1,
        public_name="bob",
        expires_at=0.0,
    )
    return dataclasses.replace(ann, **changes)


def test_maddrs_name_the_peer(nodes):
    a, b, _ = nodes
    assert a.peer_id != b.peer_id
    for node in nodes:
        assert node.visible_maddrs()
        assert all(
            m.startswith("/ip4/127.0.0.1/tcp/") and m.endswith(f"/p2p/{node.peer_id}")
            for m in node.visible_maddrs()
        )


def test_announce_read_back_withdraw(loop, nodes):
    _, b, c = nodes
    model = "a1" * 16
    stored = loop.run_until_complete(b.announce(announcement(b, model), expiration_s=60))
    assert stored.expires_at == pytest.approx(get_dht_time() + 60, abs=5)
    poll(loop, lambda: c.get_announcements(model), "C reads B's record, every field equal", [stored])
    assert loop.run_until_complete(c.get_announcements("b2" * 16)) == []

    loop.run_until_complete(b.withdraw(model))
    poll(loop, lambda: c.get_announcements(model), "C sees the withdrawal", [])
    # what C found is B's signed tombstone, not an expired or lost record
    entries = loop.run_until_complete(c._get_entries(announcements_key(model)))  # noqa: SLF001
    tombstone = (ANNOUNCE_SUBKEY_TAG + b._owner_marker, None)
    assert [(subkey, value) for subkey, value, _ in entries] == [tombstone]

    # coming back right after a withdrawal: the new record must outlive the tombstone to win
    again = loop.run_until_complete(b.announce(announcement(b, model, sessions_free=2), expiration_s=60))
    poll(loop, lambda: c.get_announcements(model), "C reads B's new record", [again])


def test_announce_after_restart_overrides_a_later_record_from_the_previous_run(loop, nodes):
    """A restarted peer does not remember its earlier records; announce must still win over them."""
    _, b, c = nodes
    model = "a2" * 16
    loop.run_until_complete(b.announce(announcement(b, model), expiration_s=120))
    b._last_expiration.clear()  # what a restart with the same identity forgets
    fresh = loop.run_until_complete(b.announce(announcement(b, model, sessions_free=0), expiration_s=5))
    assert fresh.expires_at > get_dht_time() + 100  # placed just after the previous run's record
    poll(loop, lambda: c.get_announcements(model), "C reads the restarted B's record", [fresh])


def test_refresh_replaces_the_same_peers_record(loop, nodes):
    _, b, c = nodes
    model = "a3" * 16
    loop.run_until_complete(b.announce(announcement(b, model, sessions_free=3), expiration_s=60))
    second = loop.run_until_complete(b.announce(announcement(b, model, sessions_free=1), expiration_s=60))
    poll(loop, lambda: c.get_announcements(model), "C reads B's refreshed record", [second])


def test_two_peers_both_listed_in_layer_order(loop, nodes):
    a, b, c = nodes
    model = "a4" * 16
    ann_b = loop.run_until_complete(b.announce(announcement(b, model, start=10, end=20), 60))
    ann_a = loop.run_until_complete(a.announce(announcement(a, model, start=0, end=10), 60))
    poll(loop, lambda: c.get_announcements(model), "C reads A's and B's records", [ann_a, ann_b])


def test_record_expires(loop, nodes):
    _, b, c = nodes
    model = "a5" * 16
    # long enough that a slow machine still reads it back before it expires
    stored = loop.run_until_complete(b.announce(announcement(b, model), expiration_s=5))
    assert loop.run_until_complete(c.get_announcements(model)) == [stored]
    poll(loop, lambda: c.get_announcements(model), "the record expiring", [])
    assert get_dht_time() >= stored.expires_at  # expired, not dropped early


def test_client_mode_node_reads_announcements(loop, nodes, tmp_path):
    a, b, _ = nodes
    model = "a8" * 16
    stored = loop.run_until_complete(b.announce(announcement(b, model), expiration_s=60))

    async def read_as_client() -> list[Announcement]:
        client = await SwarmDHT.start(a.visible_maddrs(), data_dir=tmp_path / "client", client_mode=True)
        try:
            return await client.get_announcements(model)
        finally:
            await client.shutdown()

    assert loop.run_until_complete(read_as_client()) == [stored]


def test_lone_node_announces_to_itself(loop, tmp_path):
    async def run() -> tuple[Announcement, list[Announcement]]:
        node = await SwarmDHT.start(data_dir=tmp_path / "lone")
        try:
            stored = await node.announce(announcement(node, start=0, end=30), expiration_s=30)
            return stored, await node.get_announcements(MODEL)
        finally:
            await node.shutdown()

    stored, found = loop.run_until_complete(run())
    assert found == [stored]


def test_announce_for_another_peer_id_is_refused_locally(loop, nodes):
    _, b, c = nodes
    with pytest.raises(ProtocolError):
        loop.run_until_complete(b.announce(announcement(c), 60))


def test_blobs_round_trip_and_erase(loop, nodes):
    _, b, c = nodes
    key = f"swarm/{'a6' * 16}/torrent"
    loop.run_until_complete(b.store_blob(key, "infohash", b"\x11" * 32, 60))
    blobs = poll(loop, lambda: c.get_blob(key), "C reads B's blob", bool)
    assert [(x.name, x.owner_peer_id, x.value) for x in blobs] == [("infohash", b.peer_id, b"\x11" * 32)]
    loop.run_until_complete(b.store_blob(key, "infohash", None, 60))
    poll(loop, lambda: c.get_blob(key), "C sees the blob erased", [])


class _SignAnythingValidator(RSASignatureValidator):
    """An attacker's signer: signs every record with its own key, whatever owner the subkey names."""

    def sign_value(self, record):
        signature = self._private_key.sign(self._serialize_record(record))
        return record.value + self.SIGNATURE_FORMAT.replace(b"_value_", signature)


def test_forged_unsigned_and_malformed_records_are_rejected(loop, nodes, tmp_path):
    """A raw hivemind client (no swarm checks of its own) tries to plant bad records. Honest nodes refuse
    them at store time (store returns False: client mode keeps nothing itself), and readers never see them;
    the control record, well formed and signed by its own key, goes through."""
    a, b, c = nodes
    model = "a7" * 16
    key = announcements_key(model)
    attacker_id = load_or_create_identity(tmp_path / "attacker")
    own = RSASignatureValidator(attacker_id.private_key)
    b_marker = ANNOUNCE_SUBKEY_TAG + b._owner_marker
    own_marker = ANNOUNCE_SUBKEY_TAG + own.local_public_key
    ann_b = encode_announcement(announcement(b, model, expires_at=get_dht_time() + 60))
    ann_own = encode_announcement(
        announcement(b, model, peer_id=attacker_id.peer_id, expires_at=get_dht_time() + 60)
    )
    exp = get_dht_time() + 60

    unsigned = hivemind.DHT(initial_peers=a.visible_maddrs(), start=True, client_mode=True)
    forger = hivemind.DHT(
        initial_peers=a.visible_maddrs(),
        start=True,
        client_mode=True,
        record_validators=[_SignAnythingValidator(attacker_id.private_key)],
    )
    try:
        # B's subkey, no signature at all
        assert unsigned.store(key, ann_b, exp, subkey=b_marker, exclude_self=True) is False
        # B's subkey, signed by the attacker's key
        assert forger.store(key, ann_b, exp, subkey=b_marker, exclude_self=True) is False
        # the attacker's own subkey, properly signed, but claiming B's peer id
        assert forger.store(key, ann_b, exp, subkey=own_marker, exclude_self=True) is False
        # the attacker's own subkey, properly signed, schema-malformed
        for malformed in (dict(ann_own, start=25, end=5), dict(ann_own, free_cache_tokens=-1)):
            assert forger.store(key, malformed, exp, subkey=own_marker, exclude_self=True) is False
        assert loop.run_until_complete(c.get_announcements(model)) == []
        # control: well formed, own key, own peer id
        assert forger.store(key, ann_own, exp, subkey=own_marker, exclude_self=True) is True
        found = poll(loop, lambda: c.get_announcements(model), "C reads the control record", bool)
        assert [x.peer_id for x in found] == [attacker_id.peer_id]
    finally:
        unsigned.shutdown()
        forger.shutdown()


async def _store_signed(key: str, records: list[tuple], _dht, node) -> dict:
    """Run inside an attacker's hivemind DHT process: store (subkey, value, expiration) records under
    `key` (subkey None: a plain value), signed by the process's RSA validator where the subkey names its
    owner, on the swarm's nodes only (exclude_self: the attacker's
    own plain storage takes anything, and hivemind reports its own store as an ack when no remote store
    answers). Returns, per subkey, whether the nodes acknowledged it."""
    subkeys = [subkey for subkey, _, _ in records]
    values = [value for _, value, _ in records]
    expirations = [expiration for _, _, expiration in records]
    ok = await node.store_many([key] * len(records), values, expirations, subkeys=subkeys, exclude_self=True)
    return {subkey: ok[key if subkey is None else (key, subkey)] for subkey in subkeys}


def test_a_strangers_plain_value_does_not_erase_the_swarm(loop, nodes, tmp_path):
    """issue 24: a plain value (no subkey) stored for 10 years under a model's spans key by a third,
    plain hivemind node replaced the dictionary of every peer's announcement. Now every node refuses
    it (and unsigned junk subkeys), C still lists B, and B's refresh is still accepted."""
    a, b, c = nodes
    model = "d1" * 16
    key = announcements_key(model)
    loop.run_until_complete(b.announce(announcement(b, model), expiration_s=60))
    poll(loop, lambda: c.get_announcements(model), "C sees B's announcement", lambda got: len(got) == 1)

    # the stranger also stores one well-formed signed record in the same message: its acceptance shows
    # the refusals are the nodes' answers, not stores that never arrived
    signer = RSASignatureValidator(load_or_create_identity(tmp_path / "stranger").private_key)
    stranger = hivemind.DHT(initial_peers=a.visible_maddrs(), start=True, client_mode=True,
                            record_validators=[signer])
    try:
        now = get_dht_time()
        signed = b"blob:fine" + signer.local_public_key
        answers = stranger.run_coroutine(functools.partial(_store_signed, key, [
            (None, {"erased": True}, now + 10 * 365 * 86400), (b"junk0", b"x" * 1000, now + 60),
            (signed, b"p", now + 60)]))
    finally:
        stranger.shutdown()
    assert answers == {None: False, b"junk0": False, signed: True}
    assert [x.peer_id for x in loop.run_until_complete(c.get_announcements(model))] == [b.peer_id]
    loop.run_until_complete(b.announce(announcement(b, model, start=0), expiration_s=60))
    refreshed = lambda got: [x.start for x in got] == [0]  # noqa: E731
    found = poll(loop, lambda: c.get_announcements(model), "C sees B's refresh", refreshed)
    assert [x.peer_id for x in found] == [b.peer_id]
    # a span past the model's 30 layers passes the validators (they do not know the model) but a
    # reader that knows the layer count drops it
    loop.run_until_complete(b.announce(announcement(b, model, start=25, end=31), expiration_s=60))
    poll(loop, lambda: c.get_announcements(model), "C sees 25:31", lambda got: [x.end for x in got] == [31])
    assert loop.run_until_complete(c.get_announcements(model, 30)) == []


JUNK_SUBKEYS = 20_000
"""issue 24: 20,000 junk subkeys of 1 kB each under one model's spans key."""


async def _store_junk(key: str, names: range, marker: bytes, value: bytes, expiration: float, _dht, node) -> int:
    """Run inside an attacker's hivemind DHT process (the subkeys are made there: hivemind's pipe to it
    takes small messages only): store blob:junk<i> signed by `marker`'s key for i in `names`, return
    how many were accepted."""
    records = [(b"blob:junk%d" % i + marker, value, expiration) for i in names]
    return sum((await _store_signed(key, records, _dht, node)).values())


async def _held(key: str, _dht, node) -> tuple[int, int, float]:
    """Run inside a DHT node's process: (subkeys, bytes, latest expiration) its storage holds under `key`,
    the bytes being what it sends a reader who asks for the key (hivemind serializes the stored
    dictionary whole)."""
    item = node.protocol.storage.get(DHTID.generate(source=key))
    if item is None:
        return 0, 0, 0.0
    latest = max((expiration for _, (_, expiration) in item.value.items()), default=0.0)
    return len(list(item.value.items())), len(MSGPackSerializer.dumps(item.value)), latest


def test_twenty_thousand_signed_junk_subkeys_stay_bounded(loop, nodes, tmp_path):
    """issue 24: a stranger stored 20,000 junk subkeys of 1 kB under a model's spans key and every
    reader downloaded ~20 MB. Now they must be signed, and each node stores at most
    MAX_SUBKEYS_PER_OWNER of one signer's (and at most MAX_KEY_BYTES per key), so a reader downloads
    under 300 kB from each node; the honest peer is still listed and can refresh; a signed record
    expiring in 10 years is refused (by every node: the attacker's own storage does not count)."""
    a, b, c = nodes
    model = "d2" * 16
    key = announcements_key(model)
    loop.run_until_complete(b.announce(announcement(b, model), expiration_s=120))
    poll(loop, lambda: c.get_announcements(model), "C sees B's announcement", lambda got: len(got) == 1)

    attacker = load_or_create_identity(tmp_path / "junk")
    signer = RSASignatureValidator(attacker.private_key)
    stranger = hivemind.DHT(initial_peers=a.visible_maddrs(), start=True, client_mode=True,
                            record_validators=[signer])
    try:
        accepted = 0
        marker = signer.local_public_key
        for first in range(0, JUNK_SUBKEYS, 1000):
            batch = range(first, first + 1000)
            accepted += stranger.run_coroutine(
                functools.partial(_store_junk, key, batch, marker, b"j" * 1000, get_dht_time() + 120)
            )
    finally:
        stranger.shutdown()
    # A second signer, under its own share: its 10-year record is refused, its 2-minute one in the same
    # message is taken (so the refusal is the nodes' answer, not a store that never arrived).
    other = RSASignatureValidator(load_or_create_identity(tmp_path / "ten-years").private_key)
    stranger = hivemind.DHT(initial_peers=a.visible_maddrs(), start=True, client_mode=True,
                            record_validators=[other])
    try:
        now = get_dht_time()
        short, ten_years = (b"blob:%s" % name + other.local_public_key for name in (b"short", b"ten-years"))
        answers = stranger.run_coroutine(functools.partial(
            _store_signed, key, [(short, b"p", now + 120), (ten_years, b"p", now + 10 * 365 * 86400)]))
    finally:
        stranger.shutdown()
    assert answers == {short: True, ten_years: False}
    assert 0 < accepted <= MAX_SUBKEYS_PER_OWNER  # every batch past the first share refused
    held = [node._dht.run_coroutine(functools.partial(_held, key)) for node in nodes]  # noqa: SLF001
    storing = [(n, size) for n, size, _ in held if n]
    assert storing, held
    for n, size, latest in held:
        assert n <= MAX_SUBKEYS_PER_OWNER + 2  # the signer's share, the second signer's, B's announcement
        assert size < 300_000  # was ~34 MB: 20,000 signed 1 kB blobs
        assert latest < get_dht_time() + MAX_RECORD_TTL_S
    print(f"junk flood: {JUNK_SUBKEYS} signed 1 kB subkeys sent; each storing node keeps (subkeys, bytes) "
          f"{storing}")
    assert [x.peer_id for x in loop.run_until_complete(c.get_announcements(model))] == [b.peer_id]
    loop.run_until_complete(b.announce(announcement(b, model, start=0), expiration_s=120))
    found = poll(loop, lambda: c.get_announcements(model), "C sees B's refresh", lambda g: g[0].start == 0)
    assert [x.peer_id for x in found] == [b.peer_id]


def test_identity_persists_per_data_dir(loop, tmp_path):
    async def peer_id_of(data_dir) -> str:
        node = await SwarmDHT.start(data_dir=data_dir)
        try:
            return node.peer_id
        finally:
            await node.shutdown()

    first = loop.run_until_complete(peer_id_of(tmp_path / "one"))
    assert loop.run_until_complete(peer_id_of(tmp_path / "one")) == first
    assert first == load_or_create_identity(tmp_path / "one").peer_id
    assert loop.run_until_complete(peer_id_of(tmp_path / "two")) != first
    assert oct((tmp_path / "one" / "identity.key").stat().st_mode & 0o777) == "0o600"


def test_corrupt_identity_file_is_a_clear_error(tmp_path):
    (tmp_path / "identity.key").write_bytes(b"\x08\x00\x12\x05junk!")
    with pytest.raises(IdentityError):
        load_or_create_identity(tmp_path)


@pytest.mark.parametrize(
    "bootstrap, says",
    [
        ("/ip4/not-an-ip/tcp/1", "bad initial peer address '/ip4/not-an-ip/tcp/1'"),
        (  # nobody listens there: the dial is refused, which is not the node's startup timeout
            "/ip4/127.0.0.1/tcp/9/p2p/QmXnSzCJUSkzKWfNki6cn7BAEHCHDLi3YKf7faWJzqg9Fn",
            "could not reach any initial peer (/ip4/127.0.0.1/tcp/9/p2p/",
        ),
    ],
)
def test_bad_bootstrap_address_is_a_clear_error(loop, tmp_path, bootstrap, says):
    with pytest.raises(DHTError) as err:
        loop.run_until_complete(SwarmDHT.start([bootstrap], data_dir=tmp_path, startup_timeout_s=120))
    assert says in str(err.value)


def test_run_dht_only_prints_maddrs_and_stops_on_sigterm(loop, tmp_path):
    """`swarm dht` as a real subprocess: its printed multiaddr is joinable; SIGTERM exits cleanly."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    code = (
        "import sys; from swarm.dht.node import run_dht_only; run_dht_only([], '127.0.0.1', 0, sys.argv[1])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "dhtonly")],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        maddr = proc.stdout.readline().strip()
        expected_id = load_or_create_identity(tmp_path / "dhtonly").peer_id
        assert maddr.startswith("/ip4/127.0.0.1/tcp/") and maddr.endswith(f"/p2p/{expected_id}")

        async def join_and_ping() -> float:
            node = await SwarmDHT.start([maddr], data_dir=tmp_path / "joiner")
            try:
                return await node.transport.ping(expected_id, [maddr])
            finally:
                await node.shutdown()

        assert loop.run_until_complete(join_and_ping()) > 0.0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_node_killed_with_sigkill_leaves_no_dht_process_or_p2pd_behind(tmp_path):
    """A client or peer process killed with -9 runs no shutdown: hivemind's DHT child and its p2pd
    must still end (swarm/proctree.py), not live on holding ports and the node's identity."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from swarm.proctree import descendants

    repo = Path(__file__).resolve().parents[2]
    code = (
        "import sys; from swarm.dht.node import run_dht_only; run_dht_only([], '127.0.0.1', 0, sys.argv[1])"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "doomed")], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().startswith("/ip4/127.0.0.1/tcp/")  # the node is up
        tree = descendants(proc.pid)
        names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in tree}
        assert "p2pd" in names and "python" in names, names  # the DHT child and its daemon
    finally:
        proc.kill()
        proc.wait()

    def live() -> list[int]:
        out = []
        for pid in tree:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                out.append(pid)
        return out

    try:
        wait_for(live, "every process the killed node started has ended", until=lambda pids: not pids)
    finally:
        for pid in live():
            os.kill(pid, signal.SIGKILL)
