"""The columns of a sealed ledger and of a compacted ledger (one schema for both).

Sealed original ledgers and compacted ledgers share this schema so that a compaction round
can read the previous compacted ledger and the new original ledgers as one input.
Rows are always stored in message-id order: ``(ledger_id, entry_id)`` ascending.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ledger.entry import Entry, Record

LEDGER_ID = "ledger_id"
ENTRY_ID = "entry_id"
KEY = "key"
VALUE = "value"
IS_TOMBSTONE = "is_tombstone"
PROPERTIES = "properties"
PUBLISH_TIME = "publish_time"
EVENT_TIME = "event_time"

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
    ]
)

# Spark's DDL for the same schema: the compactor reads with it so that every input file,
# sealed or compacted, lines up column for column without schema inference.
SPARK_DDL = (
    "ledger_id BIGINT, entry_id BIGINT, key STRING, value BINARY, is_tombstone BOOLEAN, "
    "properties MAP<STRING, STRING>, publish_time BIGINT, event_time BIGINT"
)


def entries_to_table(entries: Sequence[Entry]) -> pa.Table:
    """Build an Arrow table in ``ARROW_SCHEMA`` from entries (kept in the given order)."""
    return pa.table(
        {
            LEDGER_ID: [e.ledger_id for e in entries],
            ENTRY_ID: [e.entry_id for e in entries],
            KEY: [e.key for e in entries],
            VALUE: [e.value for e in entries],
            IS_TOMBSTONE: [e.value is None for e in entries],
            PROPERTIES: [list(e.properties.items()) for e in entries],
            PUBLISH_TIME: [e.publish_time for e in entries],
            EVENT_TIME: [e.event_time for e in entries],
        },
        schema=ARROW_SCHEMA,
    )


def table_to_entries(table: pa.Table) -> list[Entry]:
    """Turn rows of a ledger table (any row order) back into entries."""
    cols = table.select(list(COLUMNS)).to_pydict()
    return [
        Entry(
            ledger_id=lid,
            entry_id=eid,
            key=key,
            value=value,
            properties=dict(props) if props else {},
            publish_time=pt,
            event_time=et,
        )
        for lid, eid, key, value, props, pt, et in zip(
            cols[LEDGER_ID],
            cols[ENTRY_ID],
            cols[KEY],
            cols[VALUE],
            cols[PROPERTIES],
            cols[PUBLISH_TIME],
            cols[EVENT_TIME],
            strict=True,
        )
    ]


def records_to_table(ledger_id: int, records: Sequence[Record]) -> pa.Table:
    """The Arrow table of a ledger whose entries 0..n-1 are ``records``, in order."""
    n = len(records)
    return pa.table(
        {
            LEDGER_ID: pa.array([ledger_id] * n, pa.int64()),
            ENTRY_ID: pa.array(range(n), pa.int64()),
            KEY: [r.key for r in records],
            VALUE: [r.value for r in records],
            IS_TOMBSTONE: [r.value is None for r in records],
            PROPERTIES: [list(r.properties.items()) for r in records],
            PUBLISH_TIME: [r.publish_time for r in records],
            EVENT_TIME: [r.event_time for r in records],
        },
        schema=ARROW_SCHEMA,
    )
