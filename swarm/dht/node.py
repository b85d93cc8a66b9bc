"""The one place swarm touches hivemind's DHT: start/stop a node, announce, withdraw, read, blobs.

`SwarmDHT` runs a hivemind DHT (its own process and p2pd) with this peer's persistent identity, signs
every record it writes with that identity (hivemind's RSASignatureValidator: only the key's owner can
overwrite its subkey) and checks swarm records at store and read time (swarm.dht.validation); its
storage bounds what it keeps per key (swarm.dht.storage). It writes and reads expirations in swarm time:
its clock plus the offset measured against other nodes (`clock_offset_s`, swarm.dht.clock), so a wrong
clock neither gets its records refused nor keeps a dead peer listed. The rest of swarm sees
`async def` methods and plain swarm types. It also hands out the framed stream transport
(swarm.p2p.SwarmP2P) on the same daemon, so announcements and streams share one peer id.

This module makes no routing decisions and does not interpret blobs. It stays one file past the
house's ~400 lines: it is the one place that calls hivemind's DHT (start, store with its expiration
ordering and retries, read), which the rest of swarm must not see.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from typing import Awaitable, Callable, Optional, Sequence

import hivemind
import tenacity
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time
from hivemind.utils.multiaddr import Multiaddr

if "HIVEMIND_LOGLEVEL" not in os.environ:
    # hivemind logs every join at INFO; in `swarm chat` or a Python session that would mix with answers.
    logging.getLogger("hivemind").setLevel(logging.WARNING)

from swarm.dht import storage
from swarm.dht.clock import SKEW_WARN_S, skew_against
from swarm.dht.identity import Identity, load_or_create_identity
from swarm.dht.records import (
    ANNOUNCE_SUBKEY_TAG,
    BLOB_SUBKEY_TAG,
    MAX_BLOB_BYTES,
    MAX_BLOB_NAME_BYTES,
    Announcement,
    announcements_key,
    encode_announcement,
)
from swarm.dht.validation import SwarmRecordValidator, blob_name, bound_entries, check_announcement
from swarm.dht.validation import owner_public_key
from swarm.errors import ProtocolError, SwarmError
from swarm.limits import MAX_RECORD_TTL_S
from swarm.netaddr import NetConfig, check_net_config, reachable_first, tcp_multiaddr
from swarm.p2p import SwarmP2P
from swarm.reach import DialBackResponder
from swarm.peerid import peer_id_of_public_key
from swarm.proctree import die_with_parent

logger = logging.getLogger(__name__)

TOMBSTONE_TTL_S = 10.0
"""A withdrawal record lives at least this long (seconds) and always past the announcement it replaces."""
_EXPIRATION_STEP_S = 0.001
"""hivemind keeps the record with the later expiration, so each rewrite of a subkey must expire later."""
STORE_ATTEMPTS = 6
"""A store no DHT node accepted is tried this often in all, 0.5, 1, 2, 2 and 2 s apart: a node that
has just (re)joined may not know any other node yet (seen as a peer failing to start)."""


class _BoundDHT(hivemind.DHT):
    """hivemind's DHT child process, bound to the life of the process that started it: a parent
    killed with SIGKILL takes the DHT child and its p2pd along (swarm/proctree.py)."""

    def __init__(self, *args, **kwargs):
        self._parent_pid = os.getpid()
        super().__init__(*args, **kwargs)

    def run(self) -> None:
        die_with_parent(self._parent_pid)
        super().run()


class DHTError(SwarmError):
    """The DHT node could not start (bad bootstrap address, identity in use, p2pd failure)."""


@dataclasses.dataclass(frozen=True)
class Blob:
    """A signed byte string stored under a DHT key by one peer.

    Attributes:
        name: the subkey name the writer chose.
        owner_peer_id: base58 peer id of the key that signed it.
        value: the bytes, at most records.MAX_BLOB_BYTES.
        expires_at: DHT time (s) when it expires.
    """

    name: str
    owner_peer_id: str
    value: bytes
    expires_at: float


class SwarmDHT:
    """A running DHT node with this peer's identity. Build with `await SwarmDHT.start(...)`."""

    def __init__(
        self,
        dht: hivemind.DHT,
        identity: Identity,
        signer: RSASignatureValidator,
        transport: SwarmP2P,
        maddrs: list[str],
    ):
        self._dht = dht
        self.identity = identity
        self._owner_marker = signer.local_public_key
        self.transport = transport
        self._maddrs = maddrs
        self._last_expiration: dict[tuple[str, bytes], float] = {}  # (key, subkey) -> newest own record
        self._dropped_spans: set[tuple[str, int, int, int]] = set()  # logged once each
        self.clock_offset_s = 0.0
        """Swarm time minus this machine's clock, seconds (set from clock probes; 0 until measured)."""
        self.clock_peers = 0
        """How many other nodes `clock_offset_s` was measured against (0: not measured)."""

    @classmethod
    async def start(
        cls,
        initial_peers: Sequence[str] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        data_dir: Optional[str | os.PathLike] = None,
        client_mode: bool = False,
        startup_timeout_s: float = 30.0,
        public_address: Optional[str] = None,
    ) -> "SwarmDHT":
        """Start a DHT node (own process + p2pd) and join the swarm through `initial_peers`.

        Args:
            initial_peers: multiaddrs with /p2p/<id> of live peers; empty starts a new swarm.
            host, port: TCP listen address, an IPv4 or IPv6 literal (a wildcard listens on every
                interface and advertises each interface address); port 0 picks a free port.
            data_dir: where the identity lives (swarm.dht.identity.resolve_data_dir when None).
            client_mode: dial out only, store nothing for others (behind NAT, or a pure client).
            startup_timeout_s: give up after this many seconds.
            public_address: the only address advertised to others (a NAT's public IP); needs port != 0.
        Raises:
            AddressError: host, port or public_address unusable (checked before anything starts).
            IdentityError: the data directory or its key is unusable.
            DHTError: the node did not start (malformed bootstrap address, identity already online, ...).
        """
        net = check_net_config(NetConfig(host=host, port=port, public_address=public_address))
        for addr in initial_peers:
            check_peer_maddr(addr)
        identity = load_or_create_identity(data_dir)
        signer = RSASignatureValidator(identity.private_key)
        announce = None if net.public_address is None else [tcp_multiaddr(net.public_address, net.port)]
        dht = _BoundDHT(
            initial_peers=list(initial_peers),
            start=False,
            client_mode=client_mode,
            host_maddrs=[tcp_multiaddr(net.host, net.port)],
            announce_maddrs=announce,
            identity_path=str(identity.identity_path),
            record_validators=[signer, SwarmRecordValidator()],
            startup_timeout=startup_timeout_s,
            nat_port_map=False,  # swarm/portmap.py maps this peer's ports: one component per router
        )
        try:
            dht.run_in_background(await_ready=False)
            await asyncio.to_thread(dht.wait_until_ready, startup_timeout_s)
            maddrs = [str(m) for m in await asyncio.to_thread(dht.get_visible_maddrs)]
            maddrs = reachable_first(maddrs)
            transport = await SwarmP2P.create(await dht.replicate_p2p())
            await dht.run_coroutine(storage.install, return_future=True)
        except Exception as e:  # hivemind raises P2PDaemonError, ValueError, TimeoutError, ... here
            if dht.is_alive():
                await asyncio.to_thread(dht.shutdown)
            if initial_peers and "bootstrap" in str(e):
                raise DHTError(f"could not reach any initial peer ({', '.join(initial_peers)})") from e
            raise DHTError(f"DHT node did not start: {_first_line(e)}") from e
        return cls(dht, identity, signer, transport, maddrs)

    def now(self) -> float:
        """Swarm time, seconds: DHT time (this machine's wall clock) plus `clock_offset_s`."""
        return get_dht_time() + self.clock_offset_s

    def clock_words(self) -> str:
        """This node's clock against the swarm's, in words ("120 s behind the swarm's median of 3
        nodes"); empty when not measured or within clock.SKEW_WARN_S."""
        if not self.clock_peers or abs(self.clock_offset_s) <= SKEW_WARN_S:
            return ""
        median = f"the swarm's median of {self.clock_peers} nodes"
        return f"this machine's clock is {skew_against(-self.clock_offset_s, median)}"

    @property
    def peer_id(self) -> str:
        """This node's base58 libp2p peer id (stable for a data directory)."""
        return self.identity.peer_id

    def visible_maddrs(self) -> list[str]:
        """Multiaddrs other peers can dial, each ending in /p2p/<peer_id>; for a wildcard host one per
        interface address, loopback ones last; with a public address, only it."""
        return list(self._maddrs)

    async def announce(self, ann: Announcement, expiration_s: float) -> Announcement:
        """Publish (or refresh) this peer's span for `ann.model_id`, signed, valid for `expiration_s`.

        Args:
            ann: the offer; its peer_id must be this node's; its expires_at is replaced.
            expiration_s: lifetime in seconds from now, in (0, limits.MAX_RECORD_TTL_S].
        Returns:
            the announcement as stored: expires_at is swarm time now + expiration_s, or just after this
            peer's previous record for the model if that expires later (e.g. a recent withdrawal).
        Raises:
            ProtocolError: the announcement violates the record schema, names another peer id, or
                expiration_s is out of range.
            DHTError: no DHT node accepted the record.
        """
        if ann.peer_id != self.peer_id:
            raise ProtocolError(f"announcement names peer {ann.peer_id}, this node is {self.peer_id}")
        _check_expiration(expiration_s)
        stored_at = await self._store_own_span(
            ann.model_id,
            self.now() + expiration_s,
            lambda expires_at: encode_announcement(dataclasses.replace(ann, expires_at=expires_at)),
        )
        return dataclasses.replace(ann, expires_at=stored_at)

    async def withdraw(self, model_id: str) -> None:
        """Replace this peer's announcement for `model_id` by a signed tombstone, so that readers stop
        seeing it at once (it would otherwise live until its expiration).

        Raises:
            DHTError: no DHT node accepted the tombstone.
        """
        await self._store_own_span(model_id, self.now() + TOMBSTONE_TTL_S, lambda expires_at: None)

    async def _store_own_span(self, model_id: str, wanted_expiration: float, make_value) -> float:
        """Write this peer's announcement subkey with an expiration later than any record it wrote there
        before (hivemind keeps the latest-expiring one). If the DHT holds a later one this process does
        not know of (a previous run), read its expiration and write once more just after it.

        Returns:
            the expiration (DHT time, s) actually stored.
        """
        key, subkey = announcements_key(model_id), ANNOUNCE_SUBKEY_TAG + self._owner_marker
        return await self._store_latest(key, subkey, wanted_expiration, make_value)

    @tenacity.retry(
        retry=tenacity.retry_if_exception_type(DHTError),
        stop=tenacity.stop_after_attempt(STORE_ATTEMPTS),
        wait=tenacity.wait_exponential(multiplier=0.5, max=2.0),
        reraise=True,
    )
    async def _store_latest(self, key: str, subkey: bytes, wanted_expiration: float, make_value) -> float:
        """Store `make_value(expires_at)` under (key, subkey), outliving every earlier record there,
        a previous run's included (see `_store_own_span`). Returns the expiration stored.

        Raises:
            DHTError: no DHT node accepted it in STORE_ATTEMPTS tries."""
        memo = (key, subkey)
        expires_at = max(wanted_expiration, self._last_expiration.get(memo, 0.0) + _EXPIRATION_STEP_S)
        try:
            await self._store(key, subkey, make_value(expires_at), expires_at)
        except DHTError:
            newer = [
                exp for sub, _, exp in await self._get_entries(key) if sub == subkey and exp >= expires_at
            ]
            if not newer:
                raise
            expires_at = max(newer) + _EXPIRATION_STEP_S
            await self._store(key, subkey, make_value(expires_at), expires_at)
        self._last_expiration[memo] = expires_at
        return expires_at

    async def get_announcements(self, model_id: str, n_layers: Optional[int] = None) -> list[Announcement]:
        """Latest live announcements for `model_id`, one per peer, sorted by (start, peer_id).

        Every returned record was signed by the key of its peer_id, matches the schema, names this
        model and has not expired in swarm time; anything else (forged, malformed, tombstones) is
        dropped. With `n_layers` (the model's layer count, when the reader knows it), a span ending
        past it is dropped too, with a log line (once per peer and span).
        """
        now = self.now()
        found = []
        for subkey, value, expires_at in await self._get_entries(announcements_key(model_id)):
            ann = check_announcement(subkey, value) if value is not None else None
            if ann is None or ann.model_id != model_id or min(ann.expires_at, expires_at) <= now:
                continue
            if n_layers is not None and ann.end > n_layers:
                seen = (ann.peer_id, ann.start, ann.end, n_layers)
                if seen not in self._dropped_spans:
                    self._dropped_spans.add(seen)
                    logger.warning("ignored %s…'s announcement of layers %d:%d: the model has %d layers",
                                   ann.peer_id[:12], ann.start, ann.end, n_layers)
                continue
            found.append(ann)
        return sorted(found, key=lambda a: (a.start, a.peer_id))

    async def store_blob(self, key: str, subkey: str, value: Optional[bytes], expiration_s: float) -> None:
        """Store a signed byte string under (key, this peer, subkey), e.g. a manifest or an infohash.

        Args:
            key: any DHT key string, e.g. f"swarm/{model_id}/torrent".
            subkey: the writer's name for it, at most records.MAX_BLOB_NAME_BYTES UTF-8 bytes.
            value: at most records.MAX_BLOB_BYTES bytes; None erases an earlier blob.
            expiration_s: lifetime in seconds from now, in (0, limits.MAX_RECORD_TTL_S].
        Raises:
            ProtocolError: the name or value is too large, or expiration_s is out of range.
            DHTError: no DHT node accepted the record.
        """
        name = subkey.encode("utf-8")
        if len(name) > MAX_BLOB_NAME_BYTES or b"[" in name:
            raise ProtocolError(f"blob name {subkey!r} is too long or contains '['")
        if value is not None and (not isinstance(value, bytes) or len(value) > MAX_BLOB_BYTES):
            raise ProtocolError(f"blob value must be bytes of at most {MAX_BLOB_BYTES} bytes")
        _check_expiration(expiration_s)
        # A restarted peer (same identity) may find its previous run's blob expiring later than the new
        # one; hivemind keeps the later one, so write just after it.
        await self._store_latest(
            key, BLOB_SUBKEY_TAG + name + self._owner_marker, self.now() + expiration_s, lambda _: value
        )

    async def get_blob(self, key: str) -> list[Blob]:
        """All live, signed blobs under `key`, sorted by (name, owner_peer_id); erased ones are omitted."""
        now = self.now()
        found = []
        for subkey, value, expires_at in await self._get_entries(key):
            name, owner = blob_name(subkey), owner_public_key(subkey)
            if name is None or owner is None or not isinstance(value, bytes) or expires_at <= now:
                continue
            if len(value) <= MAX_BLOB_BYTES:
                found.append(Blob(name, peer_id_of_public_key(owner), value, expires_at))
        return sorted(found, key=lambda b: (b.name, b.owner_peer_id))

    async def shutdown(self) -> None:
        """Stop serving streams, leave the DHT and stop its process and p2pd (idempotent)."""
        await self.transport.close()
        await asyncio.to_thread(self._dht.shutdown)

    async def _store(self, key: str, subkey: bytes, value, expires_at: float) -> None:
        # A clock ahead of the swarm's makes this node's own storage find swarm-time records expired.
        ahead = self.clock_offset_s < -SKEW_WARN_S
        ok = await self._dht.store(
            key, value, expiration_time=expires_at, subkey=subkey, exclude_self=ahead, return_future=True
        )
        if not ok:
            clock = self.clock_words()
            raise DHTError(
                f"no DHT node accepted the record under {key!r}: "
                + (f"refused: {clock}, so its expirations look wrong to others; set the clock (NTP)"
                   if clock else "none was reachable (at start: are the initial peers up and reachable?), "
                   "or the DHT holds a newer record")
            )

    async def _get_entries(self, key: str) -> list[tuple[bytes, object, float]]:
        """(subkey, value, expiration) of the subkeys under `key`, newest copy found in the DHT, at most
        MAX_SUBKEYS_PER_OWNER per signing key and MAX_SUBKEYS_PER_KEY in all (latest expiring first).

        A record expiring more than MAX_RECORD_TTL_S + clock.SKEW_WARN_S past swarm time is dropped
        here, one record at a time (honest nodes refuse to store it: swarm.dht.storage)."""
        result = await self._dht.get(key, latest=True, return_future=True)
        if result is None or not isinstance(result.value, dict):
            return []
        latest = self.now() + MAX_RECORD_TTL_S + SKEW_WARN_S
        entries = [
            (subkey, item.value, item.expiration_time)
            for subkey, item in result.value.items()
            if isinstance(subkey, bytes) and item.expiration_time <= latest
        ]
        kept = bound_entries(entries)
        if len(kept) < len(entries):
            logger.warning("kept %d of %d records under %r (per-key bounds)", len(kept), len(entries), key)
        return kept


def _check_expiration(expiration_s: float) -> None:
    """Raises ProtocolError unless 0 < expiration_s <= MAX_RECORD_TTL_S (other nodes refuse more)."""
    if not 0 < expiration_s <= MAX_RECORD_TTL_S:
        raise ProtocolError(f"expiration_s must be in (0, {MAX_RECORD_TTL_S:.0f}] s, got {expiration_s}")


def check_peer_maddr(addr: str) -> None:
    """Refuse a malformed bootstrap address before any daemon starts.

    Raises:
        DHTError: not a multiaddr, or without a valid `/p2p/<peer id>` part.
    """
    try:
        maddr = Multiaddr(addr)
        PeerID.from_base58(maddr.value_for_protocol("p2p"))
    except Exception as e:  # noqa: BLE001 - multiaddr and base58 raise assorted types for bad text
        raise DHTError(
            f"bad initial peer address {addr!r:.200}: expected /ip4/HOST/tcp/PORT/p2p/PEER_ID or "
            f"/ip6/HOST/tcp/PORT/p2p/PEER_ID ({_first_line(e)})"
        ) from e


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def run_dht_only(
    initial_peers: Sequence[str],
    host: str,
    port: int,
    data_dir: Optional[str | os.PathLike],
    public_address: Optional[str] = None,
    service: Optional[Callable[["SwarmDHT"], Awaitable[Callable[[], Awaitable[None]]]]] = None,
) -> None:
    """`swarm dht`: run a DHT-only peer (and `service(node)`, the relay, which returns its stop), print
    its multiaddrs one per line on stdout, block until SIGINT/SIGTERM, then shut down cleanly.

    Raises:
        AddressError, IdentityError, DHTError: as SwarmDHT.start.
    """

    async def main() -> None:
        node = await SwarmDHT.start(
            initial_peers, host=host, port=port, data_dir=data_dir, public_address=public_address
        )
        await DialBackResponder().serve(node.transport)  # public DHT peers are whom NAT'd peers ask
        stop_service = None if service is None else await service(node)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            for maddr in node.visible_maddrs():
                print(maddr, file=sys.stdout)
            sys.stdout.flush()
            await stop.wait()
        finally:
            await (stop_service or node.shutdown)()
            await node.shutdown()

    asyncio.run(main())
