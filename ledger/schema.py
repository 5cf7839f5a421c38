"""The columns of a sealed ledger and of a compacted ledger (one schema for both).

Sealed original ledgers and compacted ledgers share this schema so that a compaction round
can read the previous compacted ledger and the new original ledgers as one input.
Rows are always stored in message-id order: ``(ledger_id, entry_id)`` ascending.

Columns are only ever added at the end, nullable (``batch_index``, ``batch_size``,
``producer_name``, ``sequence_id``, ``deliver_at_time``, ``ordering_key`` and ``schema_version``
came with Pulsar's binary protocol): a file written
before a column existed has the columns before it, and readers fill the missing ones with
nulls (:func:`present`, :func:`conform`), so no file is ever rewritten for a format change.

``is_tombstone`` holds Pulsar's delete rule (:func:`is_delete`): a keyed message whose value is
null or empty deletes its key. Files written since that rule carry ``DELETES_RULE`` in their
schema metadata; in a file without it (written when only a null value deleted) the flag says
nothing about empty values, and a reader derives it again from the key and value
(:func:`derived_delete_flags`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledger.entry import Entry, Record

LEDGER_ID = "ledger_id"
ENTRY_ID = "entry_id"
KEY = "key"
VALUE = "value"
IS_TOMBSTONE = "is_tombstone"
PROPERTIES = "properties"
PUBLISH_TIME = "publish_time"
EVENT_TIME = "event_time"
BATCH_INDEX = "batch_index"
BATCH_SIZE = "batch_size"
PRODUCER_NAME = "producer_name"
SEQUENCE_ID = "sequence_id"
DELIVER_AT_TIME = "deliver_at_time"
ORDERING_KEY = "ordering_key"
SCHEMA_VERSION = "schema_version"

# Schema metadata of every file whose ``is_tombstone`` follows :func:`is_delete`.
DELETES_RULE_KEY = b"compactor.deletes"
DELETES_RULE = b"null-or-empty-keyed"
# File metadata naming the columns that hold no value in any row of the file (comma-separated):
# a compaction round makes them nulls rather than decode them (a fifth of a sealed ledger's
# decoding, when every message was produced over REST; the round still checks every byte of
# its inputs). Reads for consumers decode every column, so that a damaged page is reported
# wherever it is. Files written before it say nothing: decoded as ever.
NULL_COLUMNS_KEY = b"compactor.null-columns"

COLUMNS = (
    LEDGER_ID,
    ENTRY_ID,
    KEY,
    VALUE,
    IS_TOMBSTONE,
    PROPERTIES,
    PUBLISH_TIME,
    EVENT_TIME,
    BATCH_INDEX,
    BATCH_SIZE,
    PRODUCER_NAME,
    SEQUENCE_ID,
    DELIVER_AT_TIME,
    ORDERING_KEY,
    SCHEMA_VERSION,
)
# The columns every file has; the ones after them may be missing from older files.
FIRST_COLUMNS = COLUMNS[:8]
# Nullable columns that are often null in every row of a file (see ``NULL_COLUMNS_KEY``).
SPARSE_COLUMNS = (EVENT_TIME, *COLUMNS[8:])
# What an entry is made of (``table_to_entries``): a reader of entries decodes only these.
ENTRY_COLUMNS = [c for c in COLUMNS if c != IS_TOMBSTONE]

ARROW_SCHEMA = pa.schema(
    [
        pa.field(LEDGER_ID, pa.int64(), nullable=False),
        pa.field(ENTRY_ID, pa.int64(), nullable=False),
        pa.field(KEY, pa.string()),
        pa.field(VALUE, pa.binary()),
        pa.field(IS_TOMBSTONE, pa.bool_(), nullable=False),
        pa.field(PROPERTIES, pa.map_(pa.string(), pa.string())),
        pa.field(PUBLISH_TIME, pa.int64(), nullable=False),
        pa.field(EVENT_TIME, pa.int64()),
        pa.field(BATCH_INDEX, pa.int32()),
        pa.field(BATCH_SIZE, pa.int32()),
        pa.field(PRODUCER_NAME, pa.string()),
        pa.field(SEQUENCE_ID, pa.int64()),
        pa.field(DELIVER_AT_TIME, pa.int64()),
        pa.field(ORDERING_KEY, pa.binary()),
        pa.field(SCHEMA_VERSION, pa.binary()),
    ],
    metadata={DELETES_RULE_KEY: DELETES_RULE},
)


def is_ledger_schema(names: Sequence[str]) -> bool:
    """Whether a file with these columns is a ledger file of this or an earlier format."""
    return len(names) >= len(FIRST_COLUMNS) and list(names) == list(COLUMNS[: len(names)])


def present(columns: Sequence[str], names: Sequence[str]) -> list[str]:
    """Those of ``columns`` that a file with columns ``names`` has."""
    have = set(names)
    return [c for c in columns if c in have]


def conform(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``table`` with ``columns`` in that order, the ones an older file lacks added as nulls.
    The columns it has keep their type (a map read as dictionaries stays one: made into strings
    here, every row of it would be, not only the rows its reader keeps)."""
    if table.column_names == list(columns):
        return table
    n = table.num_rows
    have = set(table.column_names)
    return pa.table(
        [table.column(c) if c in have else pa.nulls(n, ARROW_SCHEMA.field(c).type) for c in columns],
        schema=pa.schema([table.schema.field(c) if c in have else ARROW_SCHEMA.field(c) for c in columns]),
    )


def still_null(columns: set[str], table: pa.Table) -> set[str]:
    """Those of ``columns`` that hold no value in ``table`` either (a writer keeps the set over
    what it writes, and declares it with :func:`null_columns_metadata`)."""
    return {c for c in columns if table.column(c).null_count == table.num_rows}


def null_columns_metadata(columns: set[str]) -> dict[bytes, bytes]:
    return {NULL_COLUMNS_KEY: ",".join(c for c in SPARSE_COLUMNS if c in columns).encode()}


def declared_null(metadata: dict[bytes, bytes] | None) -> frozenset[str]:
    """The columns a file's key-value metadata declares without values (none if it does not say)."""
    if not metadata or NULL_COLUMNS_KEY not in metadata:
        return frozenset()
    return frozenset(c for c in metadata[NULL_COLUMNS_KEY].decode().split(",") if c in SPARSE_COLUMNS)


def flags_follow_rule(metadata: dict[bytes, bytes] | None) -> bool:
    """Whether a file with this schema (or Parquet key-value) metadata stores ``is_tombstone``
    under today's rule; if not, readers derive the flag (:func:`derived_delete_flags`)."""
    return bool(metadata) and metadata.get(DELETES_RULE_KEY) == DELETES_RULE  # type: ignore[union-attr]


def derived_delete_flags(keys: pa.ChunkedArray | pa.Array, values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """:func:`is_delete` over columns: the value is null, or empty with a key."""
    empty_keyed = pc.and_(pc.equal(pc.binary_length(values), 0), pc.is_valid(keys))
    return pc.or_(pc.is_null(values), pc.fill_null(empty_keyed, False))


# Spark's DDL for the same schema: the compactor reads with it so that every input file,
# sealed or compacted, lines up column for column without schema inference.
SPARK_DDL = (
    "ledger_id BIGINT, entry_id BIGINT, key STRING, value BINARY, is_tombstone BOOLEAN, "
    "properties MAP<STRING, STRING>, publish_time BIGINT, event_time BIGINT, "
    "batch_index INT, batch_size INT, producer_name STRING, sequence_id BIGINT, deliver_at_time BIGINT, "
    "ordering_key BINARY, schema_version BINARY"
)


def entries_to_table(entries: Sequence[Entry]) -> pa.Table:
    """Build an Arrow table in ``ARROW_SCHEMA`` from entries (kept in the given order)."""
    return _table(
        pa.array([e.ledger_id for e in entries], pa.int64()),
        pa.array([e.entry_id for e in entries], pa.int64()),
        entries,
    )


def table_to_entries(table: pa.Table) -> list[Entry]:
    """Turn rows of a ledger table (any row order) back into entries."""
    # Column by column: Table.to_pydict costs ten times as much on a slice of a row group.
    lids, eids, keys, values, pts, ets = (
        table.column(name).to_pylist() for name in (LEDGER_ID, ENTRY_ID, KEY, VALUE, PUBLISH_TIME, EVENT_TIME)
    )
    column = table.column(PROPERTIES)
    if all_empty(column):  # most messages carry no properties: skip converting their maps
        properties: list[dict[str, str]] = [{} for _ in range(table.num_rows)]
    else:
        properties = [dict(p) if p else {} for p in column.to_pylist()]
    # tuple.__new__ over zip builds each entry in C; Entry._make would add a Python call per row.
    names = table.column_names
    if BATCH_INDEX in names and table.column(BATCH_INDEX).null_count != table.num_rows:
        batch_indexes = table.column(BATCH_INDEX).to_pylist()
        batch_sizes = table.column(BATCH_SIZE).to_pylist()
    else:  # no batch member among them (or a file from before batches)
        batch_indexes = batch_sizes = [None] * table.num_rows
    if PRODUCER_NAME in names and table.column(PRODUCER_NAME).null_count != table.num_rows:
        producers = table.column(PRODUCER_NAME).to_pylist()
        sequence_ids = table.column(SEQUENCE_ID).to_pylist()
    else:  # sent over REST (or a file from before producers were kept)
        producers = sequence_ids = [None] * table.num_rows
    if DELIVER_AT_TIME in names and table.column(DELIVER_AT_TIME).null_count != table.num_rows:
        deliver_at = table.column(DELIVER_AT_TIME).to_pylist()
    else:
        deliver_at = [None] * table.num_rows
    ordering_keys = _optional(table, ORDERING_KEY)
    schema_versions = _optional(table, SCHEMA_VERSION)
    pulsar = (batch_indexes, batch_sizes, producers, sequence_ids, deliver_at, ordering_keys, schema_versions)
    rows = zip(lids, eids, keys, values, properties, pts, ets, *pulsar, strict=True)
    return list(map(tuple.__new__, repeat(Entry), rows))


def _optional(table: pa.Table, name: str) -> list[Any]:
    """Column ``name`` as Python values; all None without converting when the file lacks it or
    every row is null (most messages carry no Pulsar extras)."""
    if name in table.column_names and table.column(name).null_count != table.num_rows:
        return table.column(name).to_pylist()  # type: ignore[no-any-return]
    return [None] * table.num_rows


def all_empty(column: pa.ChunkedArray) -> bool:
    """Whether every map of ``column`` is null or empty (its offsets never advance)."""
    for chunk in column.chunks:
        offsets = chunk.offsets  # sliced with the chunk: len(chunk) + 1 of them
        if len(chunk) and offsets[len(chunk)].as_py() != offsets[0].as_py():
            return False
    return True


def records_to_table(
    ledger_id: int, records: Sequence[Record] | Sequence[Entry], first_entry: int = 0
) -> pa.Table:
    """The Arrow table of a ledger whose entries ``first_entry``.. are ``records``, in order
    (entries of that ledger, read back from its write-ahead file, do as well)."""
    n = len(records)
    return _table(
        pa.array(np.full(n, ledger_id, np.int64)),
        pa.array(np.arange(first_entry, first_entry + n, dtype=np.int64)),
        records,
    )


_PROPERTIES_TYPE = ARROW_SCHEMA.field(PROPERTIES).type
_NO_STRINGS = pa.array([], pa.string())


def _table(ledger_ids: pa.Array, entry_ids: pa.Array, rows: Sequence[Record] | Sequence[Entry]) -> pa.Table:
    """The one place rows become columns: ids given, the rest from each row's message fields.

    Sealing runs this on every ledger (and a compaction round waits for the open ledger's), so
    only the fields are read in Python; the delete flags are computed over the columns, and
    properties, empty on most messages, are converted only when some message has them."""
    n = len(rows)
    indexes = [r.batch_index for r in rows]
    if indexes.count(None) != n:
        batch_index = pa.array(indexes, pa.int32())
        batch_size = pa.array([r.batch_size for r in rows], pa.int32())
    else:
        batch_index = batch_size = pa.nulls(n, pa.int32())
    producers = [r.producer_name for r in rows]
    if producers.count(None) != n:
        producer_name = pa.array(producers, pa.string())
        sequence_id = pa.array([r.sequence_id for r in rows], pa.int64())
    else:
        producer_name, sequence_id = pa.nulls(n, pa.string()), pa.nulls(n, pa.int64())
    delays = [r.deliver_at_time for r in rows]
    deliver_at = pa.array(delays, pa.int64()) if delays.count(None) != n else pa.nulls(n, pa.int64())
    ordering_keys = _binary_or_nulls([r.ordering_key for r in rows])
    schema_versions = _binary_or_nulls([r.schema_version for r in rows])
    keys = pa.array([r.key for r in rows], pa.string())
    values = pa.array([r.value for r in rows], pa.binary())
    props = [r.properties for r in rows]
    if any(props):
        properties = pa.array([list(p.items()) for p in props], _PROPERTIES_TYPE)
    else:
        offsets = pa.array(np.zeros(n + 1, np.int32))
        properties = pa.MapArray.from_arrays(offsets, _NO_STRINGS, _NO_STRINGS, type=_PROPERTIES_TYPE)
    return pa.Table.from_arrays(
        [
            ledger_ids,
            entry_ids,
            keys,
            values,
            derived_delete_flags(keys, values),
            properties,
            pa.array([r.publish_time for r in rows], pa.int64()),
            pa.array([r.event_time for r in rows], pa.int64()),
            batch_index,
            batch_size,
            producer_name,
            sequence_id,
            deliver_at,
            ordering_keys,
            schema_versions,
        ],
        schema=ARROW_SCHEMA,
    )


def _binary_or_nulls(values: list[bytes | None]) -> pa.Array:
    """A binary column, built only when some row has a value (most rows of most ledgers have none)."""
    n = len(values)
    return pa.array(values, pa.binary()) if values.count(None) != n else pa.nulls(n, pa.binary())
