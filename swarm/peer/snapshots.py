"""Prefix KV snapshots on a peer: keep, restore, announce, serve to and fetch from other peers.

`PrefixService` is what the span handler (swarm/peer/handler.py) asks about prefixes:
- `prepare(offers)` during Open: which offered lengths this peer can restore. When the local store
  lacks the longest offered block prefix, it reads the span's holdings records in the DHT and
  fetches the snapshot from a holder that lists it, over `SNAPSHOT_PROTOCOL`; the payload is
  checked completely (size bounds, key, format, sha256, the holder's signature; see
  swarm/kv/snapshot.py) and a bad one is logged with its reason, its holder is not asked again,
  and the prefix is simply not offered (the client computes it).
- `snapshot_bytes(n)` for the restore of a session's first Forward.
- `keep(...)` after a prefill reaches the whole offered prompt: the session's KV is exported and
  stored (swarm/kv/snapshot_store.py), indexed by every offered block hash.
- `serve_fetch(stream)`: answers other peers' fetches.
- `publish_forever()`: keeps this peer's holdings record fresh.

Wire of `SNAPSHOT_PROTOCOL` (frames length-prefixed by swarm/p2p.py): the requester sends msgpack
{"v": 1, "model_id", "start", "end", "n_tokens", "hash"}; the holder answers msgpack
{"ok": true, "size": N} followed by the payload in frames of at most FETCH_CHUNK_BYTES, or
{"ok": false, "error": "..."}.

This module does not: decide when a client restores (the client picks, swarm/kv/prefix.py), or
touch the executor (the handler does, under the span's lock).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import msgpack

from swarm.dht.prefix_records import HOLDINGS_NAME, MAX_HELD, decode_holdings, encode_holdings, prefixes_key
from swarm.errors import SwarmError
from swarm.kv.prefix import PREFIX_BLOCK_TOKENS
from swarm.limits import SNAPSHOT_PROTOCOL
from swarm.kv.snapshot import (
    Snapshot,
    SnapshotFormat,
    SnapshotKey,
    SnapshotRejected,
    decode_snapshot,
    encode_snapshot,
)
from swarm.kv.snapshot_store import SnapshotStore

logger = logging.getLogger(__name__)

FETCH_CHUNK_BYTES = 8 << 20
FETCH_TIMEOUT_S = 20.0
"""A fetch during Open gives up after this long; the client then computes the prefix."""
REQUEST_MAX_BYTES = 1024


@dataclass(frozen=True)
class FetchedFrom:
    """Where `prepare` got a snapshot: the holder's peer id and the prefix length."""

    peer_id: str
    n_tokens: int


class PrefixService:
    """Snapshots of one served span.

    Args:
        store: the bounded snapshot store.
        fmt: this executor's snapshot format.
        model_id, start, end: the span served.
        private_key: this peer's identity key (signs served snapshots).
        dht: the peer's SwarmDHT (holdings records, streams), or None for a peer that only keeps
            and restores its own snapshots.
        max_kv_bytes: largest snapshot accepted from another peer.
    """

    def __init__(
        self,
        store: SnapshotStore,
        fmt: SnapshotFormat,
        model_id: str,
        start: int,
        end: int,
        private_key,
        dht=None,
        max_kv_bytes: int = 1 << 30,
    ):
        self.store, self.fmt = store, fmt
        self.model_id, self.start, self.end = model_id, start, end
        self._key, self._dht, self._max_kv_bytes = private_key, dht, max_kv_bytes
        self.bad_holders: dict[str, str] = {}
        """Holders whose snapshot was rejected (peer id → reason); never asked again."""
        self.rejections: list[str] = []
        self._changed = asyncio.Event()

    def move(self, start: int, end: int) -> None:
        """The peer now serves [start, end): forget every snapshot of the old span."""
        self.start, self.end = start, end
        self.store = SnapshotStore(self.store.memory_bytes, self.store._dir, self.store.disk_bytes)
        self._changed.set()

    # -- sessions ----------------------------------------------------------------------------------

    async def prepare(
        self, offers: Sequence[tuple[int, bytes]]
    ) -> tuple[dict[int, bytes], FetchedFrom | None]:
        """Offered lengths restorable now (n → snapshot hash in the store), fetching the longest
        offered block prefix from a holder when the store lacks it. Never raises."""
        local = self.store.restorable(offers)
        blocks = [(n, h) for n, h in offers[:-1] if n % PREFIX_BLOCK_TOKENS == 0]
        best_local = max(local, default=0)
        wanted = [(n, h) for n, h in blocks if n > best_local]
        if not wanted or self._dht is None:
            return local, None
        try:
            async with asyncio.timeout(FETCH_TIMEOUT_S):
                got = await self._fetch_best(wanted)
        except TimeoutError:
            logger.warning(
                "prefix fetch gave up after %.0f s; the client computes the prefix", FETCH_TIMEOUT_S
            )
            got = None
        except SwarmError as e:
            logger.warning("prefix fetch failed (%s); the client computes the prefix", e)
            got = None
        if got is None:
            return local, None
        snap, holder = got
        self.store.put(snap)
        return self.store.restorable(offers), FetchedFrom(
            holder, max(snap.covers().get(h, 0) for _, h in wanted)
        )

    def snapshot_kv(self, snapshot_hash: bytes) -> bytes | None:
        """KV bytes of a stored snapshot, or None when it was evicted meanwhile."""
        snap = self.store.get(snapshot_hash)
        return None if snap is None else snap.kv

    def keep(self, offers: Sequence[tuple[int, bytes]], kv: bytes) -> None:
        """Store a session's KV of its whole offered prompt (the last offer), indexed by every
        offered block hash."""
        n, h = offers[-1]
        blocks = tuple((bn, bh) for bn, bh in offers[:-1] if bn % PREFIX_BLOCK_TOKENS == 0)
        snap = Snapshot(SnapshotKey(self.model_id, self.start, self.end, h), n, blocks, self.fmt, kv)
        if self.store.put(snap):
            self._changed.set()

    def wants(self, offers: Sequence[tuple[int, bytes]]) -> bool:
        """True when the whole offered prompt has no snapshot here yet."""
        return bool(offers) and offers[-1][1] not in self.store

    # -- between peers -----------------------------------------------------------------------------

    async def _fetch_best(self, wanted: list[tuple[int, bytes]]) -> tuple[Snapshot, str] | None:
        records = await self._dht.get_blob(prefixes_key(self.model_id, self.start, self.end))
        by_hash: dict[bytes, list] = {}
        for blob in records:
            if blob.name != HOLDINGS_NAME or blob.owner_peer_id == self._dht.peer_id:
                continue
            if blob.owner_peer_id in self.bad_holders:
                continue
            holdings = decode_holdings(blob.owner_peer_id, blob.value)
            for n, h in holdings.held if holdings else ():
                by_hash.setdefault(h, []).append((n, holdings))
        for n, h in sorted(wanted, reverse=True):  # longest prefix first
            for held_n, holdings in by_hash.get(h, []):
                if held_n != n:
                    continue
                snap = await self._fetch_from(holdings.peer_id, holdings.addrs, n, h)
                if snap is not None:
                    return snap, holdings.peer_id
        return None

    async def _fetch_from(self, peer_id: str, addrs, n: int, h: bytes) -> Snapshot | None:
        request = {
            "v": 1,
            "model_id": self.model_id,
            "start": self.start,
            "end": self.end,
            "n_tokens": n,
            "hash": h,
        }
        try:
            stream = await self._dht.transport.open_stream(
                peer_id, addrs, SNAPSHOT_PROTOCOL, max_frame_bytes=FETCH_CHUNK_BYTES
            )
            async with stream:
                await stream.send(msgpack.packb(request, use_bin_type=True))
                head = msgpack.unpackb(await stream.recv(FETCH_TIMEOUT_S), raw=False)
                if not isinstance(head, dict) or head.get("ok") is not True:
                    logger.info(
                        "holder %s… has no snapshot %s: %s",
                        peer_id[:12],
                        h.hex()[:12],
                        head.get("error") if isinstance(head, dict) else "bad answer",
                    )
                    return None
                size = head.get("size")
                if not isinstance(size, int) or not 0 < size <= self._max_kv_bytes + 64 * 1024:
                    raise SnapshotRejected(f"announced size {size!r} is out of bounds")
                payload = bytearray()
                while len(payload) < size:
                    payload += await stream.recv(FETCH_TIMEOUT_S)
                    if len(payload) > size:
                        raise SnapshotRejected("holder sent more bytes than announced")
        except SnapshotRejected as e:
            return self._reject(peer_id, str(e))
        except (SwarmError, ValueError, msgpack.UnpackException) as e:
            logger.warning("fetching snapshot %s from %s… failed: %s", h.hex()[:12], peer_id[:12], e)
            return None
        try:
            return decode_snapshot(
                bytes(payload),
                SnapshotKey(self.model_id, self.start, self.end, h),
                self.fmt,
                peer_id,
                self._max_kv_bytes,
            )
        except SnapshotRejected as e:
            return self._reject(peer_id, str(e))

    def _reject(self, peer_id: str, reason: str) -> None:
        message = f"rejected a snapshot from {peer_id}: {reason}; the prefix will be recomputed"
        logger.warning("%s", message)
        self.rejections.append(message)
        self.bad_holders[peer_id] = reason
        return None

    async def serve_fetch(self, stream, tamper: str | None = None) -> None:
        """Answer one fetch request on `stream` (a swarm.p2p.FramedStream). `tamper`: test hook,
        a key of TAMPERS: the payload sent is damaged that way."""
        try:
            req = msgpack.unpackb(await stream.recv(10.0), raw=False)
            ok = (
                isinstance(req, dict)
                and req.get("v") == 1
                and req.get("model_id") == self.model_id
                and req.get("start") == self.start
                and req.get("end") == self.end
                and isinstance(req.get("hash"), bytes)
            )
            hit = self.store.restorable([(req.get("n_tokens"), req["hash"])]) if ok else {}
            snap = self.store.get(next(iter(hit.values()))) if hit else None
            if snap is None:
                await stream.send(msgpack.packb({"ok": False, "error": "not held"}))
                return
            payload = await asyncio.to_thread(TAMPERS[tamper or "none"], snap, self._key)
            await stream.send(msgpack.packb({"ok": True, "size": len(payload)}))
            for i in range(0, len(payload), FETCH_CHUNK_BYTES - 16):
                await stream.send(payload[i : i + FETCH_CHUNK_BYTES - 16])
        except (SwarmError, ValueError, msgpack.UnpackException) as e:
            logger.info("snapshot fetch from %s… ended: %s", stream.remote_peer_id[:12], e)
        finally:
            await stream.close()

    async def publish_once(self, expiration_s: float) -> None:
        """Store this peer's holdings record now. Raises SwarmError when no DHT node stores it."""
        value = encode_holdings(self._dht.visible_maddrs(), self.store.holdings(MAX_HELD))
        await self._dht.store_blob(
            prefixes_key(self.model_id, self.start, self.end), HOLDINGS_NAME, value, expiration_s
        )

    async def publish_forever(
        self, period_s: float, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        """Publish when the store changes (at most every 0.5 s) and every `period_s`; never raises
        but CancelledError."""
        while True:
            try:
                async with asyncio.timeout(period_s):
                    await self._changed.wait()
            except TimeoutError:
                pass
            self._changed.clear()
            if len(self.store) == 0:
                continue
            try:
                await self.publish_once(period_s * 2.5)
            except SwarmError as e:
                logger.warning("prefix holdings refresh failed: %s", e)
            await sleep(0.5)


def _with_format_version(snap: Snapshot, key) -> bytes:
    fmt = SnapshotFormat(**{**snap.format.to_dict(), "version": snap.format.version + 1})
    return encode_snapshot(Snapshot(snap.key, snap.n_tokens, snap.blocks, fmt, snap.kv), key)


def _with_span_shifted(snap: Snapshot, key) -> bytes:
    k = snap.key
    shifted = SnapshotKey(k.model_id, k.start + 1, k.end + 1, k.prefix_hash)
    return encode_snapshot(Snapshot(shifted, snap.n_tokens, snap.blocks, snap.format, snap.kv), key)


def _flip_last_byte(snap: Snapshot, key) -> bytes:
    payload = bytearray(encode_snapshot(snap, key))
    payload[-1] ^= 0x01
    return bytes(payload)


TAMPERS: dict[str, Callable[[Snapshot, object], bytes]] = {
    "none": encode_snapshot,
    "flip": _flip_last_byte,
    "truncate": lambda snap, key: encode_snapshot(snap, key)[:-4096],
    "span": _with_span_shifted,
    "format": _with_format_version,
}
"""Test hook (`swarm serve --debug-tamper-snapshots`): how a holder damages the snapshots it serves."""
