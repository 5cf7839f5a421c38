"""The two phases as Arrow work inside Spark tasks: the fast path when message ids pack.

Spark schedules one task per **group**; the tasks decode Parquet and aggregate with Arrow's
C++ kernels, so no input row becomes a JVM row and nothing but a few counters passes through
Spark. Every input byte is decoded once per phase, by one task.

The input of a round is a list of **segments** in message-id order: the previous compacted
ledger's part files, then the sealed original ledgers, each with the packed-id range it
contributes, ``(lo, hi]``. Every segment stores its rows in id order. Consecutive segments
form groups, balanced by bytes; group ``g`` writes output part ``part-{g:05d}.parquet``, so
the part files in name order are in message-id order with no sort of full rows.

Phase one (:func:`phase_one`): each task reads the narrow columns (ids, key, tombstone flag,
publish time when delete retention needs it) of its group's new segments and finds each
key's last row there, i.e. its latest id within the group (Arrow's ordered ``last``
aggregation over rows in id order, folded every few million rows so memory is bounded by the
keys). It writes that **partial** -- key, id, tombstone flag -- to the round's scratch
directory as an Arrow IPC file. Keys are compared exactly; nothing is hashed into an id.

Phase two (:func:`phase_two`): a key's latest row overall is its row in the *last* group that
has the key, because groups are in id order. So task ``g`` keeps the rows of its partial whose
key appears in no later group's partial (an exact set membership over the later partials'
key columns), drops tombstones (unless delete retention keeps them), and reads the full rows
of its segments, keeping exactly those ids. It takes the key column from the partial rather
than decoding it again. The previous compacted ledger's rows (incremental rounds) are kept
by key: unless a new row of the key exists.

The only data moving between tasks is the partials' key columns, through files a task reads
directly: no shuffle, no collect of rows to the driver.

A full round (:func:`full_round`) is one job: the last group needs no other group's keys, so
its task runs both phases at once, its partial written first; each other group's task writes
its partial, waits in the task for the later groups' partials (their phase one, in parallel,
takes about as long) and runs its phase two then: a second Spark job would cost a round trip
through the driver before any of its work. A task whose later partials do not come in time
(their tasks not running: fewer cores than tasks) leaves its phase two to a job the driver
starts once the first job ends.

One job (:func:`both_phases`): a Spark job costs tens of milliseconds before any work, which
is most of an incremental round that adds 1% to a compacted ledger. When the new rows are a
small share of the round (:func:`fits_one_job`), each task runs both phases itself: its
partial stays in memory and it reads the keys of the later groups' new rows directly (a few
narrow reads) instead of waiting for their partials. The previous ledger's parts are then
split by row group, so that copying them spreads over every task.

Every file is a ``ledger.storage.StoragePath``, so the same tasks read and write a local disk
or an S3-compatible bucket (a task opens the storage once per process, see ``open_storage``).
What differs is how a file is put in place: on a local disk a task writes under a name of its
own in the scratch directory and renames it into place (parts and key indexes fsynced first);
on object storage a part and its key index are written to a local staging file and uploaded,
and a partial is spooled and uploaded, each whole or not at all. Reads differ too: partials
and key indexes are memory-mapped on a local disk, and read whole, in one request each, from
object storage (Parquet files by ranges on both). What the driver needs of the tasks' work
-- the parts' manifest lines on object storage, a delta round's dead rows -- comes back as
the tasks' results (:class:`TaskResult`), not through files.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import pickle
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import RDD, SparkContext
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from compactor.phases import PACK_SHIFT
from ledger import deletion_vectors, key_index, prefetch
from ledger.checksums import damage_of, file_checksum
from ledger.entry import Position
from ledger.files import fsync_path
from ledger.layers import PartInfo
from ledger.parquet_store import LEDGER_WRITER_OPTIONS
from ledger.schema import (
    ARROW_SCHEMA,
    ENTRY_ID,
    IS_TOMBSTONE,
    KEY,
    LEDGER_ID,
    PROPERTIES,
    PUBLISH_TIME,
    SPARK_DDL,
    SPARSE_COLUMNS,
    VALUE,
    conform,
    declared_null,
    derived_delete_flags,
    null_columns_metadata,
    still_null,
)
from ledger.storage import StoragePath, unstage

T = TypeVar("T")

WRITTEN_DDL = "part INT, rows BIGINT, described STRING"
LABEL, ID = "label", "id"

# Columns of a partial (phase one's output per group).
P_KEY, P_ID, P_TOMBSTONE, P_PUBLISH_TIME = KEY, "id", "tombstone", "publish_time"
# Phase one's running aggregate without delete retention: ``id << 1 | tombstone``, for ids
# below this bound (ledger ids below 2**30).
_ENCODED = "id_tombstone"
_ENCODABLE_IDS = 1 << 62

# Rows decoded at a time from one file, at most; fewer when they are wide (see _chunk_rows).
_CHUNK_ROWS = 262_144
_MIN_CHUNK_ROWS = 8_192
_CHUNK_BYTES = 32 * 1024 * 1024
# Files a reader of several has opening (on object storage: fetching) beyond the one it reads:
# at most this many, of at most this many bytes in all (one at least).
_OPEN_AHEAD = 8
_OPEN_AHEAD_BYTES = 64 * 1024 * 1024
# Fold the running per-key winners with the rows read since, past this many rows.
_FOLD_ROWS = 2_000_000
# Below this many ids per row of a chunk's id span, a kept-row mask is a bitmap over the span
# (original ledgers: consecutive entry ids); sparser ids are matched by binary search.
_BITMAP_SPAN_PER_ROW = 8
# One job for both phases when new bytes x groups x this <= the round's bytes.
_ONE_JOB_NEW_SHARE = 2
# Indexed rows per task of a delta round's probe (see probe_tasks). A task probes beside its
# own writing, on a thread of its own (see _beside_probe), so below this another task (about
# 20 ms of Spark's on 2 cores) costs more than it takes off the probe (~50 ns a row).
PROBE_ROWS = 1_000_000
# How compacted parts are encoded. They are read hot -- by every readCompacted consumer and
# by the next incremental round, which copies the previous ledger's rows -- so LZ4: it encodes
# about twice as fast as zstd and decodes several times faster, for a few percent more bytes
# (sealed ledgers are LZ4 too, since sealing's CPU counts on the produce path). Otherwise encoded as every
# ledger file is (``ledger.parquet_store.LEDGER_WRITER_OPTIONS``): a compacted ledger's keys
# are unique and its values mostly so, so no dictionary for them.
PART_CODEC = "lz4"
PART_WRITER_OPTIONS: dict[str, object] = {"compression": PART_CODEC, **LEDGER_WRITER_OPTIONS}
# Values that their sealed ledgers' codec could not shrink by a tenth (random or already
# compressed payloads) are written uncompressed: LZ4 would save nothing and cost a pass over
# every byte (measured on 4 KB random values: 0.62 GB/s written with LZ4, 0.97 without).
INCOMPRESSIBLE_RATIO = 0.9


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths of ``schema`` (a map's are ``name.key_value.key`` / ``.value``)."""
    out: list[str] = []
    for f in schema:
        out += (
            [f"{f.name}.key_value.key", f"{f.name}.key_value.value"] if pa.types.is_map(f.type) else [f.name]
        )
    return out


def part_writer_options(*, compress_values: bool = True) -> dict[str, object]:
    """How a compacted part is written; ``compress_values=False`` leaves its value column
    uncompressed (see ``INCOMPRESSIBLE_RATIO``), every other column as ``PART_WRITER_OPTIONS``."""
    if compress_values:
        return PART_WRITER_OPTIONS
    codecs = {path: ("none" if path == VALUE else PART_CODEC) for path in _leaf_paths(ARROW_SCHEMA)}
    return {**PART_WRITER_OPTIONS, "compression": codecs}


_KEY_INDEX = ARROW_SCHEMA.get_field_index(KEY)
_ALL_BUT_KEY = [name for name in ARROW_SCHEMA.names if name != KEY]


class ShippedFooter:
    """A file's footer as a round's plan carries it into tasks. It pickles as the footer's
    bytes, made once however many jobs ship the plan, and is parsed only where a task opens
    the file: each task opens only its own group's files, and parsing every footer of a
    round of forty ledgers took each task about 10 ms before its work began."""

    __slots__ = ("_meta", "_pickled")

    def __init__(self, meta: pq.FileMetaData | None, pickled: bytes | None = None) -> None:
        self._meta = meta
        self._pickled = pickled

    @property
    def meta(self) -> pq.FileMetaData:
        if self._meta is None:
            # Two threads of a task may both parse it: the same footer either way.
            self._meta = pickle.loads(self._pickled)  # type: ignore[arg-type]
        return self._meta

    def __reduce__(self) -> tuple[type[ShippedFooter], tuple[None, bytes]]:
        if self._pickled is None:
            self._pickled = pickle.dumps(self._meta, protocol=pickle.HIGHEST_PROTOCOL)
        return ShippedFooter, (None, self._pickled)


@dataclass(frozen=True)
class Segment:
    """Rows of one Parquet file with packed ids in ``(lo, hi]``, stored in id order."""

    path: StoragePath
    lo: int
    hi: int
    size: int = 0
    # A part of the previous compacted ledger in an incremental round: its rows are kept by
    # key (unless a newer row of the key exists) rather than by id.
    previous: bool = False
    # Only these row groups of the file (None: all); a large part is split so that groups
    # can balance.
    row_groups: tuple[int, ...] | None = None
    # Written before empty values deleted: its ``is_tombstone`` is derived again on read.
    derive_deletes: bool = False
    # A compacted layer's part with dead rows: its layer's deletion vector (``deletes_rows``
    # rows), and the layer row number of the segment's first row (of its first row group).
    deletes: StoragePath | None = None
    deletes_rows: int = 0
    first_row: int = 0
    # The file's footer, where planning read it (a task then does not read it again).
    footer: ShippedFooter | None = field(default=None, compare=False)
    # The file's whole-file CRC32C, where the round was given it (see ``prefetch.open_parquet``).
    checksum: str | None = None

    @property
    def footer_meta(self) -> pq.FileMetaData | None:
        """The footer planning read (parsed here, in the task that opens the file), or None."""
        return self.footer.meta if self.footer is not None else None


def bound(ledger_id: int, entry_id: int) -> int:
    """A position as a packed bound; unlike ``packed`` it allows entry -1 ("before entry 0")."""
    return (ledger_id << PACK_SHIFT) + entry_id


def packed(ledger_ids: pa.ChunkedArray | pa.Array, entry_ids: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """``ledger_id << 32 | entry_id`` as int64 (the caller checked that the ids pack)."""
    lid = np.asarray(ledger_ids.to_numpy(), dtype=np.int64)
    eid = np.asarray(entry_ids.to_numpy(), dtype=np.int64)
    return (lid << PACK_SHIFT) | eid


def column_bytes(meta: pq.FileMetaData, names: Sequence[str]) -> tuple[int, int]:
    """The bytes of the columns ``names`` (top-level names: a map's leaves count for it) in a
    file, as stored (compressed) and as decoded, over its row groups."""
    wanted = set(names)
    stored = decoded = 0
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for c in range(group.num_columns):
            column = group.column(c)
            if column.path_in_schema.split(".", 1)[0] in wanted:
                stored += column.total_compressed_size
                decoded += column.total_uncompressed_size
    return stored, decoded


def _chunk_rows(meta: pq.FileMetaData, columns: Sequence[str]) -> int:
    """Rows per chunk of a file: ``_CHUNK_ROWS``, or fewer when its rows are wide, so that a
    chunk of ``columns`` decodes to about ``_CHUNK_BYTES`` (4 KB values would otherwise make a
    chunk of a gigabyte: memory a task must first be given by the kernel, and caches missed)."""
    rows = meta.num_rows
    if rows == 0:
        return _CHUNK_ROWS
    per_row = max(1, column_bytes(meta, columns)[1] // rows)
    return int(min(_CHUNK_ROWS, max(_MIN_CHUNK_ROWS, _CHUNK_BYTES // per_row)))


@dataclass(frozen=True, slots=True)
class RowGroupIds:
    """One non-empty row group's rows and id ranges, from its statistics."""

    index: int
    rows: int
    min_ledger_id: int
    max_ledger_id: int
    min_entry_id: int
    max_entry_id: int


def row_group_ids(meta: pq.FileMetaData, row_groups: Sequence[int] | None = None) -> list[RowGroupIds] | None:
    """The id ranges of a file's non-empty row groups (of ``row_groups`` only, in that order,
    when given), from their statistics; ``None`` when one of them lacks statistics (then
    nothing may be concluded)."""
    cols = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    found: list[RowGroupIds] = []
    for rg in range(meta.num_row_groups) if row_groups is None else row_groups:
        group = meta.row_group(rg)
        if group.num_rows == 0:
            continue
        sl, se = (group.column(cols[name]).statistics for name in (LEDGER_ID, ENTRY_ID))
        if sl is None or se is None or not sl.has_min_max or not se.has_min_max:
            return None
        found.append(RowGroupIds(rg, group.num_rows, int(sl.min), int(sl.max), int(se.min), int(se.max)))
    return found


def _row_groups_with(meta: pq.FileMetaData, ids: np.ndarray) -> list[int] | None:
    """The row groups of a file whose id range (from their statistics) holds one of ``ids``
    (sorted packed ids); ``None`` (all of them) when a row group lacks statistics."""
    groups = row_group_ids(meta)
    if groups is None:
        return None
    chosen: list[int] = []
    for g in groups:
        if g.min_ledger_id != g.max_ledger_id:
            chosen.append(g.index)  # ids of several ledgers: no packed range to test against
            continue
        lo, hi = bound(g.min_ledger_id, g.min_entry_id), bound(g.max_ledger_id, g.max_entry_id)
        at = int(np.searchsorted(ids, lo, side="left"))
        if at < len(ids) and ids[at] <= hi:
            chosen.append(g.index)
    return chosen


def _consecutive_ids(meta: pq.FileMetaData, row_groups: Sequence[int] | None) -> np.ndarray | None:
    """The packed ids of every row of these row groups (all: None), in order, when the
    statistics show that each holds one ledger's consecutive entries -- as a sealed ledger's
    do (entries 0..n-1, in order) -- so that its id columns need not be decoded; else None.

    Rows are stored in id order with unique ids, so a row group whose entry ids span exactly as
    many values as it has rows holds every entry from its smallest to its largest."""
    groups = row_group_ids(meta, row_groups)
    if groups is None:
        return None
    runs: list[np.ndarray] = []
    for g in groups:
        if g.min_ledger_id != g.max_ledger_id or g.max_entry_id - g.min_entry_id + 1 != g.rows:
            return None
        runs.append(bound(g.min_ledger_id, g.min_entry_id) + np.arange(g.rows, dtype=np.int64))
    return np.concatenate(runs) if runs else np.empty(0, dtype=np.int64)


def _with_ids(table: pa.Table, ids: np.ndarray, columns: Sequence[str]) -> pa.Table:
    """``table`` (without id columns) as a table of ``columns``, its id columns made from ``ids``."""
    made = {LEDGER_ID: pa.array(ids >> PACK_SHIFT), ENTRY_ID: pa.array(ids & ((1 << PACK_SHIFT) - 1))}
    return pa.table([made[c] if c in made else table.column(c) for c in columns], names=list(columns))


@dataclass(frozen=True)
class _Reading:
    """What :func:`_chunks` reads of one file, decided from its footer."""

    read: list[str]  # the columns of the tables it yields (before ``derive`` drops any)
    missing: list[str]  # ... that the file has no values of: nulls
    here: list[str]  # ... that it has
    decoded: list[str]  # ... that it decodes (the id columns may be made from statistics)
    row_groups: Sequence[int] | None  # None: all
    made: np.ndarray | None  # the packed ids of the rows read, when made from statistics


def _reading(
    segment: Segment, meta: pq.FileMetaData, read: list[str], only: np.ndarray | None, deletes: bool
) -> _Reading | None:
    """What to read of ``segment``'s file (see :func:`_chunks`); None: none of its row groups."""
    row_groups: Sequence[int] | None = segment.row_groups
    # Skipping row groups would put the deletion vector's row numbers out of step.
    if only is not None and row_groups is None and not deletes:
        row_groups = _row_groups_with(meta, only)
        if row_groups is not None and not row_groups:
            return None
    made = _consecutive_ids(meta, row_groups) if not deletes and not segment.previous else None
    names = meta.schema.to_arrow_schema().names
    # Columns newer than the file (ledger.schema: only ever added at the end) are nulls, and
    # so are the columns the file declares without a value (not decoded).
    nulls = declared_null(meta.metadata)
    missing = [c for c in read if c not in names or c in nulls]
    here = [c for c in read if c not in missing]
    decoded = [c for c in here if c not in (LEDGER_ID, ENTRY_ID)] if made is not None else here
    return _Reading(read, missing, here, decoded, row_groups, made)


def _columns_read(segment: Segment, columns: list[str]) -> list[str]:
    if segment.derive_deletes and IS_TOMBSTONE in columns:
        return list(dict.fromkeys([*columns, KEY, VALUE]))
    return columns


def _select(segment: Segment, columns: list[str], only: np.ndarray | None) -> prefetch.Select:
    """What :func:`_chunks` reads of ``segment``'s file, as a footer shows it."""
    read = _columns_read(segment, columns)
    deletes = segment.deletes is not None

    def select(meta: pq.FileMetaData) -> tuple[list[str], Sequence[int] | None] | None:
        reading = _reading(segment, meta, read, only, deletes)
        return (reading.decoded, reading.row_groups) if reading is not None else None

    return select


# The properties map's leaves, which phase two reads as Arrow dictionaries (see
# :func:`_dictionary_properties`).
_PROPERTY_LEAVES = [f"{PROPERTIES}.key_value.key", f"{PROPERTIES}.key_value.value"]
# pyarrow's dictionary page limit (``dictionary_pagesize_limit``, which no writer of the
# service changes): a column chunk decoding to no more bytes cannot have outgrown its
# dictionary and gone on in plain pages.
_DICTIONARY_PAGE_LIMIT = 1 << 20
# Properties per row, on average, from which they are read as dictionaries.
_DICTIONARY_ENTRIES_PER_ROW = 2


def _dictionary_properties(meta: pq.FileMetaData) -> list[str] | None:
    """The properties map's leaves when every chunk of them in the file is dictionary-encoded
    throughout, and hold at least ``_DICTIONARY_ENTRIES_PER_ROW`` properties a row (None
    otherwise). Read as dictionaries, each row group's distinct strings are made once, not once
    per row (properties repeat: service names, schema versions), and the rows phase two drops
    are never made into strings at all: a third less time for the column (four properties a
    message: 0.25 s against 0.39 s a million rows). A chunk that fell back to plain pages would
    instead be hashed into a dictionary, at twice the cost of decoding it: such a file is read
    as before. Chunks are told apart by size (see ``_DICTIONARY_PAGE_LIMIT``): one that could
    have overflowed counts as one that did."""
    leaves = [i for i in range(meta.num_columns) if meta.schema.column(i).path in _PROPERTY_LEAVES]
    if len(leaves) != len(_PROPERTY_LEAVES):
        return None
    entries = 0
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for i in leaves:
            chunk = group.column(i)
            if not chunk.has_dictionary_page or chunk.total_uncompressed_size > _DICTIONARY_PAGE_LIMIT:
                return None
        entries += group.column(leaves[0]).num_values
    # An empty map still counts one entry; few properties are not worth a read per row group.
    return _PROPERTY_LEAVES if entries >= _DICTIONARY_ENTRIES_PER_ROW * meta.num_rows else None


def _read_as_dictionaries(f: pq.ParquetFile) -> bool:
    """Whether ``f`` was opened to read the properties as dictionaries."""
    names = f.schema_arrow.names
    if PROPERTIES not in names:
        return False
    kind = f.schema_arrow.field(PROPERTIES).type
    return isinstance(kind, pa.MapType) and pa.types.is_dictionary(kind.key_type)


def _decoded(f: pq.ParquetFile, reading: _Reading, rows: int) -> Iterator[pa.Table]:
    """The columns ``reading`` decodes of ``f``, in tables of about ``rows`` rows. pyarrow's
    batch reader refuses a nested column read as dictionaries across row groups (each has a
    dictionary of its own): then the properties are read one row group at a time, beside the
    batches of the other columns, and sliced to match them."""
    columns = reading.decoded
    groups = list(range(f.num_row_groups)) if reading.row_groups is None else list(reading.row_groups)
    others = [c for c in columns if c != PROPERTIES]
    if not (PROPERTIES in columns and others and _read_as_dictionaries(f)):
        for batch in f.iter_batches(batch_size=rows, columns=columns, row_groups=groups):
            yield pa.Table.from_batches([batch])
        return
    by_group = (f.read_row_group(g, columns=[PROPERTIES], use_threads=False).column(0) for g in groups)
    held: pa.ChunkedArray | None = None
    for batch in f.iter_batches(batch_size=rows, columns=others, row_groups=groups):
        n = batch.num_rows
        while held is None or len(held) < n:
            more = next(by_group).chunks
            held = pa.chunked_array([*(held.chunks if held is not None else []), *more])
        table = pa.Table.from_batches([batch])
        table = table.add_column(columns.index(PROPERTIES), PROPERTIES, held.slice(0, n))
        held = held.slice(n)
        yield table


def _open(
    segment: Segment, columns: list[str], only: np.ndarray | None = None, *, dictionaries: bool = False
) -> Future[pq.ParquetFile | None]:
    """The opening of ``segment``'s file for :func:`_chunks` (``columns``, ``only``,
    ``dictionaries`` as it is given them) on a thread of its own: on object storage its
    chunks are fetched meanwhile."""
    return prefetch.opening(
        segment.path,
        _select(segment, columns, only),
        footer=segment.footer_meta,
        dictionaries=_dictionary_properties if dictionaries else None,
        checksum=segment.checksum,
    )


def _opened_ahead(
    segments: Sequence[Segment],
    columns: list[str],
    only: Callable[[Segment], np.ndarray | None] | None = None,
    *,
    dictionaries: bool = False,
) -> Iterator[tuple[Segment, Future[pq.ParquetFile | None] | None]]:
    """``segments`` in order, each with its file's opening started ahead of the reader on
    object storage (None for a file on a local disk, where the page cache does it; a round
    may read both, the local copies of sealed ledgers among objects): up to
    :data:`_OPEN_AHEAD` files of :data:`_OPEN_AHEAD_BYTES` in all beyond the one it reads,
    which bounds the memory their fetched chunks take."""
    if all(s.path.local is not None for s in segments):
        yield from ((s, None) for s in segments)
        return
    started: collections.deque[tuple[int, Future[pq.ParquetFile | None] | None]] = collections.deque()
    started_bytes = 0
    upcoming = iter(segments)
    following = next(upcoming, None)
    for segment in segments:
        while following is not None and (
            not started
            or (
                len(started) <= _OPEN_AHEAD
                # The one being read (the first started) does not count against the bound.
                and started_bytes - started[0][0] + following.size <= _OPEN_AHEAD_BYTES
            )
        ):
            opening: Future[pq.ParquetFile | None] | None = None
            size = 0
            if following.path.local is None:
                wanted = only(following) if only is not None else None
                opening = _open(following, columns, wanted, dictionaries=dictionaries)
                size = following.size
            started.append((size, opening))
            started_bytes += size
            following = next(upcoming, None)
        size, opened = started.popleft()
        started_bytes -= size
        yield segment, opened


def _chunks(
    segment: Segment,
    columns: list[str],
    *,
    only: np.ndarray | None = None,
    opened: Future[pq.ParquetFile | None] | None = None,
    dictionaries: bool = False,
) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """The segment's live rows in its id range, in order, a bounded chunk at a time (a
    compacted part can be large), with their packed ids. ``columns`` must include both id
    columns. Rows its layer's deletion vector marks dead are left out. With ``only`` (sorted
    packed ids), row groups that hold none of them are not read (their rows are left out too:
    the caller wants only those ids). The id columns of a sealed ledger are made from its
    statistics rather than decoded (see :func:`_consecutive_ids`). ``dictionaries``: the
    properties come as dictionaries where the file allows (see
    :func:`_dictionary_properties`), so chunks of different files may differ in that column's
    type. ``opened``: the file's opening, started by :func:`_open` with the same ``columns``,
    ``only`` and ``dictionaries``."""
    derive = segment.derive_deletes and IS_TOMBSTONE in columns
    read = _columns_read(segment, columns)
    dead = (
        deletion_vectors.read_cached(segment.deletes, segment.deletes_rows)
        if segment.deletes is not None
        else None
    )
    row = segment.first_row
    try:
        if opened is not None:
            f = opened.result()
        else:
            f = prefetch.open_parquet(
                segment.path,
                _select(segment, columns, only),
                footer=segment.footer_meta,
                dictionaries=_dictionary_properties if dictionaries else None,
                checksum=segment.checksum,
            )
    except Exception as e:
        raise damage_of(segment.path, e, opening=True) or e from e
    if f is None:
        return
    with f:
        reading = _reading(segment, f.metadata, read, only, dead is not None)
        if reading is None:
            return
        made, here, missing = reading.made, reading.here, reading.missing
        at = 0
        decoded = _decoded(f, reading, _chunk_rows(f.metadata, read))
        while True:
            try:
                table = next(decoded)
            except StopIteration:
                break
            except Exception as e:
                # One line naming the file and the check: the service reports it as the round's error.
                raise damage_of(segment.path, e) or e from e
            if made is not None:
                table = _with_ids(table, made[at : at + table.num_rows], here)
                at += table.num_rows
            if missing:
                table = conform(table, read)
            if dead is not None:
                live = ~dead[row : row + table.num_rows]
                row += table.num_rows
                if not live.all():
                    table = table.filter(pa.array(live))
            if derive:
                flags = derived_delete_flags(table.column(KEY), table.column(VALUE))
                table = table.set_column(table.schema.get_field_index(IS_TOMBSTONE), IS_TOMBSTONE, flags)
                table = table.select(columns)
            ids = packed(table.column(LEDGER_ID), table.column(ENTRY_ID))
            if len(ids) and (ids[0] <= segment.lo or ids[-1] > segment.hi):
                mask = (ids > segment.lo) & (ids <= segment.hi)
                table, ids = table.filter(pa.array(mask)), ids[mask]
            if table.num_rows:
                yield table, ids


@dataclass(frozen=True)
class IndexedPart:
    """A part of an older layer in a delta round: its key index, its layer (by position in the
    manifest) and the layer row number of its first row."""

    keys: StoragePath
    layer: int
    first_row: int
    # The part's rows, as the manifest says: its index must hold as many.
    rows: int
    # Its key index's CRC32C, as the manifest says (None in older manifests).
    checksum: str | None = None


def _bool_numpy(array: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


@dataclass(frozen=True)
class RoundPlan:
    """What every task of a round needs to know (pickled into the tasks)."""

    groups: tuple[tuple[Segment, ...], ...]
    out_dir: StoragePath  # where part files go
    scratch_dir: StoragePath  # where phase one leaves its partials for phase two (inside out_dir)
    row_group_bytes: int
    retain_null_key: bool
    keep_tombstones_since: int | None  # delete retention: tombstones published since are kept
    # A delta round: the parts of the older layers, whose rows the new keys supersede.
    indexed: tuple[IndexedPart, ...] = ()
    # How many tasks share the probe of those parts' key indexes (see :func:`probe`), each an
    # equal run of their rows; tasks past the groups' only probe. 0 when nothing is indexed.
    probe_tasks: int = 0
    # Whether part files compress their value column (not when the input's values do not
    # compress: see INCOMPRESSIBLE_RATIO).
    compress_values: bool = True

    @property
    def tasks(self) -> int:
        """Tasks of a job of this round: one per group, and as many as share the probe."""
        return max(len(self.groups), self.probe_tasks)

    def partial_path(self, group: int) -> StoragePath:
        return self.scratch_dir / f"partial-{group:05d}.arrow"

    def part_path(self, group: int) -> StoragePath:
        return self.out_dir / f"part-{group:05d}.parquet"

    def make_out_dir(self) -> None:
        """On a local disk, create the directory the parts go to (an object store has none)."""
        local = self.out_dir.local
        if local is not None:
            local.mkdir(parents=True, exist_ok=True)


def _for_tasks_of(plan: RoundPlan, groups: Iterable[int]) -> RoundPlan:
    """``plan`` as a job whose tasks open only the files of ``groups`` should ship it: the
    other groups' footers left out. A job's closure goes to every one of its tasks through the
    JVM, and with forty ledgers the footers are about 430 KB: measured, each such job cost the
    JVM ~20 ms more CPU, and its tasks started ~14 ms later, than a job without them."""
    keep = set(groups)
    return replace(
        plan,
        groups=tuple(
            g if i in keep else tuple(replace(s, footer=None) if s.footer is not None else s for s in g)
            for i, g in enumerate(plan.groups)
        ),
    )


@dataclass(frozen=True)
class TaskResult:
    """What the tasks of a round hand back to the driver, through Spark's own task results:
    a few numbers and, in a delta round, row numbers -- never rows. The rows read and
    written; the longest phase one of a task (seconds); on object storage the manifest lines
    of the parts written (``PartInfo``, made from the staging files, so that the driver need
    not read the parts and their indexes back); and the older layers' rows a delta round's
    probe found dead, by layer (each share probes its own rows: no row is found twice)."""

    rows_read: int = 0
    rows_written: int = 0
    phase_one_s: float = 0.0
    parts: tuple[PartInfo, ...] = ()
    dead: dict[int, np.ndarray] = field(default_factory=dict)
    # The groups whose part a task that ran both phases wrote (see :func:`full_round`).
    written: tuple[int, ...] = ()

    @staticmethod
    def of(results: Iterable[TaskResult]) -> TaskResult:
        """The results of several tasks as one."""
        done = list(results)
        found: dict[int, list[np.ndarray]] = {}
        for r in done:
            for layer, rows in r.dead.items():
                found.setdefault(layer, []).append(rows)
        return TaskResult(
            rows_read=sum(r.rows_read for r in done),
            rows_written=sum(r.rows_written for r in done),
            phase_one_s=max((r.phase_one_s for r in done), default=0.0),
            parts=tuple(p for r in done for p in r.parts),
            dead={layer: np.concatenate(rows) if len(rows) > 1 else rows[0] for layer, rows in found.items()},
            written=tuple(g for r in done for g in r.written),
        )


# ---------------------------------------------------------------------------- phase one


def _partial_schema(with_publish_time: bool) -> pa.Schema:
    fields = [pa.field(P_KEY, pa.string()), pa.field(P_ID, pa.int64()), pa.field(P_TOMBSTONE, pa.bool_())]
    if with_publish_time:
        fields.append(pa.field(P_PUBLISH_TIME, pa.int64()))
    return pa.schema(fields)


def _latest_encoded(schema: pa.Schema, tables: Iterator[pa.Table]) -> pa.Table:
    """Each key's greatest encoded id over ``tables`` (``schema``: key, encoded id), as one
    streaming hash aggregation: each chunk is folded into one hash table as it is decoded, so
    memory holds the keys' winners and a chunk, not every chunk of the group (which, with
    long keys, is hundreds of megabytes the kernel must first hand over, and costs more to
    get than to aggregate)."""
    batches = (batch for table in tables for batch in table.to_batches())
    reader = pa.RecordBatchReader.from_batches(schema, batches)
    plan = acero.Declaration.from_sequence(
        [
            acero.Declaration("record_batch_reader_source", acero.RecordBatchReaderSourceNodeOptions(reader)),
            acero.Declaration(
                "aggregate",
                acero.AggregateNodeOptions([(_ENCODED, "hash_max", None, _ENCODED)], keys=[P_KEY]),
            ),
        ]
    )
    return plan.to_table(use_threads=False).select([P_KEY, _ENCODED]).cast(schema)


def _partial(plan: RoundPlan, group: int) -> tuple[pa.Table, int]:
    """Group ``group``'s partial -- each key's latest row among the group's new segments
    (key, id, tombstone flag[, publish time]), plus every live keyless row when keyless rows
    are retained (key null: they are never deduplicated) -- and how many rows it read."""
    retention = plan.keep_tombstones_since is not None
    schema = _partial_schema(retention)
    columns = [LEDGER_ID, ENTRY_ID, KEY, IS_TOMBSTONE] + ([PUBLISH_TIME] if retention else [])
    segments = [s for s in plan.groups[group] if not s.previous]
    # Without delete retention, a key's latest row is its greatest ``id << 1 | tombstone``:
    # one column and a plain hash "max", which costs half of the ordered "last" of each column.
    encoded = not retention and all(s.hi < _ENCODABLE_IDS for s in segments)
    folding = pa.schema([pa.field(P_KEY, pa.string()), pa.field(_ENCODED, pa.int64())]) if encoded else schema
    keyless: list[pa.Table] = []
    rows_read = 0

    def narrow() -> Iterator[pa.Table]:
        """The rows to aggregate, chunk by chunk (keyless rows kept aside on the way)."""
        nonlocal rows_read
        for segment, opened in _opened_ahead(segments, columns):
            for table, ids in _chunks(segment, columns, opened=opened):
                rows_read += table.num_rows
                keys = table.column(KEY)
                tombstone = table.column(IS_TOMBSTONE)
                if keys.null_count and plan.retain_null_key:
                    live = _bool_numpy(keys.is_null()) & ~_bool_numpy(tombstone)
                    keyless.append(
                        pa.table(
                            [keys, pa.array(ids, pa.int64()), tombstone]
                            + ([table.column(PUBLISH_TIME)] if retention else []),
                            schema=schema,
                        ).filter(pa.array(live))
                    )
                # Keyless rows stay in: they aggregate into one group of key null, dropped once
                # at the end -- cheaper than filtering them out of every chunk.
                if encoded:
                    yield pa.table(
                        [keys, pa.array((ids << 1) | _bool_numpy(tombstone), pa.int64())], schema=folding
                    )
                else:
                    yield pa.table(
                        [keys, pa.array(ids, pa.int64()), tombstone]
                        + ([table.column(PUBLISH_TIME)] if retention else []),
                        schema=schema,
                    )

    folded: pa.Table | None
    if encoded:
        folded = _latest_encoded(folding, narrow())
    else:
        folded = None
        pending: list[pa.Table] = []
        pending_rows = 0

        def fold(tables: list[pa.Table]) -> pa.Table:
            # Rows in id order and one thread: "last" is each key's row with the latest id.
            rows = pa.concat_tables(tables)
            agg = rows.group_by(P_KEY, use_threads=False).aggregate([(n, "last") for n in schema.names[1:]])
            return pa.table(
                [agg.column(P_KEY), *(agg.column(f"{n}_last") for n in schema.names[1:])], schema=schema
            )

        for rows in narrow():
            pending.append(rows)
            pending_rows += rows.num_rows
            if pending_rows >= _FOLD_ROWS:
                folded = fold([folded, *pending] if folded is not None else pending)
                pending, pending_rows = [], 0
        if pending:
            folded = fold([folded, *pending] if folded is not None else pending)
    if folded is not None and folded.column(P_KEY).null_count:
        folded = folded.filter(pc.is_valid(folded.column(P_KEY)))
    if encoded and folded is not None:
        v = np.asarray(folded.column(_ENCODED).to_numpy(), dtype=np.int64)
        folded = pa.table(
            [folded.column(P_KEY), pa.array(v >> 1, pa.int64()), pa.array((v & 1).astype(bool))],
            schema=schema,
        )
    parts = ([folded] if folded is not None else []) + keyless
    return (pa.concat_tables(parts) if parts else schema.empty_table()), rows_read


def group_latest(plan: RoundPlan, group: int) -> int:
    """Runs in a task: write group ``group``'s partial (see :func:`_partial`) to the scratch
    directory. Returns how many rows it read."""
    partial, rows_read = _partial(plan, group)
    _write_partial(plan, group, partial)
    return rows_read


def _write_partial(plan: RoundPlan, group: int, partial: pa.Table) -> None:
    """``partial`` as group ``group``'s partial file, seen whole or not at all (a reader may
    be waiting for it: see :func:`_latest_then_write`)."""
    schema = partial.schema
    target = plan.partial_path(group)
    local = target.local
    if local is None:
        with target.writer() as out, pa.ipc.new_file(out, schema) as writer:
            writer.write_table(partial)
        return
    tmp = _attempt_path(local, plan.scratch_dir)
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(partial)
    os.replace(tmp, local)  # scratch: no fsync, a crash discards the round


def phase_one(spark: SparkSession, plan: RoundPlan) -> int:
    """Write the partial of every group (one task per group); returns the rows read."""
    return sum(_per_group(spark, plan, group_latest))


# How long a task of :func:`full_round` waits for the later groups' partials, at least; and
# at most as long again as its own phase one took, which theirs should take too.
_IN_TASK_WAIT_MIN_S = 0.5

# How often a waiting task looks for a partial: a file on a local disk, a HEAD request on
# object storage.
_AWAIT_LOCAL_S = 0.002
_AWAIT_OBJECT_S = 0.02


def _await_files(paths: Sequence[StoragePath], seconds: float) -> bool:
    """Whether every one of ``paths`` is there within ``seconds``."""
    if not paths:
        return True
    deadline = time.monotonic() + seconds
    pause = _AWAIT_LOCAL_S if all(p.local is not None for p in paths) else _AWAIT_OBJECT_S
    waiting = list(paths)
    while True:
        waiting = [p for p in waiting if not p.is_file()]
        if not waiting:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)


def _latest_then_write(plan: RoundPlan, group: int) -> TaskResult:
    """Runs in a task: group ``group``'s partial, written for the earlier groups, then its
    phase two in the same task once every later group's partial is there (not when they do
    not come in time: see :func:`full_round`)."""
    later = [plan.partial_path(h) for h in range(group + 1, len(plan.groups))]
    return _both_phases(
        plan,
        group,
        _partial_keys(plan),
        publish=True,
        ready=lambda phase_one_s: _await_files(later, max(_IN_TASK_WAIT_MIN_S, phase_one_s)),
    )


def full_round(spark: SparkSession, plan: RoundPlan) -> TaskResult:
    """Both phases of every group in one job, one task each, in reverse group order: task 0
    runs the last group, whose part needs no other group's keys, so it never waits; every
    other task writes its partial and then waits for the later groups'. Spark launches a
    job's tasks in task order, so each task waits only for groups whose tasks started before
    its own, and every wait ends while the tasks run at once. With fewer cores than tasks a
    later group's task may not be running yet: a task waits at most as long as its own phase
    one took (half a second at least) and then leaves its phase two to :func:`phase_two`
    (the result's ``written`` lists the groups done)."""
    if plan.probe_tasks:
        raise ValueError("a delta round's probe needs its own job: see full_round_fits()")
    order = range(len(plan.groups) - 1, -1, -1)
    return TaskResult.of(_per_group(spark, plan, _latest_then_write, groups=order))


def full_round_fits(plan: RoundPlan) -> bool:
    """Whether :func:`full_round` can run the round: not a delta round's, whose probe tasks
    read every group's keys and mark dead rows in the older layers before any part is
    written."""
    return plan.probe_tasks == 0


def _both_phases(
    plan: RoundPlan,
    group: int,
    later: KeySets,
    *,
    publish: bool = False,
    ready: Callable[[float], bool] | None = None,
) -> TaskResult:
    """Both phases of group ``group`` in the calling task: its partial, kept in memory, then
    its part, the later groups' key sets from ``later``. ``publish``: the partial is also
    written, before the part, for other tasks to read its keys. ``ready(phase one's
    seconds)``, when given, decides whether phase two runs at all: if not, the result counts
    the rows read and names no group in ``written``."""
    t0 = time.perf_counter()
    own, rows_read = _partial(plan, group)
    if publish:
        _write_partial(plan, group, own)
    own_keys = own.column(P_KEY).combine_chunks()
    phase_one_s = time.perf_counter() - t0
    if ready is not None and not ready(phase_one_s):
        return TaskResult(rows_read=rows_read, phase_one_s=phase_one_s)
    written = _write_group(plan, group, own, lambda h: own_keys if h == group else later(h))
    return replace(written, rows_read=rows_read, phase_one_s=phase_one_s, written=(group,))


# The codec of what a job carries to its tasks: zstd makes a plan of forty ledgers' footers
# (430 KB, much alike) ten times smaller in a millisecond.
_PACK_CODEC = "zstd"


@dataclass(frozen=True)
class _Packed(Generic[T]):
    """An object as a job's closure carries it to every task: pickled and compressed once in
    the driver. A closure crosses py4j, the JVM and each task's socket as bytes, and a full
    round's plan is mostly footers: 430 KB cost the JVM ~20 ms of CPU per job."""

    data: bytes
    size: int

    @staticmethod
    def of(value: T) -> _Packed[T]:
        raw = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return _Packed(pa.Codec(_PACK_CODEC).compress(raw, asbytes=True), len(raw))

    def unpack(self) -> T:
        raw = pa.Codec(_PACK_CODEC).decompress(self.data, decompressed_size=self.size, asbytes=True)
        return pickle.loads(raw)  # type: ignore[no-any-return]


# Per SparkContext, an RDD of the group numbers ``0 .. n-1`` in ``n`` partitions, by ``n``:
# building one costs a round trip through a file, reusing it costs nothing.
_GROUP_RDDS: weakref.WeakKeyDictionary[SparkContext, dict[int, RDD[int]]] = weakref.WeakKeyDictionary()
_GROUP_RDDS_LOCK = threading.Lock()


def _group_rdd(spark: SparkSession, n: int) -> RDD[int]:
    sc = spark.sparkContext
    with _GROUP_RDDS_LOCK:
        by_n = _GROUP_RDDS.setdefault(sc, {})
        if n not in by_n:
            by_n[n] = sc.parallelize(range(n), n)
        return by_n[n]


def _per_group(
    spark: SparkSession,
    plan: RoundPlan,
    work: Callable[[RoundPlan, int], T],
    tasks: int | None = None,
    *,
    first: int = 0,
    groups: Sequence[int] | None = None,
) -> list[T]:
    """``work(plan, first + t)`` for every task ``t`` (by default one per group), or
    ``work(plan, groups[t])``, one Spark task each; their results, in order."""
    chosen = tuple(groups) if groups is not None else None
    packed = _Packed.of(plan)

    def task(numbers: Iterable[int]) -> Iterable[T]:
        unpacked = packed.unpack()
        for t in numbers:
            yield work(unpacked, chosen[t] if chosen is not None else first + t)

    n = len(chosen) if chosen is not None else len(plan.groups) if tasks is None else tasks
    if n == 0:
        return []
    return _group_rdd(spark, n).mapPartitions(task).collect()


# ---------------------------------------------------------------------------- phase two


def _read_partial(plan: RoundPlan, group: int, columns: list[str]) -> pa.Table:
    """Group ``group``'s partial (``FileNotFoundError`` if it has none): memory-mapped on a
    local disk, read whole in one request from object storage."""
    path = plan.partial_path(group)
    local = path.local
    if local is None:
        return pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all().select(columns)
    with pa.memory_map(str(local)) as source:
        return pa.ipc.open_file(source).read_all().select(columns)


def _publish_time(plan: RoundPlan) -> list[str]:
    return [P_PUBLISH_TIME] if plan.keep_tombstones_since is not None else []


# The keys of group h's partial (None when it has none), for h at or after the writing group.
KeySets = Callable[[int], "pa.Array | None"]


def _cached(key_sets: KeySets) -> KeySets:
    """``key_sets`` computing each group's set once per task (they are asked for per chunk)."""
    return functools.lru_cache(maxsize=None)(key_sets)


def _partial_keys(plan: RoundPlan) -> KeySets:
    """Key sets read from the partials phase one wrote."""

    def keys(h: int) -> pa.Array | None:
        try:
            return _read_partial(plan, h, [P_KEY]).column(P_KEY).combine_chunks()
        except FileNotFoundError:
            return None

    return _cached(keys)


def _in_any(keys: pa.ChunkedArray, key_sets: KeySets, groups: Iterable[int]) -> np.ndarray:
    """Which of ``keys`` appear in the key set of any of ``groups`` (null keys never do).
    One key set in memory at a time."""
    found = np.zeros(len(keys), dtype=bool)
    for h in groups:
        if not len(keys):
            break
        other = key_sets(h)
        if other is not None and len(other):
            found |= _bool_numpy(pc.is_in(keys, value_set=other, skip_nulls=True))
    return found


def _winners(plan: RoundPlan, group: int, own: pa.Table, key_sets: KeySets) -> pa.Table:
    """The rows of ``group``'s partial ``own`` that are their key's latest overall and are
    kept (key, id), sorted by id."""
    keep = ~_bool_numpy(own.column(P_TOMBSTONE))
    if plan.keep_tombstones_since is not None:
        # Kafka's delete.retention.ms: a recent delete stays visible to slow readers.
        published = np.asarray(own.column(P_PUBLISH_TIME).to_numpy(), dtype=np.int64)
        keep |= published >= plan.keep_tombstones_since
    # A key in a later group has a later row there.
    keep &= ~_in_any(own.column(P_KEY), key_sets, range(group + 1, len(plan.groups)))
    # One gather of the kept rows in id order (with long keys, copying keys is the cost: a
    # filter before the sort would copy them twice). Ids are unique, so a sort that is not
    # stable orders them exactly, at a quarter of a stable sort's cost.
    rows = np.flatnonzero(keep)
    ids = np.asarray(own.column(P_ID).to_numpy(), dtype=np.int64)[rows]
    return own.select([P_KEY, P_ID]).take(pa.array(rows[np.argsort(ids)]))


def _kept_mask(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Which of ``ids`` (sorted, unique) are in ``wanted`` (sorted, unique)."""
    if not len(wanted) or not len(ids):
        return np.zeros(len(ids), dtype=bool)
    first = int(ids[0])
    span = int(ids[-1]) - first + 1
    if span <= _BITMAP_SPAN_PER_ROW * len(ids):
        inside = wanted[(wanted >= first) & (wanted <= ids[-1])] - first
        bitmap = np.zeros(span, dtype=bool)
        bitmap[inside] = True
        return bitmap[ids - first]
    at = np.searchsorted(wanted, ids)
    return wanted[np.minimum(at, len(wanted) - 1)] == ids


def _previous_rows_kept(
    table: pa.Table, superseded: Callable[[pa.ChunkedArray], np.ndarray], plan: RoundPlan
) -> np.ndarray:
    """Rows of the previous compacted ledger that stay: their key has no newer row, and they
    are not a tombstone past its retention, nor keyless when keyless rows are not retained."""
    key = table.column(KEY)
    tomb = _bool_numpy(table.column(IS_TOMBSTONE))
    keep = ~superseded(key)
    if plan.keep_tombstones_since is None:
        keep &= ~tomb
    else:
        published = np.asarray(table.column(PUBLISH_TIME).to_numpy(), dtype=np.int64)
        keep &= ~tomb | (published >= plan.keep_tombstones_since)
    if not plan.retain_null_key:
        keep &= ~_bool_numpy(key.is_null())
    return keep


def _attempt_path(path: Path, scratch_dir: StoragePath) -> str:
    """Where a task writes a file before renaming it to ``path`` (on a local disk): a name of
    its own in the scratch directory, so that two attempts of one task (a retry, a speculative
    copy) never write the same file, and a reader never sees a half-written one. (On object
    storage an upload is whole or absent, and two attempts' uploads hold the same rows.)"""
    scratch = scratch_dir.local
    assert scratch is not None, "attempt files are for a local disk"
    scratch.mkdir(parents=True, exist_ok=True)
    return str(scratch / f"{path.name}.{os.getpid()}-{uuid.uuid4().hex}")


class _PartWriter:
    """One output part file, created on its first row. Rows are buffered into row groups of
    about ``row_group_bytes`` (a page read decodes one row group, so they should be neither
    tiny nor huge) and encoded by a thread of their own while the task reads on (pyarrow
    releases the GIL; the part holding the latest rows is the largest by far, so its task
    would otherwise finish long after the others). On close the file is put in place, and so
    is its key index (``ledger.key_index``), built from the rows as they pass: on a local disk
    fsynced and renamed from the attempt's own name (see :func:`_attempt_path`); on object
    storage written to a local staging file and uploaded (``StoragePath.publish``)."""

    # Row groups handed to the encoding thread but not yet written, at most.
    _IN_FLIGHT = 2

    def __init__(
        self,
        path: StoragePath,
        scratch_dir: StoragePath,
        row_group_bytes: int,
        options: dict[str, object] = PART_WRITER_OPTIONS,
    ) -> None:
        self.path = path
        self.options = options
        self.scratch_dir = scratch_dir
        self.row_group_bytes = row_group_bytes
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._tmp = ""
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="part-writer")
        self._in_flight: collections.deque[Future[None]] = collections.deque()
        # The key index's columns, chunk by chunk, in row order.
        self._keys: list[pa.Array] = []
        self._tombstones: list[np.ndarray] = []
        self._publish_times: list[np.ndarray] = []
        # The sparse columns without a value in any row so far (declared in the footer).
        self._null = set(SPARSE_COLUMNS)
        # The ids of the first and the last row written.
        self._first: Position | None = None
        self._last: Position | None = None
        # On object storage, once closed: the part's manifest line (see :meth:`_described`).
        self.described: PartInfo | None = None

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        table = table.cast(ARROW_SCHEMA)
        self._keys.extend(table.column(KEY).chunks)
        self._tombstones.append(_bool_numpy(table.column(IS_TOMBSTONE)))
        if self._first is None:
            self._first = Position(table.column(LEDGER_ID)[0].as_py(), table.column(ENTRY_ID)[0].as_py())
        self._last = Position(table.column(LEDGER_ID)[-1].as_py(), table.column(ENTRY_ID)[-1].as_py())
        self._publish_times.append(np.asarray(table.column(PUBLISH_TIME).to_numpy(), dtype=np.int64))
        self._null = still_null(self._null, table)
        self._pending.append(table)
        self._pending_bytes += table.nbytes
        self.rows += table.num_rows
        if self._pending_bytes >= self.row_group_bytes:
            self._flush(final=False)

    def _flush(self, *, final: bool) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        per_group = max(1, self.row_group_bytes * table.num_rows // max(1, self._pending_bytes))
        # Whole row groups now; the rest waits for more rows, unless this is the end.
        now = table.num_rows if final else table.num_rows // per_group * per_group
        if self._writer is None:
            self._tmp = self._staging(self.path)
            self._writer = pq.ParquetWriter(self._tmp, ARROW_SCHEMA, **self.options)  # type: ignore[arg-type]
        while len(self._in_flight) >= self._IN_FLIGHT:
            self._in_flight.popleft().result()  # raises what the encoder raised
        self._in_flight.append(
            self._encoder.submit(self._writer.write_table, table.slice(0, now), row_group_size=per_group)
        )
        rest = table.slice(now)
        self._pending = [rest] if rest.num_rows else []
        self._pending_bytes = self._pending_bytes * rest.num_rows // table.num_rows

    def close(self) -> int:
        try:
            self._flush(final=True)
            if self._writer is not None:
                self._finish(self._writer)
        finally:
            self._encoder.shutdown()
        return self.rows

    def _finish(self, writer: pq.ParquetWriter) -> None:
        """Close the part and put it and its key index in place. The encoding thread ends the
        part (its last row groups, its footer, and its fsync on a local disk or its upload to
        object storage) while this thread builds the index and puts it in place: the index
        and the part's last bytes are written and made durable at the same time. On a local
        disk the part is renamed into place after its index (a part is never without it); in
        a bucket nothing is seen before the round's commit names it."""
        in_flight = list(self._in_flight)
        self._in_flight.clear()

        def end_part() -> tuple[int, str] | None:
            for pending in in_flight:  # done: this thread ran them first
                pending.result()  # raises what the encoder raised
            writer.add_key_value_metadata(null_columns_metadata(self._null))
            writer.close()
            staged = self._staged_part()  # before the upload, which removes the staging file
            local = self.path.local
            if local is None:
                self.path.publish(Path(self._tmp))
            else:
                fsync_path(Path(self._tmp))
            return staged

        ending = self._encoder.submit(end_part)
        try:
            keys_checksum = self._write_index()
            staged = ending.result()
            local = self.path.local
            if local is not None:
                os.replace(self._tmp, local)  # the round's directory is fsynced by the driver
        except BaseException:
            with contextlib.suppress(BaseException):
                ending.result()  # the staging file is the encoding thread's until it is done
            unstage(Path(self._tmp))  # a staging file outside the round's directory too
            raise
        # After the part and its index: a description names only files that are there.
        self.described = self._described(staged, keys_checksum)

    def _staged_part(self) -> tuple[int, str] | None:
        """On object storage, the staged part's size and CRC32C (None on a local disk, and
        where this process has no CRC32C library: see :meth:`_described`)."""
        if self.path.local is not None:
            return None
        try:
            return os.path.getsize(self._tmp), file_checksum(self._tmp)
        except ImportError:
            return None

    def _described(self, staged: tuple[int, str] | None, keys_checksum: str | None) -> PartInfo | None:
        """On object storage, the part's manifest line, from its staging file (so that the
        driver need not download the part and its index again to describe them); None on a
        local disk (there the driver reads them from the page cache) and where this process has
        no CRC32C library (a cluster's executors may have only pyarrow, numpy and pandas)."""
        if staged is None or keys_checksum is None or self._first is None or self._last is None:
            return None
        size, checksum = staged
        return PartInfo(
            name=self.path.name,
            rows=self.rows,
            first=self._first,
            last=self._last,
            size=size,
            keys=key_index.index_name(self.path.name),
            checksum=checksum,
            keys_checksum=keys_checksum,
        )

    def _staging(self, path: StoragePath) -> str:
        """The local file ``path``'s bytes are written to before :meth:`_put` puts it in place."""
        local = path.local
        return _attempt_path(local, self.scratch_dir) if local is not None else str(path.staging())

    @staticmethod
    def _put(staged: str, path: StoragePath) -> None:
        """``staged`` made ``path``: fsynced and renamed on a local disk (the round's directory
        is fsynced by the driver), uploaded to object storage."""
        local = path.local
        if local is None:
            path.publish(Path(staged))
            return
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
        os.replace(staged, local)

    def _write_index(self) -> str | None:
        """The part's key index, in place before the part itself (a part is never without it).
        Returns its CRC32C on object storage (None on a local disk, or without a CRC32C library)."""
        index = key_index.build(
            pa.chunked_array(self._keys, pa.string()),
            np.concatenate(self._tombstones),
            np.concatenate(self._publish_times),
        )
        path = self.path.with_name(key_index.index_name(self.path.name))
        tmp = self._staging(path)
        checksum: str | None = None
        try:
            key_index.write(tmp, index)
            if path.local is None:
                with contextlib.suppress(ImportError):
                    checksum = file_checksum(tmp)
        except BaseException:
            unstage(Path(tmp))
            raise
        self._put(tmp, path)
        return checksum

    def abort(self) -> None:
        for pending in self._in_flight:
            pending.cancel()
        self._encoder.shutdown(wait=True)
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            unstage(Path(self._tmp))


def _previous_chunks(segments: Iterable[Segment]) -> Iterator[pa.Table]:
    """The rows of consecutive previous-ledger segments (often one row group each), in
    chunks of at least ``_CHUNK_ROWS`` rows but the last: each chunk costs a hash set of the
    superseding keys."""
    pending: list[pa.Table] = []
    rows = 0
    for segment in segments:
        for table, _ in _chunks(segment, list(ARROW_SCHEMA.names)):
            pending.append(table)
            rows += table.num_rows
            if rows >= _CHUNK_ROWS:
                yield pa.concat_tables(pending)
                pending, rows = [], 0
    if pending:
        yield pa.concat_tables(pending)


def write_part(
    plan: RoundPlan,
    group: int,
    wanted: np.ndarray,
    keys: pa.ChunkedArray | None = None,
    superseded: Callable[[pa.ChunkedArray], np.ndarray] | None = None,
) -> TaskResult:
    """Write group ``group``'s part: the rows of its segments whose packed id is in ``wanted``
    (sorted), plus the previous compacted ledger's rows kept by key (see
    :func:`_previous_rows_kept`). ``keys``, when given, are the keys of the ``wanted`` rows and
    the key column is not read again. Returns the rows written and, on object storage, the
    part's manifest line."""
    writer = _PartWriter(
        plan.part_path(group),
        plan.scratch_dir,
        plan.row_group_bytes,
        part_writer_options(compress_values=plan.compress_values),
    )
    segments = plan.groups[group]
    try:
        # The previous ledger's segments come first: its rows precede every new row.
        n_previous = next((i for i, s in enumerate(segments) if not s.previous), len(segments))
        previous = segments[:n_previous]
        if any(s.previous for s in segments[n_previous:]):
            raise ValueError("the previous ledger's segments must precede the new ones")
        if previous:
            if superseded is None:
                raise ValueError("a previous compacted part needs the keys that supersede its rows")
            for table in _previous_chunks(previous):
                writer.write(table.filter(pa.array(_previous_rows_kept(table, superseded, plan))))
        columns = _ALL_BUT_KEY if keys is not None else list(ARROW_SCHEMA.names)

        def span(segment: Segment) -> tuple[int, int]:
            lo, hi = np.searchsorted(wanted, [segment.lo, segment.hi], side="right")
            return int(lo), int(hi)

        # No kept row in a segment: it is not even read.
        reading = [s for s in segments[n_previous:] if span(s)[0] != span(s)[1]]
        # Few of the rows read are kept: their properties are read as dictionaries, made into
        # strings only for the kept rows (by the writer's cast).
        ahead = _opened_ahead(reading, columns, lambda s: wanted[slice(*span(s))], dictionaries=True)
        for segment, opened in ahead:
            lo, hi = span(segment)
            mine = wanted[lo:hi]
            at = lo
            for table, ids in _chunks(segment, columns, only=mine, opened=opened, dictionaries=True):
                mask = _kept_mask(ids, mine)
                kept = table.filter(pa.array(mask))
                if keys is not None and kept.num_rows:
                    kept = kept.add_column(_KEY_INDEX, ARROW_SCHEMA.field(KEY), keys.slice(at, kept.num_rows))
                at += kept.num_rows
                writer.write(kept)
            if at != hi:
                # Every wanted id was read from this very file in phase one.
                raise RuntimeError(f"{segment.path}: {hi - at} of the ids to keep are missing")
    except BaseException:
        writer.abort()
        raise
    written = writer.close()
    described = writer.described
    return TaskResult(rows_written=written, parts=(described,) if described is not None else ())


def _write_group(plan: RoundPlan, group: int, own: pa.Table, key_sets: KeySets) -> TaskResult:
    """Resolve group ``group``'s winners (its partial ``own`` against the later key sets)
    and write its part (see :func:`write_part`)."""
    winners = _winners(plan, group, own, key_sets)
    wanted = np.asarray(winners.column(P_ID).to_numpy(), dtype=np.int64)

    def superseded(keys: pa.ChunkedArray) -> np.ndarray:
        # A previous row is replaced by any new row of its key: this group's or a later one's.
        return _in_any(keys, key_sets, range(group, len(plan.groups)))

    return write_part(plan, group, wanted, winners.column(P_KEY), superseded)


def group_write(plan: RoundPlan, group: int) -> TaskResult:
    """Runs in a task: phase two of group ``group`` from the partials phase one wrote, beside
    the task's share of a delta round's probe (if any)."""
    key_sets = _partial_keys(plan)

    def write() -> TaskResult:
        own = _read_partial(plan, group, [P_KEY, P_ID, P_TOMBSTONE] + _publish_time(plan))
        return _write_group(plan, group, own, key_sets)

    written, dead = _beside_probe(plan, group, key_sets, write)
    return replace(written or TaskResult(), dead=dead)


def phase_two(spark: SparkSession, plan: RoundPlan, groups: Sequence[int] | None = None) -> TaskResult:
    """Write every group's part (one task per group), or those of ``groups`` (the others'
    written already by :func:`full_round`), from the partials.
    Tasks write only their own part and read only partials (and, in a delta round, their
    share of the older layers' key indexes)."""
    plan.make_out_dir()
    if groups is None:
        return TaskResult.of(_per_group(spark, plan, group_write, plan.tasks))
    return TaskResult.of(_per_group(spark, _for_tasks_of(plan, groups), group_write, groups=groups))


# ---------------------------------------------------------------------------- one job


def new_bytes(plan: RoundPlan) -> int:
    """Bytes of the round's new segments (not the previous compacted ledger's)."""
    return sum(s.size for g in plan.groups for s in g if not s.previous)


def fits_one_job(plan: RoundPlan) -> bool:
    """Whether both phases should run in one Spark job (:func:`both_phases`): with one group
    (nothing to exchange), or when the new segments are a small share of the round (an
    incremental round), so that every task reading the later groups' new keys itself costs
    less than a second job."""
    if len(plan.groups) == 1:
        return True
    total = sum(s.size for g in plan.groups for s in g)
    return _ONE_JOB_NEW_SHARE * len(plan.groups) * new_bytes(plan) <= total


def _new_keys(plan: RoundPlan, group: int) -> pa.Array | None:
    """Every key of group ``group``'s new segments (tombstones included)."""
    columns = [LEDGER_ID, ENTRY_ID, KEY]
    new = [s for s in plan.groups[group] if not s.previous]
    chunks = [
        c
        for s, opened in _opened_ahead(new, columns)
        for t, _ in _chunks(s, columns, opened=opened)
        for c in t.column(KEY).chunks
        if len(c)
    ]
    return pa.concat_arrays(chunks) if chunks else None


def group_round(plan: RoundPlan, group: int) -> TaskResult:
    """Runs in a task: both phases of group ``group``, computing the later groups' key sets
    from their new segments rather than from partials, beside the task's share of a delta
    round's probe (if any), which reads the new keys itself rather than wait for phase one."""
    new_keys = _cached(functools.partial(_new_keys, plan))  # shared by the task's two threads
    done, dead = _beside_probe(plan, group, new_keys, lambda: _both_phases(plan, group, new_keys))
    return replace(done or TaskResult(), dead=dead)


def _beside_probe(
    plan: RoundPlan, group: int, key_sets: KeySets, work: Callable[[], T]
) -> tuple[T | None, dict[int, np.ndarray]]:
    """``work()``, the task's own group's (None for a task that only probes), while the
    task's share of a delta round's probe (if it has one) runs on a thread of its own, and
    the rows that share found dead. Both spend their time in pyarrow's kernels, which release
    the GIL, so a small delta round's task (one group, often the round's only task) keeps two
    cores busy instead of one."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe") as side:
        probing = side.submit(_probe_all, plan, group, key_sets) if group < plan.probe_tasks else None
        done = work() if group < len(plan.groups) else None
        dead = probing.result() if probing is not None else {}
    return done, dead


def _probe_all(plan: RoundPlan, share: int, key_sets: KeySets) -> dict[int, np.ndarray]:
    """:func:`probe` of share ``share`` against every group's new keys."""
    return probe(plan, share, [k for h in range(len(plan.groups)) if (k := key_sets(h)) is not None])


def both_phases(spark: SparkSession, plan: RoundPlan) -> TaskResult:
    """Both phases in one job (one task per group)."""
    plan.make_out_dir()
    return TaskResult.of(_per_group(spark, plan, group_round, plan.tasks))


# ---------------------------------------------------------------------------- several rounds


class TaskFailed(Exception):
    """A task of a round that shared its Spark job with other rounds raised: ``str()`` is
    the error's one line; its cause carries the task's traceback (where a damaged file is
    named, as in a Spark error's text)."""

    def __init__(self, kind: str, message: str, trace: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.__cause__ = RuntimeError(trace)


def _timed_latest(plan: RoundPlan, group: int) -> TaskResult:
    t0 = time.perf_counter()
    rows_read = group_latest(plan, group)
    return TaskResult(rows_read=rows_read, phase_one_s=time.perf_counter() - t0)


# What a task of a shared job runs, by kind: both phases; phase one; phase two.
_SHARED_WORK: dict[str, Callable[[RoundPlan, int], TaskResult]] = {
    "both": group_round,
    "latest": _timed_latest,
    "write": group_write,
}


# A task's error as its driver reports it: the exception's type name, message and traceback.
_TaskError = tuple[str, str, str]


def _shared_job(
    spark: SparkSession, tasks: Sequence[tuple[int, int, str]], plans: dict[int, RoundPlan]
) -> tuple[dict[int, TaskResult], dict[int, Exception]]:
    """For every ``(r, t, kind)`` of ``tasks``, the work ``kind`` names on ``plans[r]``'s task
    ``t``, one Spark task each, all in one job. A task that raises fails its round only: its
    error is returned, not raised, so the other rounds' tasks finish and their results stand.
    Returns each round's results (as one) and the rounds that failed, with their first error."""

    packed = _Packed.of(plans)

    def task(indexes: Iterable[int]) -> Iterator[tuple[int, int, TaskResult | None, _TaskError | None]]:
        import traceback

        unpacked = packed.unpack()
        for n in indexes:
            r, t, kind = tasks[n]
            try:
                yield r, t, _SHARED_WORK[kind](unpacked[r], t), None
            except Exception as e:  # noqa: BLE001 - reported to the driver as its round's error
                yield r, t, None, (type(e).__name__, str(e), traceback.format_exc())

    for plan in plans.values():
        plan.make_out_dir()
    results: dict[int, list[TaskResult]] = {r: [] for r in plans}
    failed: dict[int, Exception] = {}
    if tasks:
        for r, _, value, error in sorted(
            _group_rdd(spark, len(tasks)).mapPartitions(task).collect(), key=lambda o: (o[0], o[1])
        ):
            if error is not None:
                failed.setdefault(r, TaskFailed(*error))
            elif value is not None:
                results[r].append(value)
    return {r: TaskResult.of(v) for r, v in results.items() if r not in failed}, failed


def many_rounds(
    spark: SparkSession, both: dict[int, RoundPlan], apart: dict[int, RoundPlan]
) -> dict[int, TaskResult | Exception]:
    """One job for several rounds (the partitions of a topic): the tasks of
    :func:`both_phases` for the rounds in ``both``, and of :func:`phase_one` for those in
    ``apart`` (whose phase two is :func:`many_writes`). Returns, by round, its tasks' result,
    or the exception that failed the round."""
    tasks = [(r, t, "both") for r, p in both.items() for t in range(p.tasks)]
    tasks += [(r, t, "latest") for r, p in apart.items() for t in range(len(p.groups))]
    results, failed = _shared_job(spark, tasks, {**both, **apart})
    return {**results, **failed}


def many_writes(spark: SparkSession, plans: dict[int, RoundPlan]) -> dict[int, TaskResult | Exception]:
    """Phase two of several rounds whose phase one :func:`many_rounds` ran, in one job;
    returns, by round, its tasks' result or the exception that failed it."""
    tasks = [(r, t, "write") for r, p in plans.items() for t in range(p.tasks)]
    results, failed = _shared_job(spark, tasks, plans)
    return {**results, **failed}


# ---------------------------------------------------------------------------- delta rounds


def probe_tasks(indexed: Sequence[IndexedPart], cores: int, probe_rows: int = PROBE_ROWS) -> int:
    """How many tasks share a delta round's probe: one per ``probe_rows`` indexed rows, at
    most one per core, at least one (none when nothing is indexed)."""
    if not indexed:
        return 0
    rows = sum(p.rows for p in indexed)
    return max(1, min(cores, -(-rows // probe_rows)))


def _probe_slices(plan: RoundPlan, share: int) -> Iterator[tuple[IndexedPart, int, int]]:
    """Share ``share``'s run of the indexed rows (all parts' rows in order, cut into
    ``probe_tasks`` equal runs): ``(part, first, stop)`` row ranges within parts."""
    total = sum(p.rows for p in plan.indexed)
    lo, hi = total * share // plan.probe_tasks, total * (share + 1) // plan.probe_tasks
    at = 0
    for part in plan.indexed:
        first, stop = max(lo - at, 0), min(hi - at, part.rows)
        if first < stop:
            yield part, first, stop
        at += part.rows


def probe(plan: RoundPlan, share: int, new_keys: Sequence[pa.Array]) -> dict[int, np.ndarray]:
    """Runs in a task of a delta round: the rows of the older layers that die, within the
    task's share of their key indexes (:func:`_probe_slices`), as layer row numbers by layer,
    for the driver to fold into deletion vectors (see :class:`TaskResult`).

    A row dies when one of ``new_keys`` (every group's new keys, tombstones included) is its
    key: every new row of a key is newer than every older layer's row. Rows no longer kept
    whatever the new keys die too: tombstones past their retention, and keyless rows once
    keyless rows are not retained. Only the key indexes are read, never the parts. Each row is
    in exactly one share, so the tasks probe the indexes once between them.
    """
    chunks = [k for k in new_keys if len(k)]
    wanted = pc.drop_null(pa.concat_arrays(chunks)) if chunks else pa.array([], pa.string())
    found: dict[int, list[np.ndarray]] = {}
    for part, first, stop in _probe_slices(plan, share):
        whole = key_index.read_cached(part.keys, rows=part.rows, checksum=part.checksum)
        index = whole.slice(first, stop - first)
        keys = index.column(key_index.KEY)
        dead = np.zeros(index.num_rows, dtype=bool)
        if len(wanted):
            dead |= _bool_numpy(pc.is_in(keys, value_set=wanted, skip_nulls=True))
        dead |= key_index.dead_tombstones(index, plan.keep_tombstones_since)
        if not plan.retain_null_key and keys.null_count:
            dead |= _bool_numpy(keys.is_null())
        rows = np.flatnonzero(dead)
        if len(rows):
            found.setdefault(part.layer, []).append(rows + part.first_row + first)
    return {layer: np.concatenate(rows) for layer, rows in found.items()}


def rows_frame(spark: SparkSession, segments: Sequence[Segment], columns: Sequence[str]) -> DataFrame:
    """The live rows of ``segments`` (deletion vectors applied), ``columns`` only, as a
    DataFrame: how the Spark SQL path reads the layers of a previous compacted ledger that
    has dead rows. One task per segment reads it with Arrow."""
    ddl = StructType.fromDDL(SPARK_DDL)
    assert isinstance(ddl, StructType)
    schema = StructType([f for f in ddl.fields if f.name in columns])
    names = [f.name for f in schema.fields]
    read = list(dict.fromkeys([LEDGER_ID, ENTRY_ID, *names]))
    chosen = tuple(segments)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i in batch.column(0).to_pylist():
                for table, _ in _chunks(chosen[i], read):
                    yield from table.select(names).to_batches()

    n = max(1, len(chosen))
    indexes = spark.range(0, len(chosen), 1, n).select(F.col("id").cast("int").alias("segment"))
    return indexes.mapInArrow(task, schema)


# ------------------------------------------------------- phase two after a Spark SQL phase one


def group_segments(segments: Sequence[Segment], groups: int) -> list[list[Segment]]:
    """Consecutive segments in at most ``groups`` groups of about equal bytes."""
    if not segments:
        return []
    total = sum(max(1, s.size) for s in segments)
    out: list[list[Segment]] = [[]]
    acc = 0
    for s in segments:
        if out[-1] and acc >= total * len(out) / groups and len(out) < groups:
            out.append([])
        out[-1].append(s)
        acc += max(1, s.size)
    return out


def group_bounds(groups: Sequence[Sequence[Segment]]) -> tuple[int, ...]:
    """The last id each group but the last may hold: an id goes to the first group whose bound
    is >= it."""
    return tuple(g[-1].hi for g in groups[:-1])


def label_column(ids: Column, bounds: Sequence[int], labels: Sequence[int]) -> Column:
    """The group label of packed ids, as a Spark expression."""
    index: Column = F.lit(0)
    for b in bounds:
        index = index + F.when(ids > F.lit(b), 1).otherwise(0)
    return F.element_at(F.array(*(F.lit(v) for v in labels)), index + 1).cast("int")


def spread_labels(spark: SparkSession, groups: int) -> tuple[int, ...]:
    """For each group, a label that Spark's hash partitioning into ``groups`` partitions sends
    to a partition of its own, so every group's part is written by a different task.

    (``repartition(n, col)`` places a row in ``pmod(hash(col), n)``; the SQL ``hash`` function is
    that same Murmur3 hash, so one tiny query finds such labels.)"""
    if groups <= 1:
        return tuple(range(groups))
    candidates = (
        spark.range(0, 64 * groups)
        .select(F.col("id").cast("int").alias(LABEL))
        .select(LABEL, F.expr(f"pmod(hash({LABEL}), {groups})").alias("p"))
        .groupBy("p")
        .agg(F.min(LABEL).alias(LABEL))
        .collect()
    )
    by_partition = {int(r["p"]): int(r[LABEL]) for r in candidates}
    if len(by_partition) < groups:
        return tuple(range(groups))  # cannot happen with 64 candidates per partition; stay correct
    # Labels must keep the groups' order: part files are named by group, not by label.
    return tuple(by_partition[p] for p in range(groups))


@dataclass(frozen=True)
class _ShuffledWrite:
    """The task of :func:`phase_two_from_ids`: writes the parts of the labels it receives."""

    plan: RoundPlan
    labels: tuple[int, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tables = [b for b in batches if b.num_rows]
        if not tables:
            return
        received = pa.Table.from_batches(tables)
        group_of = {label: g for g, label in enumerate(self.labels)}
        all_labels = received.column(LABEL).to_numpy()
        all_ids = received.column(ID).to_numpy()
        for label in np.unique(all_labels):
            g = group_of[int(label)]
            wanted = np.sort(all_ids[all_labels == label])
            written = write_part(self.plan, g, wanted)
            described = [json.dumps(p.to_json()) for p in written.parts]
            yield pa.record_batch(
                [
                    pa.array([g], pa.int32()),
                    pa.array([written.rows_written], pa.int64()),
                    pa.array([described[0] if described else None], pa.string()),
                ],
                names=["part", "rows", "described"],
            )


def phase_two_from_ids(
    spark: SparkSession, keep: DataFrame, plan: RoundPlan, labels: tuple[int, ...]
) -> TaskResult:
    """Phase two when phase one ran in Spark SQL (the event-time and property strategies):
    ``keep`` holds ``(label, id)`` for every id to keep; each is shuffled to its group's task,
    which writes the part (reading keys from the files)."""
    plan.make_out_dir()
    if not plan.groups:
        return TaskResult()
    shuffled = keep.repartition(len(plan.groups), LABEL)
    # One small row per part file comes back: counts and its manifest line, not data.
    written = shuffled.mapInArrow(_ShuffledWrite(plan, labels), WRITTEN_DDL).collect()
    return TaskResult(
        rows_written=sum(int(r["rows"]) for r in written),
        parts=tuple(PartInfo.from_json(json.loads(r["described"])) for r in written if r["described"]),
    )
