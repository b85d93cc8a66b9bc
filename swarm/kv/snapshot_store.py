"""A peer's bounded store of prefix KV snapshots: memory first, then disk, least recently used out.

Two byte budgets, never exceeded: `memory_bytes` of snapshot KV in RAM and `disk_bytes` in files
under `disk_dir` (0 disables the disk tier). A new snapshot goes to memory; the least recently used
ones move to disk when memory is over budget, and leave the disk when it is. A snapshot bigger than
a tier's whole budget skips that tier. A disk that cannot take a file (full, read-only) is logged
as a warning and the snapshot is dropped: the peer keeps serving, it only remembers less.

Every block hash of every stored snapshot is indexed, so `restorable` answers which offered prefix
lengths some snapshot can serve (import, then truncate to the length).

The disk tier is a cache of this run only: files are named by the prefix hash, their metadata
stays in memory, their sha256 is checked on read, and a restart starts empty.

This module does not: talk to llama.cpp, the network or the DHT.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from swarm.kv.snapshot import Snapshot

logger = logging.getLogger(__name__)


@dataclass
class _Entry:
    snap: Snapshot  # kv is b"" while on disk
    nbytes: int
    sha256: bytes
    path: Path | None = None


class SnapshotStore:
    """LRU snapshots of one span, keyed by their whole-prompt prefix hash.

    Args:
        memory_bytes: budget for KV bytes in memory, >= 0.
        disk_dir: directory for the disk tier (created on first use), or None.
        disk_bytes: budget for KV bytes on disk, >= 0 (0: no disk tier).
    """

    def __init__(self, memory_bytes: int, disk_dir: Path | None = None, disk_bytes: int = 0):
        if memory_bytes < 0 or disk_bytes < 0:
            raise ValueError("snapshot budgets must be >= 0")
        self.memory_bytes, self.disk_bytes = int(memory_bytes), int(disk_bytes) if disk_dir else 0
        self._dir = disk_dir
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        self._index: dict[bytes, tuple[bytes, int]] = {}  # block hash -> (snapshot hash, n_tokens)
        self.memory_used = 0
        self.disk_used = 0
        self.warnings: list[str] = []

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, prefix_hash: bytes) -> bool:
        return prefix_hash in self._entries

    def put(self, snap: Snapshot) -> bool:
        """Keep `snap` (replacing one of the same key); returns False when it fits no tier."""
        h = snap.key.prefix_hash
        if h in self._entries:
            self._drop(h)
        if snap.nbytes > max(self.memory_bytes, self.disk_bytes):
            return False
        entry = _Entry(snap, snap.nbytes, hashlib.sha256(snap.kv).digest())
        self._entries[h] = entry
        for n, bh in snap.blocks:
            self._index[bh] = (h, n)
        self._index[h] = (h, snap.n_tokens)
        if snap.nbytes <= self.memory_bytes:
            self.memory_used += snap.nbytes
        elif not self._to_disk(h, entry):
            return False
        self._enforce()
        return h in self._entries

    def restorable(self, offers: Sequence[tuple[int, bytes]]) -> dict[int, bytes]:
        """Offered lengths some stored snapshot covers: n_tokens -> the snapshot's hash."""
        out = {}
        for n, bh in offers:
            hit = self._index.get(bh)
            if hit is not None and hit[1] == n and hit[0] in self._entries:
                out[n] = hit[0]
        return out

    def get(self, prefix_hash: bytes) -> Snapshot | None:
        """The snapshot with its KV bytes (read back from disk if there), marked recently used."""
        entry = self._entries.get(prefix_hash)
        if entry is None:
            return None
        self._entries.move_to_end(prefix_hash)
        if entry.path is None:
            return entry.snap
        try:
            kv = entry.path.read_bytes()
        except OSError as e:
            self._warn(f"cannot read snapshot {entry.path}: {e}")
            self._drop(prefix_hash)
            return None
        if hashlib.sha256(kv).digest() != entry.sha256:
            self._warn(f"snapshot file {entry.path} is corrupted; dropped")
            self._drop(prefix_hash)
            return None
        return replace(entry.snap, kv=kv)

    def holdings(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` (n_tokens, hash) pairs this store can restore, most recently used first:
        each snapshot's whole prompt, then its block boundaries from the longest down."""
        out: list[tuple[int, bytes]] = []
        for h, entry in reversed(self._entries.items()):
            for n, bh in [(entry.snap.n_tokens, h)] + sorted(entry.snap.blocks, reverse=True):
                if len(out) >= limit:
                    return out
                out.append((n, bh))
        return out

    # -- internals -----------------------------------------------------------------------------

    def _enforce(self) -> None:
        for h in list(self._entries):  # LRU first: demote from memory until under budget
            if self.memory_used <= self.memory_bytes:
                break
            entry = self._entries[h]
            if entry.path is None:
                self.memory_used -= entry.nbytes
                if not self._to_disk(h, entry):
                    continue
        for h in list(self._entries):
            if self.disk_used <= self.disk_bytes:
                break
            if self._entries[h].path is not None:
                self._drop(h)

    def _to_disk(self, h: bytes, entry: _Entry) -> bool:
        """Move an entry (already out of the memory count) to disk; drop it when that fails."""
        if self._dir is None or entry.nbytes > self.disk_bytes:
            self._drop(h, counted=False)
            return False
        path = self._dir / f"{h.hex()}.kv"
        tmp = path.with_suffix(".tmp")
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(entry.snap.kv)
            os.replace(tmp, path)
        except OSError as e:
            self._warn(
                f"cannot write a snapshot to {self._dir} ({e}); keeping it out of the store, serving goes on"
            )
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            self._drop(h, counted=False)
            return False
        entry.snap = replace(entry.snap, kv=b"")
        entry.path = path
        self.disk_used += entry.nbytes
        return True

    def _drop(self, h: bytes, counted: bool = True) -> None:
        entry = self._entries.pop(h)
        if entry.path is not None:
            self.disk_used -= entry.nbytes
            try:
                entry.path.unlink(missing_ok=True)
            except OSError:
                pass
        elif counted:
            self.memory_used -= entry.nbytes
        for bh in [h] + [b for _, b in entry.snap.blocks]:
            if self._index.get(bh, (None,))[0] == h:
                del self._index[bh]
                for other, e in self._entries.items():  # another snapshot may cover the same prefix
                    n = e.snap.covers().get(bh)
                    if n is not None:
                        self._index[bh] = (other, n)
                        break

    def _warn(self, message: str) -> None:
        logger.warning("%s", message)
        self.warnings.append(message)
