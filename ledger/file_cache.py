"""A bounded LRU of open file readers, shared by every topic of a process.

Each sealed ledger that is read needs an open file (its Parquet footer, and the row groups it
decoded last). Keeping every one open for the life of the process runs it out of file
descriptors and memory; opening one per read costs a footer parse per page. This cache keeps
the readers used most recently and closes the others.

Invariants:

* at most ``max_open`` readers are open, and their decoded data weighs at most ``max_bytes``
  (each reader says what it holds through ``cached_bytes()``), *except* while more readers
  than that are in use at once: a reader in use is never closed under its user, so the cache
  overshoots by at most the number of concurrent reads, and comes back under its bounds as
  they finish;
* a key maps to at most one open reader; a reader is closed exactly once, by the cache, when
  it is evicted or discarded and no read holds it;
* a reader no read has used for ``idle_s`` seconds is closed by the next :meth:`close_idle`
  (the owner calls it periodically): a consumer that keeps up reads each sealed ledger once,
  and its files should not stay open until the LRU's bound pushes them out.

A hit costs one dict lookup and a move to the end of the LRU under one lock, so a ledger read
hot through the cache costs what a reader kept forever did.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)


class Reader(Protocol):
    def close(self) -> None: ...

    def cached_bytes(self) -> int: ...


K = TypeVar("K", bound=Hashable)
R = TypeVar("R", bound=Reader)


@dataclass(frozen=True, slots=True)
class FileCacheStats:
    """A snapshot: readers open now and their decoded bytes, the bounds, and counters since start."""

    open: int
    in_use: int
    cached_bytes: int
    max_open: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int


class _Slot(Generic[R]):
    """One cached reader and its bookkeeping (all under the cache's lock but ``reader``)."""

    __slots__ = ("reader", "users", "weight", "doomed", "used_at")

    def __init__(self, reader: R) -> None:
        self.reader = reader
        self.used_at = time.monotonic()  # when a read last released it
        self.users = 0  # reads holding the reader now
        self.weight = 0  # cached_bytes() when last released
        self.doomed = False  # evicted or discarded while in use: the last user closes it


class FileCache(Generic[K, R]):
    """LRU of open readers, bounded by count and by decoded bytes. Thread-safe."""

    def __init__(self, *, max_open: int, max_bytes: int, idle_s: float = 60.0) -> None:
        if max_open < 1 or max_bytes < 0 or idle_s <= 0:
            raise ValueError(f"bad bounds: max_open={max_open}, max_bytes={max_bytes}, idle_s={idle_s}")
        self.max_open = max_open
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self._slots: OrderedDict[K, _Slot[R]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    @contextmanager
    def use(self, key: K, open_reader: Callable[[], R]) -> Iterator[R]:
        """The open reader of ``key`` (opened with ``open_reader`` on a miss), held for the block.

        ``open_reader`` runs outside the lock, so a slow open does not stall hits on other
        keys; if two threads miss on one key at once, the second reader opened is closed.
        """
        slot = self.acquire(key, open_reader)
        try:
            yield slot.reader
        finally:
            self.release(slot)

    def acquire(self, key: K, open_reader: Callable[[], R]) -> _Slot[R]:
        """:meth:`use` for a hot path: the slot holding the reader (``.reader``); hand it to
        :meth:`release` exactly once, in a ``finally``."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:
                self._slots.move_to_end(key)
                slot.users += 1
                self._hits += 1
                return slot
            self._misses += 1
        reader = open_reader()
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:  # another thread opened it meanwhile: use theirs
                self._slots.move_to_end(key)
                slot.users += 1
                spare: R | None = reader
            else:
                slot = _Slot(reader)
                slot.users = 1
                self._slots[key] = slot
                spare = None
            victims = self._evict_locked()
        self._close(victims)
        if spare is not None:
            spare.close()
        return slot

    def release(self, slot: _Slot[R]) -> None:
        weight = _weight(slot.reader)
        now = time.monotonic()
        with self._lock:
            slot.users -= 1
            slot.used_at = now
            if slot.doomed:
                if slot.users:
                    return
                victims = [slot.reader]
            else:
                self._bytes += weight - slot.weight
                slot.weight = weight
                if len(self._slots) <= self.max_open and self._bytes <= self.max_bytes:
                    return  # the usual case: nothing to evict
                victims = self._evict_locked()
        self._close(victims)

    def _evict_locked(self) -> list[R]:
        """Unlink least recently used readers until within bounds; the ones free now are
        returned to be closed outside the lock, the ones in use are closed by their last user."""
        victims: list[R] = []
        if len(self._slots) <= self.max_open and self._bytes <= self.max_bytes:
            return victims
        for key in list(self._slots):
            if len(self._slots) <= self.max_open and self._bytes <= self.max_bytes:
                break
            slot = self._slots[key]
            if slot.users:
                continue  # held by a read: skip it, never close under a reader
            self._unlink_locked(key, slot)
            self._evictions += 1
            victims.append(slot.reader)
        return victims

    def _unlink_locked(self, key: K, slot: _Slot[R]) -> None:
        del self._slots[key]
        self._bytes -= slot.weight
        slot.weight = 0
        slot.doomed = True

    def close_idle(self) -> int:
        """Close the readers no read has used for ``idle_s`` seconds; returns how many."""
        victims: list[R] = []
        cutoff = time.monotonic() - self.idle_s
        with self._lock:
            # In LRU order: the first one used since the cutoff ends the scan (up to the slots
            # skipped because a read holds them; those count as used now).
            for key, slot in list(self._slots.items()):
                if slot.users:
                    continue
                if slot.used_at > cutoff:
                    break
                self._unlink_locked(key, slot)
                self._evictions += 1
                victims.append(slot.reader)
        self._close(victims)
        return len(victims)

    def discard(self, predicate: Callable[[K], bool]) -> int:
        """Close and forget the readers whose key matches (their files are being deleted);
        one in use is closed when its read ends. Returns how many were dropped."""
        victims: list[R] = []
        with self._lock:
            doomed = [(k, s) for k, s in self._slots.items() if predicate(k)]
            for key, slot in doomed:
                self._unlink_locked(key, slot)
                if not slot.users:
                    victims.append(slot.reader)
        self._close(victims)
        return len(doomed)

    def clear(self) -> None:
        """Close every reader not in use and forget all of them (service stop)."""
        self.discard(lambda _key: True)

    def stats(self) -> FileCacheStats:
        with self._lock:
            return FileCacheStats(
                open=len(self._slots),
                in_use=sum(1 for s in self._slots.values() if s.users),
                cached_bytes=self._bytes,
                max_open=self.max_open,
                max_bytes=self.max_bytes,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)

    @staticmethod
    def _close(readers: list[R]) -> None:
        for reader in readers:
            try:
                reader.close()
            except Exception:  # noqa: BLE001 - closing a reader must not fail the read that evicts it
                log.exception("closing %r failed", reader)


def _weight(reader: Reader) -> int:
    try:
        return max(0, int(reader.cached_bytes()))
    except Exception:  # noqa: BLE001 - a closed reader weighs nothing
        return 0
