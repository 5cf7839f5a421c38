"""Reading a round's input: **segments**, the rows of one Parquet file within a packed-id range.

A segment is a part file of the previous compacted ledger or a sealed original ledger, with the
packed-id range it contributes, ``(lo, hi]``; every segment stores its rows in id order.
:func:`_chunks` reads a segment's live rows a bounded chunk at a time, with their packed ids: its
layer's deletion vector applied, row groups that hold no wanted id skipped, a sealed ledger's id
columns made from its statistics rather than decoded, and the properties read as Arrow
dictionaries where every chunk of them is dictionary-encoded. :func:`_opened_ahead` opens (on
object storage: fetches) the next files of a task while it reads one. A file's footer can come
with its segment from planning (:class:`ShippedFooter`).

Both phases, the part writer and the Spark SQL path's reader read their files through here.
"""

from __future__ import annotations

import collections
import pickle
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compactor.phases import PACK_SHIFT
from ledger import deletion_vectors, prefetch
from ledger.checksums import damage_of
from ledger.schema import (
    ENTRY_ID,
    IS_TOMBSTONE,
    KEY,
    LEDGER_ID,
    PROPERTIES,
    VALUE,
    conform,
    declared_null,
    derived_delete_flags,
)
from ledger.storage import StoragePath

# Rows decoded at a time from one file, at most; fewer when they are wide (see _chunk_rows).
_CHUNK_ROWS = 262_144
_MIN_CHUNK_ROWS = 8_192
_CHUNK_BYTES = 32 * 1024 * 1024
# Files a reader of several has opening (on object storage: fetching) beyond the one it reads:
# at most this many, of at most this many bytes in all (one at least).
_OPEN_AHEAD = 8
_OPEN_AHEAD_BYTES = 64 * 1024 * 1024


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


def _bool_numpy(array: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)
