"""A process-wide bounded cache of hot decoded row groups, keyed by (file, row group).

What it is for: on object storage every row group a reader decodes costs requests (a ranged
GET of its column chunks, which pyarrow coalesces; for a compacted ledger's part, the
object's HEAD too) and their round trips. A row group read again -- by the next consumer of a
compacted topic (every readCompacted consumer reads the same compacted ledger), by a second
subscription at another position, by a consumer that rewinds or is redelivered to -- comes
from memory instead. On a local disk the page cache does this already (a miss costs a decode,
no I/O), so the service sizes this cache 0 there unless told otherwise
(``Settings.cache_bytes``, ``COMPACTOR_CACHE_BYTES``).

Eviction is a segmented LRU: a row group enters on probation, and moves to the protected
segment (at most :data:`PROTECTED_SHARE` of the bytes) when it is read a second time. One
consumer scanning a log larger than the cache churns only the probation segment, and the row
groups read over and over (a compacted ledger's) stay.

Invariants:

* the tables held weigh at most ``max_bytes`` in all (``Table.nbytes`` of each, counted when
  it is put); a table heavier than :data:`LARGEST_SHARE` of ``max_bytes`` is not kept;
* a key names immutable bytes: files are written once under their name (a ledger re-sealed
  after a crash holds the same rows; a compacted ledger's files are under the round's own
  directory), and the key holds the file's size too;
* what is put passed every check when it was decoded (page checksums, the ids where the footer
  places them), so a hit serves checked rows; a file's integrity is checked from its bytes
  (the scrub, a round's input check), never from here;
* entries of a deleted file are never asked for again (ledger ids are not reused) and leave by
  the LRU.

A hit costs one dict lookup and a move in an ``OrderedDict`` under one lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import pyarrow as pa

#: The protected segment's largest share of ``max_bytes`` (row groups read twice or more).
PROTECTED_SHARE = 0.8
#: A table heavier than this share of ``max_bytes`` is served but not kept.
LARGEST_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class RowGroupKey:
    """Row group ``row_group`` of the file ``file`` (its storage's name for it, ``str()`` of
    a ``StoragePath``) of ``size`` bytes, decoded as ``view`` says (the columns a reader
    takes: a sealed ledger's every column, a compacted part's entry columns)."""

    file: str
    size: int
    row_group: int
    view: Hashable = None


@dataclass(frozen=True, slots=True)
class RowGroupCacheStats:
    """A snapshot: tables held and their bytes, the bound, and counters since start."""

    entries: int
    cached_bytes: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int


class RowGroupCache:
    """Decoded row groups, bounded by bytes, evicted by a segmented LRU. Thread-safe.

    ``max_bytes`` 0 turns it off: :meth:`get` answers None without counting, :meth:`put`
    keeps nothing (a reader checks :attr:`enabled` first and reads as it would without)."""

    def __init__(self, max_bytes: int = 0) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._probation: OrderedDict[RowGroupKey, tuple[pa.Table, int]] = OrderedDict()
        self._protected: OrderedDict[RowGroupKey, tuple[pa.Table, int]] = OrderedDict()
        self._probation_bytes = self._protected_bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def get(self, key: RowGroupKey) -> pa.Table | None:
        """The table put under ``key``, or None (a miss: the caller decodes it, then puts it)."""
        if not self.max_bytes:
            return None
        with self._lock:
            found = self._protected.get(key)
            if found is not None:
                self._protected.move_to_end(key)
                self._hits += 1
                return found[0]
            found = self._probation.pop(key, None)
            if found is None:
                self._misses += 1
                return None
            self._hits += 1
            # Read twice: protected from scans from now on.
            self._probation_bytes -= found[1]
            self._protected[key] = found
            self._protected_bytes += found[1]
            self._demote_locked()
            return found[0]

    def put(self, key: RowGroupKey, table: pa.Table) -> None:
        """Keep ``table`` (decoded and checked) under ``key``, on probation; evict the least
        recently used tables beyond the bound."""
        if not self.max_bytes:
            return
        weight = table.nbytes
        if weight > LARGEST_SHARE * self.max_bytes:
            return
        with self._lock:
            if key in self._protected or key in self._probation:
                return  # another reader decoded it meanwhile
            self._probation[key] = (table, weight)
            self._probation_bytes += weight
            self._evict_locked()

    def resize(self, max_bytes: int) -> None:
        """A new bound (0: off, and everything dropped)."""
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        with self._lock:
            self.max_bytes = max_bytes
            self._demote_locked()
            self._evict_locked()

    def clear(self) -> None:
        """Drop every table (the counters stay)."""
        with self._lock:
            self._probation.clear()
            self._protected.clear()
            self._probation_bytes = self._protected_bytes = 0

    def stats(self) -> RowGroupCacheStats:
        with self._lock:
            return RowGroupCacheStats(
                entries=len(self._probation) + len(self._protected),
                cached_bytes=self._probation_bytes + self._protected_bytes,
                max_bytes=self.max_bytes,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._probation) + len(self._protected)

    def _demote_locked(self) -> None:
        """Move the protected segment's least recently used tables back to probation (as its
        most recently used) until the segment is within its share."""
        while self._protected and self._protected_bytes > PROTECTED_SHARE * self.max_bytes:
            key, found = self._protected.popitem(last=False)
            self._protected_bytes -= found[1]
            self._probation[key] = found
            self._probation_bytes += found[1]

    def _evict_locked(self) -> None:
        """Drop least recently used tables, probation's first, until within ``max_bytes``."""
        while self._probation_bytes + self._protected_bytes > self.max_bytes:
            segment = self._probation if self._probation else self._protected
            _, (_, weight) = segment.popitem(last=False)
            if segment is self._probation:
                self._probation_bytes -= weight
            else:
                self._protected_bytes -= weight
            self._evictions += 1


_SHARED = RowGroupCache()


def shared() -> RowGroupCache:
    """The process's cache, which sealed and compacted ledgers read through by default; off
    (0 bytes) until the service sizes it (``service.topics.Broker``)."""
    return _SHARED
