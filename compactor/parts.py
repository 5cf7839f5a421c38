"""Writing a group's part file: the rows a round keeps, in id order, as Parquet with its key index.

How a part is encoded (:data:`PART_WRITER_OPTIONS`: LZ4; values their sealed ledgers could not
compress are left uncompressed), how it is put in place (:class:`_PartWriter`: on a local disk
written under the attempt's own name, fsynced and renamed; on object storage staged in a local
file and uploaded, whole or not at all), and which rows go in (:func:`write_part`: the wanted ids
of the group's segments, after the previous compacted ledger's rows kept by key). A table topic
with a JSON or Avro schema (``RoundPlan.value_schema``) gets its value's fields as typed columns
after the ledger's own (:func:`part_schema`, ``ledger.value_columns``), decoded from the values
of every part written: a previous part's typed columns are not copied, since the schema may
have changed since it was written.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compactor.round_plan import RoundPlan, TaskResult, _attempt_path
from compactor.segments import _CHUNK_ROWS, Segment, _bool_numpy, _chunks, _opened_ahead
from ledger import key_index
from ledger.checksums import file_checksum
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
    PUBLISH_TIME,
    SPARSE_COLUMNS,
    VALUE,
    null_columns_metadata,
    still_null,
)
from ledger.storage import StoragePath, unstage
from ledger.value_columns import ValueSchema

# Below this many ids per row of a chunk's id span, a kept-row mask is a bitmap over the span
# (original ledgers: consecutive entry ids); sparser ids are matched by binary search.
_BITMAP_SPAN_PER_ROW = 8
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
    """The Parquet column paths of ``schema`` (a map's are ``name.key_value.key`` / ``.value``,
    a list's ``name.list.element``, a struct's ``name.child``)."""
    return [path for f in schema for path in _paths(f.name, f.type)]


def _paths(prefix: str, kind: pa.DataType) -> list[str]:
    if pa.types.is_map(kind):
        return _paths(f"{prefix}.key_value.key", kind.key_type) + _paths(
            f"{prefix}.key_value.value", kind.item_type
        )
    if pa.types.is_list(kind):
        return _paths(f"{prefix}.list.element", kind.value_type)
    if pa.types.is_struct(kind):
        return [path for f in kind for path in _paths(f"{prefix}.{f.name}", f.type)]
    return [prefix]


def part_schema(value_schema: ValueSchema | None) -> pa.Schema:
    """The columns of a round's parts: the ledger's, and a table topic's typed value columns
    after them (``ledger.value_columns``; none without such a schema)."""
    typed = value_schema.columns() if value_schema is not None else None
    if typed is None:
        return ARROW_SCHEMA
    return pa.schema([*ARROW_SCHEMA, *typed], metadata=ARROW_SCHEMA.metadata)


def part_writer_options(
    *, compress_values: bool = True, schema: pa.Schema = ARROW_SCHEMA
) -> dict[str, object]:
    """How a compacted part with columns ``schema`` is written; ``compress_values=False``
    leaves its value column uncompressed (see ``INCOMPRESSIBLE_RATIO``), every other column
    as ``PART_WRITER_OPTIONS`` (a column a codec map leaves out would not be compressed)."""
    if compress_values:
        return PART_WRITER_OPTIONS
    codecs = {path: ("none" if path == VALUE else PART_CODEC) for path in _leaf_paths(schema)}
    return {**PART_WRITER_OPTIONS, "compression": codecs}


_KEY_INDEX = ARROW_SCHEMA.get_field_index(KEY)
_ALL_BUT_KEY = [name for name in ARROW_SCHEMA.names if name != KEY]


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
        value_schema: ValueSchema | None = None,
    ) -> None:
        self.path = path
        self.options = options
        # The part's columns: the ledger's, and a table topic's typed value columns.
        self.schema = part_schema(value_schema)
        self.value_schema = value_schema if self.schema is not ARROW_SCHEMA else None
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
        if self.value_schema is not None:
            typed = self.value_schema.decode(table.column(VALUE))
            table = pa.Table.from_arrays([*table.columns, *typed.columns], schema=self.schema)
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
            self._writer = pq.ParquetWriter(self._tmp, self.schema, **self.options)  # type: ignore[arg-type]
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
        part_writer_options(compress_values=plan.compress_values, schema=part_schema(plan.value_schema)),
        plan.value_schema,
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
