"""Sealed ledgers: a closed ledger's entries as one Parquet file.

A sealed file is written to a local staging file first (``StoragePath.staging``), fsynced and
read back, then published: renamed into place with its directory fsynced on a local disk, or
uploaded to object storage (``ledger.storage``), so a reader never sees a partial file under
the final name. Rows are the ledger's entries 0..n-1 in order, so entry ``e`` is row ``e``.

Integrity (see ``ledger.checksums``): every page carries a CRC, verified by every read; sealing
reads the written file back and compares it with the rows it was given before it returns the
file's CRC32C, so a caller that removes the write-ahead file afterwards removes only what is
durable and correct. A read whose row group fails a check raises ``IntegrityError``; the other
row groups stay readable.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ledger.batch_encoder import encode_row_batches
from ledger.checksums import (
    FOOTER,
    READ_BACK,
    READ_OPTIONS,
    ROW_IDS,
    WRITE_OPTIONS,
    IntegrityError,
    crc32c_bytes,
    damage_of,
)
from ledger.entry import ENCRYPTION_PROPERTY, BatchEntry, Entry, LedgerItem, StoredBatch
from ledger.row_group_cache import RowGroupCache, RowGroupKey, shared
from ledger.schema import (
    ARROW_SCHEMA,
    BATCH_INDEX,
    BATCH_SIZE,
    DELIVER_AT_TIME,
    ENTRY_ID,
    LEDGER_ID,
    PRODUCER_NAME,
    PROPERTIES,
    PUBLISH_TIME,
    SCHEMA_VERSION,
    SEQUENCE_ID,
    SPARSE_COLUMNS,
    all_empty,
    entries_to_table,
    is_ledger_schema,
    null_columns_metadata,
    still_null,
    table_to_entries,
)
from ledger.storage import StoragePath, as_storage_path, unstage

# Small enough that reading one page touches little data, large enough for good compression.
ROW_GROUP_SIZE = 8192


@dataclass(frozen=True, slots=True)
class SealInfo:
    entries: int
    file_bytes: int
    # The whole file's CRC32C ("crc32c:xxxxxxxx"), of the bytes read back and verified.
    checksum: str


def seal(
    entries: Sequence[Entry], path: Path | StoragePath, *, row_group_size: int = ROW_GROUP_SIZE
) -> SealInfo:
    """Write ``entries`` as the sealed ledger at ``path``; durable and complete when it returns.

    Replaces any file already at ``path`` (a re-seal after a crash writes the same rows).
    """
    for i, e in enumerate(entries):
        if e.entry_id != i:
            raise ValueError(f"sealed ledger rows must be entries 0..n-1; row {i} is entry {e.entry_id}")
    return seal_table(entries_to_table(entries), path, row_group_size=row_group_size)


# How every Parquet file of a ledger is encoded, compression aside (sealed ledgers here,
# compacted parts in ``compactor.parts``). Dictionaries only where they pay: the one
# ledger id, and properties, producer names and schema versions, which repeat. Keys and values
# are mostly distinct within a row group, so a dictionary for them would be built and dropped
# in every row group (a third of a sealing's write). Statistics only where they are read: the
# ids (a round's id bounds, the binary search) and the publish time. Every page carries a CRC,
# verified by every reader (``ledger.checksums``).
LEDGER_WRITER_OPTIONS: dict[str, object] = {
    "use_dictionary": [
        LEDGER_ID,
        f"{PROPERTIES}.key_value.key",
        f"{PROPERTIES}.key_value.value",
        PRODUCER_NAME,
        SCHEMA_VERSION,
    ],
    "write_statistics": [LEDGER_ID, ENTRY_ID, PUBLISH_TIME],
    **WRITE_OPTIONS,
}
# Sealed ledgers are LZ4 (Parquet's LZ4_RAW), as compacted parts are (``compactor.parts``),
# so Spark and the Arrow path already read it; files sealed earlier with zstd read as before.
# Not zstd: pyarrow makes a zstd context for every page it compresses or decompresses (~130 a
# ledger of 50,000 rows, most of them tiny pages of sparse columns), and LZ4 encodes and decodes
# faster besides. Sealing (write and read-back) of pulsar-perf's 100-byte messages took ~30%
# less CPU for ~7% more bytes on random values (more on very repetitive ones: 0.13 -> 0.47 MB a
# ledger of identical values).
SEAL_CODEC = "lz4"
# The ids and times climb by small steps (entry ids by one): delta-encoded (Parquet's
# DELTA_BINARY_PACKED, which Spark's and Arrow's readers decode) they take a few bits a row
# instead of eight bytes, which LZ4 shrinks far less than zstd did. With them a sealed ledger of
# pulsar-perf messages is smaller than it was with zstd (random values 5.3 -> 5.2 MB, identical
# ones 0.13 -> 0.04 MB a 50,000-row ledger), and writes and reads a little faster.
SEAL_DELTA_COLUMNS = (ENTRY_ID, PUBLISH_TIME, SEQUENCE_ID, BATCH_INDEX)
SEAL_WRITER_OPTIONS: dict[str, object] = {
    "compression": SEAL_CODEC,
    "column_encoding": dict.fromkeys(SEAL_DELTA_COLUMNS, "DELTA_BINARY_PACKED"),
    **LEDGER_WRITER_OPTIONS,
}


def seal_table(
    table: pa.Table, path: Path | StoragePath, *, row_group_size: int = ROW_GROUP_SIZE
) -> SealInfo:
    """Write an Arrow table in ``ARROW_SCHEMA`` (entries 0..n-1 in order) as a sealed ledger:
    staging file, fsync, read back and compare, publish.

    Raises ``IntegrityError`` (check ``read-back comparison``) and leaves nothing under
    ``path`` when the file read back is not the table: the caller keeps its write-ahead file
    and tries again."""
    return SealWriter(path, row_group_size=row_group_size).finish(table)


class _SpillingSink:
    """A Parquet writer's sink that keeps what it is given until :meth:`spill` appends it to
    the file: the file is open only while a spill runs, so a ledger sealed while it is still
    being written holds no descriptor between its row groups."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.closed = False
        self._pending: list[bytes] = []
        self._position = 0
        self._started = False

    def write(self, data: bytes) -> int:
        self._pending.append(bytes(data))
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def spill(self, *, sync: bool = False) -> None:
        # The first spill truncates: a temporary file of a crashed attempt is not ours.
        with open(self.path, "ab" if self._started else "wb") as f:
            f.writelines(self._pending)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        self._started = True
        self._pending.clear()


class SealWriter:
    """A sealed ledger written in steps: whole row groups of a ledger's first entries while
    the ledger is still open (:meth:`write`), then the rest, the footer, fsync, the read-back
    comparison and the publication (:meth:`finish`), so that sealing at roll-over encodes only
    what came last. Until :meth:`finish` returns, nothing is under the final name; a crash
    leaves only the staging file, which recovery removes.

    Invariant: the rows written are entries ``0 .. rows-1`` of the ledger, in order. A writer
    that failed (or was abandoned) takes no more rows: its caller seals from the start."""

    def __init__(
        self,
        path: Path | StoragePath,
        *,
        row_group_size: int = ROW_GROUP_SIZE,
        keep: Callable[[StoragePath, Path], bool] | None = None,
    ) -> None:
        self.path = as_storage_path(path)
        # On object storage, what may take the staged file once it is uploaded (the service's
        # local copies, ``ledger.local_copies``).
        self._keep = keep
        self.rows = 0
        self.usable = True
        self._unpublished = False  # finished, its file not yet published
        self._tmp = self.path.staging()
        self._row_group_size = row_group_size
        self._chunks: list[pa.Table] = []  # what was written, for the read-back comparison
        self._sink = _SpillingSink(self._tmp)
        self._writer = pq.ParquetWriter(self._sink, ARROW_SCHEMA, **SEAL_WRITER_OPTIONS)  # type: ignore[arg-type]
        self._null = set(SPARSE_COLUMNS)  # the sparse columns without a value in any row so far
        self._lock = threading.Lock()

    def write(self, table: pa.Table) -> None:
        """Append ``table`` (the next entries, from ``rows``) as row groups, to the file."""
        with self._lock:
            self._check(table)
            try:
                self._append(table)
                # Made durable now, off the roll-over's path: its fsync then has only the rest.
                self._sink.spill(sync=True)
            except BaseException:
                self._abandon()
                raise

    def finish(self, rest: pa.Table, *, publish: bool = True) -> SealInfo:
        """Append ``rest`` (the ledger's last entries, from ``rows``), then make the file
        durable, compare it with every row written and (unless ``publish`` is False: then
        :meth:`publish` does, later, perhaps on another thread) move it into place."""
        with self._lock:
            self._check(rest)
            try:
                self._append(rest)
                self._writer.add_key_value_metadata(null_columns_metadata(self._null))
                self._writer.close()
                self._sink.spill(sync=True)
                table = pa.concat_tables(self._chunks) if self._chunks else ARROW_SCHEMA.empty_table()
                checksum, size = verify_written(self._tmp, table, name=str(self.path))
                self._chunks.clear()
                self.usable = False  # takes no more rows: what is left is its publication
                self._unpublished = True
            except BaseException:
                self._abandon()
                raise
        if publish:
            self.publish()
        return SealInfo(entries=self.rows, file_bytes=size, checksum=checksum)

    def publish(self) -> None:
        """Move the finished file into place: a rename on a local disk, an upload to object
        storage. The staged file is gone afterwards, published or not (unless the local
        copies took it)."""
        with self._lock:
            if not self._unpublished:
                raise RuntimeError(f"{self.path.name} is not finished, or was published or abandoned")
            self._unpublished = False
        self.path.publish(self._tmp, synced=True, keep=self._keep)

    def abandon(self) -> None:
        """Drop the writer and its temporary file (the ledger is sealed from the start instead)."""
        with self._lock:
            self._abandon()

    def _check(self, table: pa.Table) -> None:
        if not self.usable:
            raise RuntimeError(f"the sealing of {self.path.name} was abandoned")
        if table.num_rows and table.column(ENTRY_ID)[0].as_py() != self.rows:
            raise ValueError(f"sealed ledger rows must be entries 0..n-1; entry {self.rows} comes next")

    def _append(self, table: pa.Table) -> None:
        if table.schema != ARROW_SCHEMA:
            table = table.cast(ARROW_SCHEMA)
        if table.num_rows:
            self._writer.write_table(table, row_group_size=self._row_group_size)
            self._null = still_null(self._null, table)
            self._chunks.append(table)
            self.rows += table.num_rows

    def _abandon(self) -> None:
        if self.usable:
            self.usable = False
            with contextlib.suppress(Exception):
                self._writer.close()
            self._chunks.clear()
            unstage(self._tmp)  # what made it fail may stop this too: best effort
        elif self._unpublished:  # finished, never published
            self._unpublished = False
            unstage(self._tmp)


def verify_written(path: Path, table: pa.Table, *, name: str | None = None) -> tuple[str, int]:
    """Read the local file at ``path`` back, once, and return its CRC32C and size if its rows
    (every page's checksum verified) are exactly ``table``'s; ``IntegrityError`` (naming the
    file ``name``, the one being written) if not."""
    data = path.read_bytes()
    where = name or path
    checksum = crc32c_bytes(data)
    try:
        # The file's own reader, on this thread: the sealer is a thread of its own already, and
        # the dataset reader behind ``read_table`` decodes on Arrow's pools (hand-offs, and CPU
        # taken from the produce path) and pre-buffers what is in memory already. A 50,000-row
        # ledger of pulsar-perf messages reads back in ~25% less CPU than with ``read_table``
        # on one thread, ~35% less than with its pools.
        reader = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False, **READ_OPTIONS)  # type: ignore[arg-type]
        back = reader.read(use_threads=False)
    except Exception as e:
        damage = damage_of(where, e)
        if damage is None:
            raise
        raise IntegrityError(where, READ_BACK, f"the written file does not read back: {damage.detail}") from e
    if not back.cast(ARROW_SCHEMA).equals(table):
        raise IntegrityError(where, READ_BACK, "the rows read back differ from the write-ahead records")
    return checksum, len(data)


def table_to_items(table: pa.Table) -> list[LedgerItem]:
    """Rows of a ledger in id order (a slice of a sealed ledger) as a read of whole batches
    gives them: each batch whose members are all there (batch indexes ``0 .. n-1`` on
    consecutive rows) as one :class:`ledger.entry.BatchEntry` at its first entry, rebuilt from
    the rows (``metadata`` empty, the payload uncompressed, as the ``BatchEntry`` docstring
    says); every other row (a message sent alone, a member of a batch the slice cuts) as the
    ``Entry`` :func:`ledger.schema.table_to_entries` makes of it. In id order.

    The batches are found over the batch columns in bulk and their payloads encoded from the
    Arrow buffers (:func:`ledger.batch_encoder.encode_row_batches`): no Python object per member.
    An encrypted batch's members stay entries: its rows are not its payload (see
    ``api.pulsar.encryption``).
    """
    have = frozenset(table.column_names)  # (a list built anew on every call: look once)
    starts = _not_encrypted(table, whole_batches(table))
    if not len(starts):
        return list(table_to_entries(table))
    n = table.num_rows
    counts = _numbers(table.column(BATCH_SIZE), 0)[starts]
    # The rows outside the whole batches, in runs: each batch ends one (or an empty one).
    run_starts = np.concatenate(([0], starts + counts))
    run_ends = np.append(starts, n)
    loose_runs = [
        table.slice(a, b - a) for a, b in zip(run_starts.tolist(), run_ends.tolist(), strict=True) if b > a
    ]
    # One conversion of them all (slices, concatenated without a copy): its cost is mostly per call.
    entries = table_to_entries(pa.concat_tables(loose_runs)) if loose_runs else []
    payloads, sizes = encode_row_batches(table, starts, counts)
    at = pa.array(starts)

    def first_members(name: str) -> list[Any]:
        """Column ``name`` of each batch's first member (None where a file lacks it)."""
        if name not in have:
            return [None] * len(starts)
        return table.column(name).take(at).to_pylist()  # type: ignore[no-any-return]

    ledger_id = table.column(LEDGER_ID)[0].as_py()  # the rows of one ledger
    entry_ids = first_members(ENTRY_ID)
    publish_times = first_members(PUBLISH_TIME)
    producers, sequence_ids = first_members(PRODUCER_NAME), first_members(SEQUENCE_ID)
    deliver_at, schemas = first_members(DELIVER_AT_TIME), first_members(SCHEMA_VERSION)
    # How many loose entries come before each batch: the loose rows before its first row.
    cuts = (starts - np.concatenate(([0], np.cumsum(counts)[:-1]))).tolist()
    items: list[LedgerItem] = []
    taken = 0
    for k, count in enumerate(counts.tolist()):
        items.extend(entries[taken : cuts[k]])
        taken = cuts[k]
        payload = payloads[k]
        stored = StoredBatch(
            metadata=b"",
            payload=payload,
            count=count,
            size=sizes[k],
            compression=0,
            uncompressed_size=len(payload),
            producer_name=producers[k] or "",
            # The batch's first sequence id: its first member's (batch index 0), never below 0.
            sequence_id=max(0, sequence_ids[k] or 0),
            deliver_at_time=deliver_at[k],
            ordering_key=None,
            schema_version=schemas[k],
            publish_time=publish_times[k],
        )
        items.append(BatchEntry(ledger_id, entry_ids[k], stored))
    items.extend(entries[taken:])
    return items


def _not_encrypted(table: pa.Table, starts: np.ndarray) -> np.ndarray:
    """Those of the batches starting at ``starts`` whose first member holds no encryption
    context (``ledger.entry.ENCRYPTION_PROPERTY``): looked at only where some row has properties."""
    if not len(starts) or all_empty(table.column(PROPERTIES)):
        return starts
    firsts = table.column(PROPERTIES).take(pa.array(starts)).to_pylist()
    keep = [not (p and any(k == ENCRYPTION_PROPERTY for k, _ in p)) for p in firsts]
    return starts[np.array(keep, bool)]


def whole_batches(table: pa.Table) -> np.ndarray:
    """The rows (int64, ascending) where a batch that ``table`` holds whole starts: batch index
    0 there and ``1 .. n-1`` on the ``n - 1`` rows after it, each with batch size ``n``.

    Found in bulk: each row that is a batch member names the row its batch would start on
    (its own, less its batch index); a batch is whole where a run of rows naming the same start
    with the same size begins at that start and is as long as the size (an index is below the
    size, so a run is never longer)."""
    n = table.num_rows
    if not n or table.schema.get_field_index(BATCH_SIZE) < 0:  # a file from before batches
        return np.empty(0, np.int64)
    if table.column(BATCH_INDEX).null_count == n:  # no member of a batch (most REST-made ledgers)
        return np.empty(0, np.int64)
    index = _numbers(table.column(BATCH_INDEX), -1)
    size = _numbers(table.column(BATCH_SIZE), 0)
    rows = np.arange(n, dtype=np.int64)
    member = (index >= 0) & (index < size)
    first = np.where(member, rows - index, -1)
    begins = np.ones(n, bool)
    begins[1:] = (first[1:] != first[:-1]) | (size[1:] != size[:-1])
    run_starts = np.flatnonzero(begins)
    run_lengths = np.diff(np.append(run_starts, n))
    whole = (first[run_starts] == run_starts) & (run_lengths == size[run_starts])
    return run_starts[whole]


def _rest_of_last_batch(rows: pa.Table) -> int:
    """Members of the last row's batch stored after it (0 for a message sent alone)."""
    if rows.schema.get_field_index(BATCH_SIZE) < 0 or not rows.num_rows:
        return 0
    last = rows.num_rows - 1
    index, size = rows.column(BATCH_INDEX)[last].as_py(), rows.column(BATCH_SIZE)[last].as_py()
    return size - 1 - index if index is not None and size is not None and 0 <= index < size else 0


def _numbers(column: pa.ChunkedArray, null: int) -> np.ndarray:
    """An int column as int64 numbers, ``null`` where it is null."""
    if column.null_count:
        column = pc.fill_null(column, null)
    return column.to_numpy().astype(np.int64, copy=False)


class SealedLedger:
    """Random access to a sealed ledger's entries by id; safe to share between threads.

    Holds one open file (the Parquet file, or an object's reader) from construction until
    :meth:`close`, and the row groups it decoded last: the service keeps these in a bounded
    :class:`ledger.file_cache.FileCache`, which asks :meth:`cached_bytes` what one weighs. On
    object storage the footer is read once, at opening, and each read of row groups is one
    ranged request per row group's column chunks, coalesced by pyarrow (``pre_buffer``).

    :meth:`read` takes row groups from ``cache`` (the process's
    :func:`ledger.row_group_cache.shared` by default) where it holds them, and puts there the
    ones it decodes; :meth:`row_group` (the scrub's) always decodes from the file.
    """

    def __init__(
        self, path: Path | StoragePath, *, ledger_id: int | None = None, cache: RowGroupCache | None = None
    ) -> None:
        self.path = path = as_storage_path(path)
        self.ledger_id = ledger_id
        self._cache = cache if cache is not None else shared()
        self._cache_name = str(path)
        try:
            self._source = path.open()
        except FileNotFoundError as e:
            raise damage_of(path, e, opening=True) or e from e
        try:
            self._file = pq.ParquetFile(self._source, **READ_OPTIONS)  # type: ignore[arg-type]
        except Exception as e:
            self._source.close()
            raise damage_of(path, e, opening=True) or e from e
        meta = self._file.metadata
        if not is_ledger_schema(meta.schema.to_arrow_schema().names):
            self.close()
            raise IntegrityError(path, FOOTER, f"not a sealed ledger (columns {meta.schema.names})")
        # _starts[i] is the entry id of the first row of row group i.
        self._starts: list[int] = []
        n = 0
        for i in range(meta.num_row_groups):
            self._starts.append(n)
            n += meta.row_group(i).num_rows
        self.entries = n
        self.file_bytes = self._source.size()
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
        rows = self._rows(start, max_entries)
        return [] if rows is None else table_to_entries(rows)

    def read_batches(self, start: int, max_entries: int) -> list[LedgerItem]:
        """The rows :meth:`read` gives, with each batch they hold whole as one item: what a
        consumer of the binary protocol sends, at a cost per batch rather than per member
        (:func:`table_to_items`). A batch the limit cuts is read to its end (as the
        write-ahead log's ``read_batches`` gives it), so the read may pass ``max_entries``."""
        rows = self._rows(start, max_entries)
        if rows is None:
            return []
        rest = _rest_of_last_batch(rows)
        if rest:
            rows = self._rows(start, rows.num_rows + rest) or rows
        return table_to_items(rows)

    def _rows(self, start: int, max_entries: int) -> pa.Table | None:
        """Rows ``start`` .. ``start + max_entries - 1`` that exist (None if none do), from the
        row groups decoded last, or from the cache, or decoded and checked (``IntegrityError``)."""
        if start >= self.entries or max_entries <= 0:
            return None
        end = min(self.entries, start + max_entries)
        first_rg = bisect.bisect_right(self._starts, start) - 1
        last_rg = bisect.bisect_right(self._starts, end - 1) - 1
        with self._lock:  # ParquetFile keeps one file handle; serialise its use.
            decoded = self._decoded
            if decoded is None or not decoded[0] <= first_rg <= last_rg <= decoded[1]:
                held: list[pa.Table] = []
                if decoded is not None and decoded[0] <= first_rg <= decoded[1]:
                    # A page across the end of the held row groups: decode only the ones after.
                    held = [decoded[2].slice(self._starts[first_rg] - self._starts[decoded[0]])]
                    read_from = decoded[1] + 1
                else:
                    read_from = first_rg
                new = [self._cached_row_group(rg) for rg in range(read_from, last_rg + 1)]
                rows = pa.concat_tables(held + new)
                decoded = self._decoded = (first_rg, last_rg, rows)
                self._decoded_bytes = rows.nbytes
        first, _, table = decoded
        return table.slice(start - self._starts[first], end - start)

    def _cached_row_group(self, rg: int) -> pa.Table:
        """Row group ``rg`` from the row-group cache, or decoded (and then put there)."""
        cache = self._cache
        if not cache.max_bytes:  # off (a local disk, by default): as if there were none
            return self._read_row_group(rg)
        key = RowGroupKey(self._cache_name, self.file_bytes, rg)
        found = cache.get(key)
        if found is None:
            found = self._read_row_group(rg)
            cache.put(key, found)
        return found

    def _read_row_group(self, rg: int) -> pa.Table:
        """Row group ``rg``, every page's checksum verified and its ids checked against where
        the footer places it (entries ``_starts[rg]`` .. in order, of this ledger): a damaged
        footer or page header that decodes into other rows is caught here."""
        try:
            # On this thread: Arrow's pool costs more CPU than it saves a consumer's page, and
            # several readers are several worker threads already.
            rows = self._file.read_row_group(rg, use_threads=False)
        except Exception as e:
            raise damage_of(self.path, e) or e from e
        first = self._starts[rg]
        ids = rows.column(ENTRY_ID)
        n = rows.num_rows
        if n and (ids[0].as_py() != first or ids[n - 1].as_py() != first + n - 1):
            raise IntegrityError(
                self.path, ROW_IDS, f"row group {rg} holds entries {ids[0]}..{ids[n - 1]}, not {first}.."
            )
        if self.ledger_id is not None and n and rows.column(LEDGER_ID)[0].as_py() != self.ledger_id:
            raise IntegrityError(self.path, ROW_IDS, f"row group {rg} holds another ledger's rows")
        return rows

    def row_groups(self) -> list[tuple[int, int]]:
        """Each row group's entry range ``(first, last)``, from the footer."""
        ends = [*self._starts[1:], self.entries]
        return [(a, b - 1) for a, b in zip(self._starts, ends, strict=True)]

    def row_group(self, rg: int) -> pa.Table:
        """Row group ``rg`` decoded with every check (``IntegrityError`` if one fails)."""
        with self._lock:
            return self._read_row_group(rg)

    def first_entry_at_or_after(self, publish_time: int) -> int:
        """Id of the first entry published at or after ``publish_time`` (``entries`` if none).
        Reads only the publish_time column, once."""
        with self._lock:
            if self._publish_times is None:
                try:
                    column = self._file.read(columns=[PUBLISH_TIME]).column(0)
                except Exception as e:
                    raise damage_of(self.path, e) or e from e
                self._publish_times = column.to_pylist()
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
            self._source.close()
