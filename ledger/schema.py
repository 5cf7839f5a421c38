"""The columns of a sealed ledger and of a compacted ledger (one schema for both).

Sealed original ledgers and compacted ledgers share this schema so that a compaction round
can read the previous compacted ledger and the new original ledgers as one input.
Rows are always stored in message-id order: ``(ledger_id, entry_id)`` ascending.

``is_tombstone`` holds Pulsar's delete rule (:func:`is_delete`): a keyed message whose value is
null or empty deletes its key. Files written since that rule carry ``DELETES_RULE`` in their
schema metadata; in a file without it (written when only a null value deleted) the flag says
nothing about empty values, and a reader derives it again from the key and value
(:func:`derived_delete_flags`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ledger.entry import Entry, Record, is_delete

LEDGER_ID = "ledger_id"
ENTRY_ID = "entry_id"
KEY = "key"
VALUE = "value"
IS_TOMBSTONE = "is_tombstone"
PROPERTIES = "properties"
PUBLISH_TIME = "publish_time"
EVENT_TIME = "event_time"

# Schema metadata of every file whose ``is_tombstone`` follows :func:`is_delete`.
DELETES_RULE_KEY = b"compactor.deletes"
DELETES_RULE = b"null-or-empty-keyed"

COLUMNS = (LEDGER_ID, ENTRY_ID, KEY, VALUE, IS_TOMBSTONE, PROPERTIES, PUBLISH_TIME, EVENT_TIME)

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
    ],
    metadata={DELETES_RULE_KEY: DELETES_RULE},
)


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
    "properties MAP<STRING, STRING>, publish_time BIGINT, event_time BIGINT"
)


def entries_to_table(entries: Sequence[Entry]) -> pa.Table:
    """Build an Arrow table in ``ARROW_SCHEMA`` from entries (kept in the given order)."""
    return _table([e.ledger_id for e in entries], [e.entry_id for e in entries], entries)


def table_to_entries(table: pa.Table) -> list[Entry]:
    """Turn rows of a ledger table (any row order) back into entries."""
    # Column by column: Table.to_pydict costs ten times as much on a slice of a row group.
    lids, eids, keys, values, propss, pts, ets = (
        table.column(name).to_pylist()
        for name in (LEDGER_ID, ENTRY_ID, KEY, VALUE, PROPERTIES, PUBLISH_TIME, EVENT_TIME)
    )
    properties = [dict(p) if p else {} for p in propss]
    make = Entry._make
    return [make(row) for row in zip(lids, eids, keys, values, properties, pts, ets, strict=True)]


def records_to_table(ledger_id: int, records: Sequence[Record] | Sequence[Entry]) -> pa.Table:
    """The Arrow table of a ledger whose entries 0..n-1 are ``records``, in order (entries of
    that ledger, read back from its write-ahead file, do as well)."""
    n = len(records)
    return _table(pa.array([ledger_id] * n, pa.int64()), pa.array(range(n), pa.int64()), records)


def _table(ledger_ids: object, entry_ids: object, rows: Sequence[Record] | Sequence[Entry]) -> pa.Table:
    """The one place rows become columns: ids given, the rest from each row's message fields."""
    return pa.table(
        {
            LEDGER_ID: ledger_ids,
            ENTRY_ID: entry_ids,
            KEY: [r.key for r in rows],
            VALUE: [r.value for r in rows],
            IS_TOMBSTONE: [is_delete(r.key, r.value) for r in rows],
            PROPERTIES: [list(r.properties.items()) for r in rows],
            PUBLISH_TIME: [r.publish_time for r in rows],
            EVENT_TIME: [r.event_time for r in rows],
        },
        schema=ARROW_SCHEMA,
    )
