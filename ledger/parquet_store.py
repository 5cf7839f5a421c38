"""Sealed ledgers: a closed ledger's entries as one Parquet file.

A sealed file is written under a temporary name, fsynced, renamed into place and the
directory fsynced, so a reader never sees a partial file under the final name. Rows are the
ledger's entries 0..n-1 in order, so entry ``e`` is row ``e``.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ledger.entry import Entry
from ledger.paths import TMP_SUFFIX, fsync_dir
from ledger.schema import ARROW_SCHEMA, PUBLISH_TIME, entries_to_table, table_to_entries

# Small enough that reading one page touches little data, large enough for good compression.
ROW_GROUP_SIZE = 8192


@dataclass(frozen=True, slots=True)
class SealInfo:
    entries: int
    file_bytes: int


def seal(entries: Sequence[Entry], path: Path, *, row_group_size: int = ROW_GROUP_SIZE) -> SealInfo:
    """Write ``entries`` as the sealed ledger at ``path``; durable and complete when it returns.

    Replaces any file already at ``path`` (a re-seal after a crash writes the same rows).
    """
    for i, e in enumerate(entries):
        if e.entry_id != i:
            raise ValueError(f"sealed ledger rows must be entries 0..n-1; row {i} is entry {e.entry_id}")
    return seal_table(entries_to_table(entries), path, row_group_size=row_group_size)


def seal_table(table: pa.Table, path: Path, *, row_group_size: int = ROW_GROUP_SIZE) -> SealInfo:
    """Write an Arrow table in ``ARROW_SCHEMA`` (entries 0..n-1 in order) as a sealed ledger:
    temporary name, fsync, rename, directory fsync."""
    if table.schema != ARROW_SCHEMA:
        table = table.cast(ARROW_SCHEMA)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        pq.write_table(table, f, row_group_size=row_group_size, compression="zstd")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return SealInfo(entries=table.num_rows, file_bytes=path.stat().st_size)


class SealedLedger:
    """Random access to a sealed ledger's entries by id; safe to share between threads.

    Holds one open file (the Parquet file) from construction until :meth:`close`, and the row
    groups it decoded last: the service keeps these in a bounded
    :class:`ledger.file_cache.FileCache`, which asks :meth:`cached_bytes` what one weighs.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = pq.ParquetFile(path)
        meta = self._file.metadata
        if meta.schema.to_arrow_schema().names != ARROW_SCHEMA.names:
            raise ValueError(f"{path}: not a sealed ledger (columns {meta.schema.names})")
        # _starts[i] is the entry id of the first row of row group i.
        self._starts: list[int] = []
        n = 0
        for i in range(meta.num_row_groups):
            self._starts.append(n)
            n += meta.row_group(i).num_rows
        self.entries = n
        self.file_bytes = path.stat().st_size
        self._lock = threading.Lock()
        self._publish_times: list[int] | None = None
        # The row groups decoded last (first, last, table): consumers read a ledger page by
        # page, and a page is much smaller than a row group.
        self._decoded: tuple[int, int, pa.Table] | None = None
        # What cached_bytes() reports, counted once per decode: Table.nbytes walks every buffer,
        # and the file cache asks after every read.
        self._decoded_bytes = 0

    def read(self, start: int, max_entries: int) -> list[Entry]:
        """Entries ``start`` .. ``start + max_entries - 1`` that exist, in order."""
        if start >= self.entries or max_entries <= 0:
            return []
        end = min(self.entries, start + max_entries)
        first_rg = bisect.bisect_right(self._starts, start) - 1
        last_rg = bisect.bisect_right(self._starts, end - 1) - 1
        with self._lock:  # ParquetFile keeps one file handle; serialise its use.
            decoded = self._decoded
            if decoded is None or not decoded[0] <= first_rg <= last_rg <= decoded[1]:
                rows = self._file.read_row_groups(list(range(first_rg, last_rg + 1)))
                decoded = self._decoded = (first_rg, last_rg, rows)
                self._decoded_bytes = rows.nbytes
        first, _, table = decoded
        return table_to_entries(table.slice(start - self._starts[first], end - start))

    def first_entry_at_or_after(self, publish_time: int) -> int:
        """Id of the first entry published at or after ``publish_time`` (``entries`` if none).
        Reads only the publish_time column, once."""
        with self._lock:
            if self._publish_times is None:
                self._publish_times = self._file.read(columns=[PUBLISH_TIME]).column(0).to_pylist()
            times = self._publish_times
        return bisect.bisect_left(times, publish_time)

    def cached_bytes(self) -> int:
        """Bytes of decoded data this reader keeps between reads (its last row groups, and
        the publish times once a seek by time read them)."""
        times = self._publish_times
        return self._decoded_bytes + (8 * len(times) if times else 0)

    def close(self) -> None:
        with self._lock:
            self._decoded = None
            self._decoded_bytes = 0
            self._publish_times = None
            self._file.close()
