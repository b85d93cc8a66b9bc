"""One libtorrent session: seed whole GGUFs, fetch only a span's pieces, verify every tensor.

`ArtifactSession` owns the libtorrent session and is the only code that pops its alerts (the
pattern of libtorrent's `examples/client.py`); `events.py` folds them into per-fetch bookkeeping
(bytes per peer, pieces that failed their hash and who sent them, bans, disk errors).

Fetch protocol, in order:
1. the torrent is checked against the (already verified) manifest: content name and length;
2. the download goes to `<dest>.part`, resuming from `<dest>.resume` (saved on any interruption)
   or, without it, from libtorrent's re-check of the pieces already in `<dest>.part`;
3. only the pieces behind the requested byte ranges get a non-zero priority;
4. libtorrent rejects pieces whose hash fails, re-requests them and bans the sender (a piece from
   a single peer bans it at once; shared pieces put the senders on parole); we log the piece,
   the tensors it touches and the peers that sent its blocks;
5. once every wanted piece is in, the header and each tensor inside the ranges are hashed and
   compared with the manifest (a piece can span several tensors, so piece hashes do not suffice);
6. only then is `<dest>.part` renamed to `<dest>` (still seeded under the new name).
So `<dest>` never names a partial or unverified span.

Not thread-safe: call one method at a time (from one thread, or via `asyncio.to_thread`). This
module does not discover peers; callers pass `(host, port)` lists (see `records.py`). It stays one
file past the house's ~400 lines because it is one concern: the only code that touches the
libtorrent session and its alerts.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import libtorrent as lt
from tqdm import tqdm

from swarm.artifacts.events import FetchState, route_alerts
from swarm.artifacts.plan import ByteRange, merge_ranges, pieces_bytes, pieces_for_ranges
from swarm.artifacts.torrent import Torrent, parse_torrent, torrent_from_info
from swarm.artifacts.verify import verify_file
from swarm.errors import AddressError, ArtifactError
from swarm.manifest import Manifest
from swarm.netaddr import IPAddress, bt_listen_string, check_port, parse_host

log = logging.getLogger(__name__)

_ALERTS = (
    lt.alert.category_t.error_notification
    | lt.alert.category_t.status_notification
    | lt.alert.category_t.storage_notification
    | lt.alert.category_t.peer_notification
    | lt.alert.category_t.block_progress_notification
    | lt.alert.category_t.piece_progress_notification
)
_POLL_MS = 100
_CHECKING = (lt.torrent_status.states.checking_files, lt.torrent_status.states.checking_resume_data)


@dataclass(frozen=True)
class SessionConfig:
    """Settings of one libtorrent session.

    Attributes:
        listen_host: IPv4 or IPv6 literal to listen on (not a name); a wildcard (`0.0.0.0`, `::`)
            listens on every interface of its family, all on the same port.
        listen_port: TCP port; 0 picks a free one (see `ArtifactSession.port`).
        public_discovery: turn on libtorrent's own DHT, LSD, UPnP and NAT-PMP (off: swarm finds
            seeders through its own DHT and passes them in).
        upload_limit_bytes_per_s, download_limit_bytes_per_s: 0 means unlimited.
    """

    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    public_discovery: bool = False
    upload_limit_bytes_per_s: int = 0
    download_limit_bytes_per_s: int = 0


@dataclass(frozen=True)
class FetchResult:
    """What one successful `fetch` did.

    Attributes:
        path: the verified file (sparse: only the requested ranges hold data).
        wanted_bytes: bytes of the pieces behind the requested ranges.
        downloaded_bytes: payload bytes received in this call (includes rejected pieces).
        bytes_by_peer: bytes of the blocks each peer delivered first, keyed `"host:port"`
            (endgame duplicates are not counted; they are in `downloaded_bytes`).
        failed_pieces: pieces that failed their hash check (then fetched again).
        banned_peers: `"host:port"` of peers libtorrent banned for sending bad data.
        elapsed_s: wall time of the call.
    """

    path: Path
    wanted_bytes: int
    downloaded_bytes: int
    bytes_by_peer: dict[str, int]
    failed_pieces: tuple[int, ...]
    banned_peers: tuple[str, ...]
    elapsed_s: float


class ArtifactSession:
    """A libtorrent session that seeds and fetches GGUF artifacts.

    Other peers are told `addresses`: `(listen_host, port)` for a specific listen host; for a
    wildcard one, the hosts given to `advertise` (the interface or public addresses the caller
    knows, see `swarm.netaddr.advertised_hosts`).

    Args:
        config: listen address, discovery switch and rate limits.
    Raises:
        AddressError: listen_host is not an IP literal, or listen_port is outside 0..65535.
        ArtifactError: the listen socket could not be opened (e.g. the port is in use).
    """

    def __init__(self, config: SessionConfig = SessionConfig()):
        self.config = config
        host = parse_host(config.listen_host, "BitTorrent listen host")
        port = check_port(config.listen_port, "--bt-port")
        if host.is_unspecified and port == 0:
            # libtorrent gives each interface of a wildcard its own free port, and reports only one;
            # a port free on all of them now makes every advertised (address, port) pair true.
            port = _free_port(host)
        self._advertised: tuple[str, ...] = () if host.is_unspecified else (str(host),)
        discovery = config.public_discovery
        self._ses = lt.session(
            {
                "listen_interfaces": bt_listen_string(str(host), port),
                "enable_outgoing_utp": False,  # uTP on loopback: 7-10 MiB/s instead of 235-291 (NOTES)
                "enable_incoming_utp": False,
                "tick_interval": 100,
                "enable_dht": discovery,
                "enable_lsd": discovery,
                "enable_upnp": discovery,
                "enable_natpmp": discovery,
                "allow_multiple_connections_per_ip": True,
                "use_parole_mode": True,
                "upload_rate_limit": config.upload_limit_bytes_per_s,
                "download_rate_limit": config.download_limit_bytes_per_s,
                "alert_mask": _ALERTS,
                "alert_queue_size": 100_000,
            }
        )
        if config.upload_limit_bytes_per_s or config.download_limit_bytes_per_s:
            # libtorrent exempts LAN/loopback peers from rate limits (its local peer class); put
            # every address in the global class so that the configured limits hold for all peers.
            classes = lt.ip_filter()
            everyone = 1 << lt.session.global_peer_class_id
            classes.add_rule("0.0.0.0", "255.255.255.255", everyone)
            classes.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", everyone)
            self._ses.set_peer_class_filter(classes)
        self._fetching: dict[str, FetchState] = {}
        if not self._ses.is_listening() or self.port == 0 or port not in (0, self.port):
            where = bt_listen_string(str(host), port)
            self._ses = None
            raise ArtifactError(
                f"cannot listen for BitTorrent on {where}: not an address of this machine, "
                "or the port is in use"
            )

    @property
    def port(self) -> int:
        """The TCP port this session accepts peers on."""
        return self._ses.listen_port()

    def advertise(self, hosts: Sequence[str]) -> None:
        """Set the hosts other peers are told to connect to (each with `port`).

        Args:
            hosts: IP literals this session is reachable at (an interface's or a NAT's public one).
        Raises:
            AddressError: no hosts, a host that is not an IP literal, or a wildcard.
        """
        checked = tuple(str(parse_host(h, "advertised host")) for h in hosts)
        if not checked or any(parse_host(h).is_unspecified for h in checked):
            raise AddressError(f"no address other peers can reach to advertise (got {list(checked)})")
        self._advertised = checked

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """`(host, port)` pairs other peers connect to, one per advertised host.

        Raises:
            ArtifactError: the session listens on a wildcard and `advertise` was not called.
        """
        if not self._advertised:
            raise ArtifactError(
                f"BitTorrent listens on {self.config.listen_host}: advertise() the addresses peers reach"
            )
        return tuple((h, self.port) for h in self._advertised)

    @property
    def address(self) -> tuple[str, int]:
        """The first of `addresses`."""
        return self.addresses[0]

    def close(self) -> None:
        """Stop every torrent and the session's network thread. Idempotent."""
        if self._ses is not None:
            for handle in self._ses.get_torrents():
                self._ses.remove_torrent(handle)
            self._ses = None

    def __enter__(self) -> "ArtifactSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def seed(self, path: str | Path, torrent_bytes: bytes, *, timeout_s: float = 120.0) -> str:
        """Check a complete local file against the torrent, then serve it until `close`.

        Args:
            path: the whole GGUF (any name; the torrent's content name is mapped onto it).
            torrent_bytes: from `torrent.make_torrent(...).data`.
            timeout_s: bound on libtorrent's check of the file.
        Returns:
            the torrent's infohash (hex).
        Raises:
            ArtifactError: bad torrent, missing file, or a file that does not match every piece.
        """
        torrent = parse_torrent(torrent_bytes)
        path = Path(path).resolve()
        if not path.is_file() or path.stat().st_size != torrent.file_size:
            raise ArtifactError(f"cannot seed {path}: missing or not {torrent.file_size} bytes")
        handle = self._ses.add_torrent(self._params(torrent, path))
        deadline = time.monotonic() + timeout_s
        while (st := handle.status()).state in _CHECKING:
            if time.monotonic() > deadline:
                self._ses.remove_torrent(handle)
                raise ArtifactError(f"checking {path} took over {timeout_s} s")
            self._ses.wait_for_alert(_POLL_MS)
            self._pump()
        if st.errc.value() != 0:
            self._ses.remove_torrent(handle)
            raise ArtifactError(f"cannot seed {path}: {st.errc.message()}")
        if not st.is_seeding:
            self._ses.remove_torrent(handle)
            raise ArtifactError(
                f"cannot seed {path}: only {st.num_pieces} of "
                f"{torrent.info.num_pieces()} pieces match the torrent"
            )
        log.info("seeding %s as %s on port %d", path, torrent.infohash, self.port)
        return torrent.infohash

    def fetch(
        self,
        torrent_bytes: bytes,
        manifest: Manifest,
        dest_path: str | Path,
        byte_ranges: list[ByteRange],
        peers: list[tuple[str, int]],
        *,
        timeout_s: float = 600.0,
        stall_timeout_s: float = 30.0,
        progress: bool = True,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> FetchResult:
        """Download the pieces behind `byte_ranges` into a sparse `dest_path`, verified.

        Args:
            torrent_bytes: the model's torrent (from a seeder record).
            manifest: the model's manifest, already verified against its model_id.
            dest_path: where the (sparse) GGUF ends up; `<dest>.part` and `<dest>.resume` are
                used meanwhile and survive an interruption, so a later call resumes.
            byte_ranges: (offset, length) ranges to fetch, e.g. `plan.span_byte_ranges(...)`.
            peers: `(host, port)` of seeders to connect to.
            timeout_s: bound on the whole call.
            stall_timeout_s: give up when no payload byte arrives for this long.
            progress: show a tqdm bar on stderr (bytes, rate, ETA).
            on_progress: called after each poll of the alerts (about every 100 ms, sooner when alerts
                arrive) with (bytes of wanted pieces verified, bytes wanted); an exception it
                raises interrupts the fetch the way Ctrl-C does, keeping the progress for the
                next call, and propagates.
        Returns:
            FetchResult; the file is seeded by this session until `close`.
        Raises:
            ArtifactError: bad torrent or ranges, no seeder sent data in time, timeout, disk
                full or other write error, or a tensor/header hash that does not match the
                manifest. Progress so far is kept for the next call.
        """
        t0 = time.monotonic()
        torrent = parse_torrent(torrent_bytes, manifest)
        ranges = merge_ranges(byte_ranges)
        wanted = set(pieces_for_ranges(ranges, torrent.piece_size, torrent.file_size))
        dest = Path(dest_path).resolve()
        part, resume_path = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".resume")
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._remove_existing_key(torrent.info.info_hashes().v1)  # an earlier fetch of this model
        if dest.exists() and not part.exists():
            os.replace(dest, part)  # re-verify an earlier result without exposing it meanwhile
        atp = self._params(torrent, part, resume_path)
        atp.piece_priorities = [4 if i in wanted else 0 for i in range(torrent.info.num_pieces())]
        handle = self._ses.add_torrent(atp)
        state = self._fetching[torrent.infohash] = FetchState(manifest, torrent)
        try:
            self._download(
                handle, state, peers, resume_path, t0 + timeout_s, stall_timeout_s, progress, on_progress
            )
            try:
                verify_file(part, manifest, ranges)
                handle.rename_file(0, dest.name)  # libtorrent keeps seeding it under the final name
                self._await(lambda: state.renamed, state, f"renaming the fetched file to {dest.name}")
            except BaseException:
                # Piece hashes passed, so the torrent and the manifest disagree (or stale resume
                # data claimed pieces): drop the resume data so the next call re-checks every piece.
                self._ses.remove_torrent(handle)
                resume_path.unlink(missing_ok=True)
                raise
        finally:
            del self._fetching[torrent.infohash]
        resume_path.unlink(missing_ok=True)
        st = handle.status()
        log.info(
            "fetched %d pieces of %s into %s: %d bytes from %s",
            len(wanted),
            torrent.name[:16],
            dest,
            st.total_payload_download,
            dict(state.bytes_by_peer),
        )
        return FetchResult(
            path=dest,
            wanted_bytes=pieces_bytes(wanted, torrent.piece_size, torrent.file_size),
            downloaded_bytes=st.total_payload_download,
            bytes_by_peer=dict(state.bytes_by_peer),
            failed_pieces=tuple(state.failed_pieces),
            banned_peers=tuple(state.banned),
            elapsed_s=time.monotonic() - t0,
        )

    def fetch_metadata(
        self, infohash: str, manifest: Manifest, peers: list[tuple[str, int]], *, timeout_s: float = 30.0
    ) -> bytes:
        """Get a model's torrent from its peers by v1 info-hash (BitTorrent metadata exchange).

        Lets a seeder record carry only the info-hash; libtorrent checks the received info dict
        against the hash, and this checks its content name and length against the manifest.

        Args:
            infohash: 40 hex chars (`Torrent.infohash`).
            manifest: the model's verified manifest.
            peers: `(host, port)` of peers that have the torrent.
            timeout_s: bound on the call.
        Returns:
            torrent bytes (the info dict only) for `fetch`.
        Raises:
            ArtifactError: malformed info-hash or peer address, no peer sent the metadata in time,
                or metadata describing another model.
        """
        if not re.fullmatch(r"[0-9a-f]{40}", infohash):
            raise ArtifactError(f"bad info-hash {infohash[:48]!r}: expected 40 hex chars")
        key = lt.sha1_hash(bytes.fromhex(infohash))
        handle = self._ses.find_torrent(key)
        if handle.is_valid():  # seeded or fetched by this session already
            return torrent_from_info(bytes(handle.torrent_file().info_section()), manifest).data
        atp = lt.add_torrent_params()
        atp.info_hashes = lt.info_hash_t(key)
        atp.save_path = tempfile.gettempdir()  # nothing is written: no piece is wanted
        atp.flags = (
            lt.torrent_flags.default_dont_download
            | lt.torrent_flags.upload_mode
            | lt.torrent_flags.disable_dht
            | lt.torrent_flags.disable_lsd
        )
        handle = self._ses.add_torrent(atp)
        try:
            _connect(handle, peers)
            self._await(
                lambda: handle.status().has_metadata,
                None,
                f"getting the metadata of {infohash} from {len(peers)} peer(s)",
                timeout_s=timeout_s,
            )
            info = bytes(handle.torrent_file().info_section())
        finally:
            self._remove_existing_key(key)
        return torrent_from_info(info, manifest).data

    def _download(
        self,
        handle: lt.torrent_handle,
        state: FetchState,
        peers: list[tuple[str, int]],
        resume_path: Path,
        deadline: float,
        stall_timeout_s: float,
        progress: bool,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        """Connect the peers and wait until every wanted piece is on disk.

        On any failure the resume data is saved and the torrent removed from the session.
        """
        try:
            _connect(handle, peers)
            self._wait_for_pieces(handle, state, deadline, stall_timeout_s, progress, on_progress)
            # A piece counts as had once its hash passes, possibly before it reaches the disk.
            handle.flush_cache()
            self._await(lambda: state.flushed, state, "flushing the fetched pieces to disk")
        except BaseException:
            self._save_resume(handle, state, resume_path)
            self._ses.remove_torrent(handle)
            raise

    def _remove_existing_key(self, key: lt.sha1_hash) -> None:
        """Drop this session's torrent with v1 info-hash `key`, if any, and wait until it is gone."""
        handle = self._ses.find_torrent(key)
        if handle.is_valid():
            self._ses.remove_torrent(handle)
            self._await(lambda: not self._ses.find_torrent(key).is_valid(), None, f"removing torrent {key}")

    def _params(self, torrent: Torrent, path: Path, resume_path: Path | None = None) -> lt.add_torrent_params:
        """add_torrent_params mapping the torrent's content-named file onto `path`."""
        atp = lt.add_torrent_params()
        if resume_path is not None and resume_path.exists():
            try:
                atp = lt.read_resume_data(resume_path.read_bytes())
            except RuntimeError as e:
                log.warning("ignoring unreadable resume data %s: %s", resume_path, e)
                atp = lt.add_torrent_params()
        atp.ti = torrent.info
        atp.save_path = str(path.parent)
        atp.renamed_files = {0: path.name}
        atp.flags &= ~(lt.torrent_flags.paused | lt.torrent_flags.auto_managed)
        atp.flags |= lt.torrent_flags.disable_dht | lt.torrent_flags.disable_lsd
        return atp

    def _wait_for_pieces(
        self,
        handle: lt.torrent_handle,
        state: FetchState,
        deadline: float,
        stall_timeout_s: float,
        progress: bool,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        """Pump alerts until every wanted piece is in; raise on disk error, stall or deadline."""
        torrent = state.torrent
        bar = tqdm(
            total=0,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            disable=not progress,
            desc=f"fetch {torrent.name[:12]}",
            leave=False,
        )
        last_done, last_progress = -1, time.monotonic()
        try:
            while True:
                self._pump()
                if state.disk_error is not None:
                    raise state.disk_error
                st = handle.status()
                if st.errc.value() != 0:
                    raise ArtifactError(f"torrent {torrent.name[:16]}... failed: {st.errc.message()}")
                checking = st.state in _CHECKING
                bar.total = st.total_wanted
                bar.n = st.total_wanted_done
                bar.refresh()
                if on_progress is not None and not checking:
                    on_progress(st.total_wanted_done, st.total_wanted)
                if not checking and st.total_wanted_done >= st.total_wanted:
                    return
                now = time.monotonic()
                if checking or st.total_wanted_done != last_done:
                    last_done, last_progress = st.total_wanted_done, now
                elif now - last_progress > stall_timeout_s:
                    raise ArtifactError(
                        f"no seeder sent data for {stall_timeout_s:.0f} s ({st.num_peers} connected, "
                        f"{st.total_wanted_done} of {st.total_wanted} bytes)"
                    )
                if now > deadline:
                    raise ArtifactError(
                        f"fetch of {torrent.name[:16]}... timed out with "
                        f"{st.total_wanted_done} of {st.total_wanted} bytes (resumable)"
                    )
                self._ses.wait_for_alert(_POLL_MS)
        finally:
            bar.close()

    def _pump(self) -> None:
        """Pop every pending alert and fold it into the state of the fetch it belongs to."""
        route_alerts(self._ses.pop_alerts(), self._fetching)

    def _save_resume(self, handle: lt.torrent_handle, state: FetchState, resume_path: Path) -> None:
        """Best effort: write libtorrent's resume data (pieces had) for an interrupted fetch."""
        if not handle.is_valid():
            return
        handle.save_resume_data(lt.torrent_handle.save_info_dict | lt.torrent_handle.flush_disk_cache)
        tmp = resume_path.with_name(resume_path.name + ".tmp")
        try:
            self._await(lambda: state.resume_done, state, "saving resume data", check_disk=False)
            if state.resume_data is None:
                raise OSError("libtorrent could not produce it")
            tmp.write_bytes(state.resume_data)
            os.replace(tmp, resume_path)
        except (OSError, ArtifactError) as e:
            tmp.unlink(missing_ok=True)
            log.warning("no resume data saved at %s (%s); the next fetch re-checks the file", resume_path, e)

    def _await(
        self, done, state: FetchState | None, what: str, *, timeout_s: float = 30.0, check_disk: bool = True
    ) -> None:
        """Pump alerts until `done()` is true.

        Raises:
            ArtifactError: a disk error was reported (when `check_disk`), or `timeout_s` passed.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self._pump()
            if done():
                return
            if check_disk and state is not None and state.disk_error is not None:
                raise state.disk_error
            if time.monotonic() > deadline:
                raise ArtifactError(f"{what} timed out after {timeout_s:.0f} s")
            self._ses.wait_for_alert(_POLL_MS)


def _free_port(host: IPAddress) -> int:
    """A TCP port free on every interface of `host`'s family right now (the kernel's choice)."""
    family = socket.AF_INET6 if host.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(host), 0))
            return probe.getsockname()[1]
    except OSError as e:
        raise ArtifactError(f"cannot find a free BitTorrent port on {host}: {e}") from e


def _connect(handle: lt.torrent_handle, peers: list[tuple[str, int]]) -> None:
    """Ask libtorrent to connect to each `(host, port)`; raise ArtifactError on a malformed one."""
    for host, port in peers:
        try:
            handle.connect_peer((host, int(port)))
        except (RuntimeError, ValueError, TypeError) as e:
            raise ArtifactError(f"bad peer address {host!r}:{port!r}: {e}") from e
