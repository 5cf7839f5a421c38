"""The two phases of a compaction as pure DataFrame -> DataFrame functions.

Phase one reads only the narrow columns (ids, key, tombstone flag) and finds, for every key,
its latest message id and whether that latest record is a tombstone. Phase two keeps the
input rows whose id is the latest of their key (unless that latest is a tombstone) and,
with ``retain_null_key``, the keyless rows; it returns them in message-id order.

Message ids as one column. Exact keys decide which row wins; the id only has to order and
to match. When every ``ledger_id < 2**31`` and ``entry_id < 2**32`` the id is packed into
one BIGINT, ``ledger_id << 32 | entry_id``, which orders exactly like the pair and makes the
aggregation and the semi-join cheap (fixed-width, hash-aggregatable). Otherwise it is the
struct ``(ledger_id, entry_id)``, which Spark orders field by field: slower, same result.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from ledger.entry import Position
from ledger.schema import (
    COLUMNS,
    ENTRY_ID,
    EVENT_TIME,
    IS_TOMBSTONE,
    KEY,
    LEDGER_ID,
    PROPERTIES,
    PUBLISH_TIME,
    VALUE,
)

# Columns phase one reads (the offset strategy; see ``narrow_columns`` for the others).
NARROW_COLUMNS = (LEDGER_ID, ENTRY_ID, KEY, IS_TOMBSTONE, PUBLISH_TIME)

OFFSET = "offset"
EVENT_TIME_STRATEGY = "eventTime"
PROPERTY_PREFIX = "property:"


def derived_delete_column() -> Column:
    """``is_tombstone`` under Pulsar's delete rule (``ledger.entry.is_delete``), from the key and
    value: for files written before empty values deleted, whose stored flag is stale. Reading
    the value column is the price of such files; files written since carry the flag."""
    return F.col(VALUE).isNull() | (F.col(KEY).isNotNull() & (F.length(F.col(VALUE)) == 0))


def narrow_columns(strategy: str = OFFSET) -> tuple[str, ...]:
    """The columns phase one needs under ``strategy``: never the values."""
    if strategy == EVENT_TIME_STRATEGY:
        return (*NARROW_COLUMNS, EVENT_TIME)
    if strategy.startswith(PROPERTY_PREFIX):
        return (*NARROW_COLUMNS, PROPERTIES)
    return NARROW_COLUMNS


def rank_col(strategy: str) -> Column | None:
    """What decides the winner of a key before the message id (None: the id alone).

    ``eventTime``: the event time (publish time when a message has none). ``property:<name>``:
    the property's numeric value; a message without a numeric value ranks lowest, except a
    tombstone without one, which always wins (an unversioned delete deletes). Ties, and the
    offset strategy, go to the latest message id.
    """
    if strategy == OFFSET:
        return None
    if strategy == EVENT_TIME_STRATEGY:
        return F.coalesce(F.col(EVENT_TIME), F.col(PUBLISH_TIME)).cast("double")
    if strategy.startswith(PROPERTY_PREFIX):
        value = F.col(PROPERTIES).getItem(strategy[len(PROPERTY_PREFIX) :]).try_cast("double")
        return (
            F.when(value.isNotNull() & ~F.isnan(value), value)
            .when(F.col(IS_TOMBSTONE), F.lit(float("inf")))
            .otherwise(F.lit(float("-inf")))
        )
    raise ValueError(f"unknown compaction strategy {strategy!r}")


# Columns of phase one's result.
LATEST_ID = "latest_id"
LATEST_IS_TOMBSTONE = "latest_is_tombstone"
LATEST_PUBLISH_TIME = "latest_publish_time"
RECORDS = "records"

# The message id of an input row (packed BIGINT or struct), internal to the phases.
MESSAGE_ID = "_message_id"

PACK_SHIFT = 32
MAX_PACKED_LEDGER_ID = 2**31 - 1
MAX_PACKED_ENTRY_ID = 2**32 - 1


def can_pack(max_ledger_id: int, max_entry_id: int, *, min_ledger_id: int = 0, min_entry_id: int = 0) -> bool:
    """Whether ids within these bounds pack into one order-preserving, non-negative BIGINT."""
    return (
        0 <= min_ledger_id <= max_ledger_id <= MAX_PACKED_LEDGER_ID
        and 0 <= min_entry_id <= max_entry_id <= MAX_PACKED_ENTRY_ID
    )


def pack(position: Position) -> int:
    """The packed form of a position (the caller has checked :func:`can_pack`)."""
    return (position.ledger_id << PACK_SHIFT) | position.entry_id


def unpack(packed: int) -> Position:
    return Position(packed >> PACK_SHIFT, packed & MAX_PACKED_ENTRY_ID)


def packed_id_col(ledger_id: str = LEDGER_ID, entry_id: str = ENTRY_ID) -> Column:
    """``ledger_id << 32 | entry_id`` as a BIGINT column."""
    return F.shiftleft(F.col(ledger_id), PACK_SHIFT).bitwiseOR(F.col(entry_id))


def struct_id_col(ledger_id: str = LEDGER_ID, entry_id: str = ENTRY_ID) -> Column:
    """The id as ``struct<ledger_id, entry_id>``; ordered lexicographically by Spark."""
    return F.struct(F.col(ledger_id).alias(LEDGER_ID), F.col(entry_id).alias(ENTRY_ID))


def message_id_col(*, packed: bool) -> Column:
    return packed_id_col() if packed else struct_id_col()


def key_summary(narrow: DataFrame, *, packed: bool = True, strategy: str = OFFSET) -> DataFrame:
    """Per key (keyless rows form one group with ``key`` NULL): the winning id, whether it is
    a tombstone, its publish time, and how many records the key has. Phase one, plus the
    keyless count. The compactor caches this so that its statistics need no extra pass.
    """
    mid = message_id_col(packed=packed).alias(MESSAGE_ID)
    rank = rank_col(strategy)
    cols = [F.col(KEY), F.col(IS_TOMBSTONE), F.col(PUBLISH_TIME), mid]
    if rank is None:
        order = F.col(MESSAGE_ID)
        ids = narrow.select(*cols)
        latest = F.max(MESSAGE_ID)
    else:
        ids = narrow.select(*cols, rank.alias("_rank"))
        order = F.struct(F.col("_rank"), F.col(MESSAGE_ID))
        latest = F.max_by(MESSAGE_ID, order)
    return ids.groupBy(KEY).agg(
        latest.alias(LATEST_ID),
        F.max_by(IS_TOMBSTONE, order).alias(LATEST_IS_TOMBSTONE),
        F.max_by(PUBLISH_TIME, order).alias(LATEST_PUBLISH_TIME),
        F.count(F.lit(1)).alias(RECORDS),
    )


def phase_one(narrow: DataFrame, *, packed: bool = True, strategy: str = OFFSET) -> DataFrame:
    """For every key: ``key``, ``latest_id``, ``latest_is_tombstone``, ``records``.

    ``narrow`` needs the columns ledger_id, entry_id, key, is_tombstone; keyless rows are
    ignored. ``latest_id`` is packed (BIGINT) or a struct, as ``packed`` says.
    """
    # The filter is on the grouping column, so Spark applies it before the aggregation.
    return key_summary(narrow, packed=packed, strategy=strategy).where(F.col(KEY).isNotNull())


def is_packed(latest: DataFrame) -> bool:
    """Whether phase one's result carries packed ids."""
    return isinstance(latest.schema[LATEST_ID].dataType, LongType)


def phase_two(
    full: DataFrame,
    latest: DataFrame,
    *,
    retain_null_key: bool,
    keep_tombstones_since: int | None = None,
) -> DataFrame:
    """The rows a compacted ledger keeps, with exactly the ledger columns, in message-id order.

    A keyed row stays if its id is the winner of its key and that winner is not a tombstone
    (so a deleted key vanishes entirely), or is a tombstone published at or after
    ``keep_tombstones_since`` (ms). Keyless rows are dropped, or with
    ``retain_null_key`` all kept except tombstones: they are never deduplicated.
    """
    packed = is_packed(latest)
    live = ~F.col(LATEST_IS_TOMBSTONE)
    if keep_tombstones_since is not None:
        # Kafka's delete.retention.ms: a recent delete stays visible to slow readers.
        live = live | (F.col(LATEST_PUBLISH_TIME) >= F.lit(keep_tombstones_since))
    keep_ids = latest.where(F.col(KEY).isNotNull() & live).select(F.col(LATEST_ID).alias(MESSAGE_ID))
    with_id = full.withColumn(MESSAGE_ID, message_id_col(packed=packed))
    if retain_null_key:
        # One pass over the input: a left join marks the winners, keyless rows pass by themselves.
        marked = with_id.join(keep_ids.withColumn("_keep", F.lit(True)), on=MESSAGE_ID, how="left")
        keyless = F.col(KEY).isNull() & ~F.col(IS_TOMBSTONE)
        kept = marked.where(F.col("_keep").isNotNull() | keyless)
    else:
        # Ids are unique, so a semi-join on the id alone selects the winners.
        kept = with_id.where(F.col(KEY).isNotNull()).join(keep_ids, on=MESSAGE_ID, how="left_semi")
    return kept.select(*COLUMNS).orderBy(LEDGER_ID, ENTRY_ID)


def keep_ids(summary: DataFrame, *, keep_tombstones_since: int | None) -> DataFrame:
    """The winning ids of keyed rows (``latest_id``) a compacted ledger keeps, from a phase-one
    summary: a key's winner unless it is a tombstone (one published at or after
    ``keep_tombstones_since`` stays)."""
    live = ~F.col(LATEST_IS_TOMBSTONE)
    if keep_tombstones_since is not None:
        live = live | (F.col(LATEST_PUBLISH_TIME) >= F.lit(keep_tombstones_since))
    return summary.where(F.col(KEY).isNotNull() & live).select(LATEST_ID)
