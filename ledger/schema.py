"""The columns of a sealed ledger and of a compacted ledger (one schema for both).

Sealed original ledgers and compacted ledgers share this schema so that a compaction round
can read the previous compacted ledger and the new original ledgers as one input.
Rows are always stored in message-id order: ``(ledger_id, entry_id)`` ascending.
"""

from __future__ import annotations

import pyarrow as pa

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
