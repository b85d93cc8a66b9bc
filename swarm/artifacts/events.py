"""libtorrent alerts -> the bookkeeping of one fetch (the `examples/client.py` pattern).

`FetchState` collects what a running fetch learns from alerts: bytes per peer, which peers sent
the blocks of each piece (to name the sender when a piece fails its hash), bans, disk errors,
resume data, rename/flush completion. `route_alerts` folds a batch of popped alerts into the
states of the fetches they belong to. Pure bookkeeping: it pops nothing and waits for nothing.
"""

from __future__ import annotations

import errno
import logging
from collections import defaultdict
from dataclasses import dataclass, field

import libtorrent as lt

from swarm.artifacts.plan import tensors_touching_piece
from swarm.artifacts.torrent import Torrent
from swarm.errors import ArtifactError
from swarm.manifest import Manifest

log = logging.getLogger(__name__)
_BLOCK_BYTES = 16 << 10


@dataclass
class FetchState:
    """What one running fetch has learned from alerts.

    Attributes:
        manifest, torrent: the model being fetched.
        bytes_by_peer: bytes of blocks each peer delivered first, keyed "host:port".
        senders: piece index -> peers that sent blocks of it (until it passes or fails).
        failed_pieces: pieces that failed their hash check, in order.
        banned: "host:port" of peers libtorrent banned.
        disk_error: the first storage error, as a user-facing ArtifactError.
        resume_data: bencoded resume data once saved; resume_done: a save finished or failed.
        renamed, flushed: the final rename / cache flush completed.
    """

    manifest: Manifest
    torrent: Torrent
    bytes_by_peer: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    senders: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    failed_pieces: list[int] = field(default_factory=list)
    banned: list[str] = field(default_factory=list)
    disk_error: ArtifactError | None = None
    resume_data: bytes | None = None
    resume_done: bool = False
    renamed: bool = False
    flushed: bool = False


def route_alerts(alerts: list[lt.alert], fetching: dict[str, FetchState]) -> None:
    """Fold alerts into the state of the fetch each belongs to (keyed by v1 info-hash hex).

    Alerts of torrents not being fetched are dropped, except errors, which are logged.
    """
    for a in alerts:
        state = fetching.get(_infohash(a))
        if state is None:
            if isinstance(a, (lt.file_error_alert, lt.torrent_error_alert)):
                log.warning("libtorrent: %s", a.message())
            continue
        _apply(a, state)


def _apply(a: lt.alert, state: FetchState) -> None:
    if isinstance(a, lt.block_finished_alert):
        peer = _peer(a)
        state.bytes_by_peer[peer] += _block_bytes(state.torrent, a.piece_index, a.block_index)
        state.senders[a.piece_index].add(peer)
    elif isinstance(a, lt.piece_finished_alert):
        state.senders.pop(a.piece_index, None)
    elif isinstance(a, lt.hash_failed_alert):
        _on_hash_failed(a, state)
    elif isinstance(a, lt.peer_ban_alert) and _peer(a) not in state.banned:
        state.banned.append(_peer(a))
        log.warning("banned peer %s for sending corrupt data", _peer(a))
    elif isinstance(a, lt.file_error_alert):
        state.disk_error = _disk_error(a)
    elif isinstance(a, lt.save_resume_data_alert):
        state.resume_data, state.resume_done = lt.write_resume_data_buf(a.params), True
    elif isinstance(a, lt.save_resume_data_failed_alert):
        state.resume_done = True
    elif isinstance(a, lt.file_renamed_alert):
        state.renamed = True
    elif isinstance(a, lt.cache_flushed_alert):
        state.flushed = True
    elif isinstance(a, lt.file_rename_failed_alert):
        state.disk_error = ArtifactError(f"cannot rename the fetched file: {a.error.message()}")


def _on_hash_failed(a: lt.hash_failed_alert, state: FetchState) -> None:
    """Log the failed piece, the tensors it touches and the peers that sent its blocks."""
    piece = a.piece_index
    names = tensors_touching_piece(state.manifest, piece, state.torrent.piece_size)
    senders = sorted(state.senders.pop(piece, set()))
    state.failed_pieces.append(piece)
    log.warning(
        "piece %d failed its hash check (touches %s); sent by %s; fetching it again",
        piece,
        ", ".join(names),
        ", ".join(senders) or "unknown peer",
    )


def _block_bytes(torrent: Torrent, piece: int, block: int) -> int:
    """Bytes in block `block` of piece `piece` (16 KiB except at the end of the file)."""
    piece_bytes = min(torrent.piece_size, torrent.file_size - piece * torrent.piece_size)
    return max(0, min(_BLOCK_BYTES, piece_bytes - block * _BLOCK_BYTES))


def _infohash(a: lt.alert) -> str | None:
    handle = getattr(a, "handle", None)
    if handle is None or not handle.is_valid():
        return None
    return str(handle.info_hashes().v1)


def _peer(a: lt.alert) -> str:
    """`host:port` of the alert's peer; an IPv6 host in brackets (`[::1]:6881`)."""
    host, port = a.endpoint if hasattr(a, "endpoint") else a.ip
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _disk_error(a: lt.file_error_alert) -> ArtifactError:
    if a.error.value() == errno.ENOSPC:
        return ArtifactError(
            f"disk full while writing {a.filename()}: free space, then fetch again (resumable)"
        )
    return ArtifactError(f"disk error on {a.filename()}: {a.error.message()}")
