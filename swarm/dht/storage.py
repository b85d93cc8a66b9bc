"""What one DHT node keeps under one key: bounded in count, bytes and lifetime, fair among signers.

hivemind's `DHTLocalStorage` keeps every subkey a validator lets through, so a stranger with one
signing key could pile 20,000 signed blobs under a model's spans key and every reader would download
them all (and past hivemind's 4 MiB message limit a key cannot be read at all). `BoundedStorage` runs
in every swarm DHT node instead (its storage and its cache) and applies `admit_subkey` to each store:

- a record may expire at most limits.MAX_RECORD_TTL_S past this node's clock (checked here, at store
  time only: hivemind refuses a whole dictionary on read when one subkey fails the validators, so a
  clock-dependent check there would let one record expiring at the edge hide every peer from readers
  whose clock is a few seconds slower);
- a record (subkey plus signed value) holds at most limits.MAX_RECORD_BYTES;
- one signing key (the subkey's owner marker) holds at most limits.MAX_SUBKEYS_PER_OWNER subkeys;
- a key holds at most limits.MAX_SUBKEYS_PER_KEY subkeys and limits.MAX_KEY_BYTES bytes; a store
  that would pass either makes room by dropping the earliest-expiring records of the signer holding
  the most bytes, and is refused when that signer is its own (max-min fairness: a flood from many keys
  crowds out the flooders first, and a peer with one announcement always gets in).

`admit_subkey` is the pure decision; `BoundedStorage` applies it; `install` swaps it into a running
hivemind node (hivemind builds its storage inside DHTProtocol.create and takes no parameter for it).

This module does not validate signatures or record contents (swarm.dht.validation does).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.utils import get_dht_time

from swarm.limits import (
    MAX_KEY_BYTES,
    MAX_RECORD_BYTES,
    MAX_RECORD_TTL_S,
    MAX_SUBKEYS_PER_KEY,
    MAX_SUBKEYS_PER_OWNER,
)

_OWNER_TAG = b"[owner:"


@dataclasses.dataclass(frozen=True)
class Held:
    """One subkey a key holds: its raw subkey, size in bytes (subkey + value) and expiration (s)."""

    subkey: bytes
    size_bytes: int
    expiration: float


def owner_of(subkey: bytes) -> bytes:
    """The owner marker part of a raw subkey (b"" when it has none: all such subkeys share one owner)."""
    return subkey.partition(_OWNER_TAG)[2]


def admit_subkey(held: list[Held], new: Held, now: float) -> Optional[list[bytes]]:
    """Whether a key holding `held` takes `new` (see module docstring for the rules); pure.

    Args:
        held: the key's live subkeys (a subkey equal to new.subkey is the one `new` replaces).
        new: the incoming record.
        now: this node's DHT time, seconds.
    Returns:
        None to refuse the store, else the subkeys to drop before storing `new` (often empty).
    """
    if new.expiration > now + MAX_RECORD_TTL_S or new.size_bytes > MAX_RECORD_BYTES:
        return None
    others = [h for h in held if h.subkey != new.subkey]
    owner = owner_of(new.subkey)
    if sum(owner_of(h.subkey) == owner for h in others) >= MAX_SUBKEYS_PER_OWNER:
        return None
    kept = others + [new]
    dropped: list[bytes] = []
    while len(kept) > MAX_SUBKEYS_PER_KEY or sum(h.size_bytes for h in kept) > MAX_KEY_BYTES:
        by_owner: dict[bytes, int] = {}
        for h in kept:
            by_owner[owner_of(h.subkey)] = by_owner.get(owner_of(h.subkey), 0) + h.size_bytes
        largest = max(by_owner, key=lambda o: (by_owner[o], o == owner))  # a tie goes against `new`
        if largest == owner:
            return None
        victim = min((h for h in kept if owner_of(h.subkey) == largest), key=lambda h: h.expiration)
        kept.remove(victim)
        dropped.append(victim.subkey)
    return dropped


class BoundedStorage(DHTLocalStorage):
    """hivemind's local DHT storage with `admit_subkey` applied to every subkey stored.

    Args:
        maxsize: most keys kept (hivemind's cache passes its size; None: unbounded, as hivemind's).
    """

    def store_subkey(self, key: DHTID, subkey, value: bytes, expiration_time: float) -> bool:
        current = self.get(key)
        by_raw = {}
        if current is not None and isinstance(current.value, DictionaryDHTValue):
            by_raw = {_raw(s): (s, len(v), exp) for s, (v, exp) in current.value.items()}
        held = [Held(raw, len(raw) + size, exp) for raw, (_, size, exp) in by_raw.items()]
        new = Held(_raw(subkey), len(_raw(subkey)) + len(value), expiration_time)
        drop = admit_subkey(held, new, get_dht_time())
        if drop is None:
            return False
        for raw in drop:
            current.value.discard(by_raw[raw][0])
        return super().store_subkey(key, subkey, value, expiration_time)


def _raw(subkey) -> bytes:
    """Subkeys of swarm records are bytes; anything else (refused by the validators) counts by repr."""
    return subkey if isinstance(subkey, bytes) else repr(subkey).encode()


async def install(_dht, node) -> None:
    """Replace a running hivemind DHTNode's storage and cache by `BoundedStorage`, re-storing what they
    held through the bounds. Run inside the DHT's process: `await dht.run_coroutine(install)`."""
    protocol = node.protocol
    for name in ("storage", "cache"):
        old = getattr(protocol, name)
        new = BoundedStorage(maxsize=None if old.maxsize == float("inf") else old.maxsize)
        for key, item in list(old.items()):
            if isinstance(item.value, DictionaryDHTValue):
                for subkey, (value, expiration) in list(item.value.items()):
                    new.store_subkey(key, subkey, value, expiration)
            else:
                new.store(key, item.value, item.expiration_time)
        setattr(protocol, name, new)
