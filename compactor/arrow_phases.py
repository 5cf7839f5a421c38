"""The two phases as Arrow work inside Spark tasks: the fast path when message ids pack.

Spark schedules the work and moves 8-byte ids between the phases; the tasks decode Parquet
and aggregate with Arrow's C++ kernels (``mapInArrow``), so no input row is converted into
JVM rows and no full row is shuffled.

The input of a round is a list of **segments** in message-id order: the previous compacted
ledger's part files, then the sealed original ledgers, each with the packed-id range it
contributes, ``(lo, hi]``. Every segment stores its rows in id order. Consecutive segments
form **groups**, one output part file each, balanced by bytes.

Phase one: one task per key **bucket**. Each task reads the narrow columns (key, ids,
tombstone flag, publish time) of every segment, keeps the rows whose key falls in its bucket,
and finds each key's last row, that is its latest id (Arrow's ordered ``last`` aggregation
over rows in id order, folded every few million rows so memory is bounded by the keys). The
bucket is a hash of the key, used only to split the work: keys are compared exactly, so a
hash collision costs balance, never correctness. Each task emits the ids to keep, labelled
with their output group, and how many rows it read. Reading the narrow columns once per
bucket trades a little I/O for a shuffle of strings through the JVM, which costs more.

Phase two: the ids are shuffled to their group's task (a shuffle of 8-byte ids); each task
reads the full rows of its group's segments, keeps exactly the rows whose id it was given,
and writes them in order as ``part-{group:05d}.parquet``. Part files in name order are thus in
message-id order, with no sort of full rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from compactor.phases import LATEST_ID, LATEST_IS_TOMBSTONE, LATEST_PUBLISH_TIME, PACK_SHIFT
from ledger.schema import ARROW_SCHEMA, ENTRY_ID, IS_TOMBSTONE, KEY, LEDGER_ID, PUBLISH_TIME

KEEP_DDL = "label INT, id BIGINT"
WRITTEN_DDL = "part INT, rows BIGINT"
LABEL, ID = "label", "id"
STATS_LABEL = -1  # a row of phase one's output that carries a count of rows read, not an id

_NARROW = [LEDGER_ID, ENTRY_ID, KEY, IS_TOMBSTONE, PUBLISH_TIME]
# Rows decoded at a time from one file.
_CHUNK_ROWS = 262_144
# Fold the running per-key winners with the rows read since, past this many rows.
_FOLD_ROWS = 2_000_000
_MIX = np.uint64(0xFF51AFD7ED558CCD)


@dataclass(frozen=True)
class Segment:
    """Rows of one Parquet file with packed ids in ``(lo, hi]``, stored in id order."""

    path: str
    lo: int
    hi: int
    size: int = 0
    # A part of the previous compacted ledger in an incremental round: its rows are kept by
    # key (unless a newer row of the key exists) rather than by id.
    previous: bool = False


def bound(ledger_id: int, entry_id: int) -> int:
    """A position as a packed bound; unlike ``packed`` it allows entry -1 ("before entry 0")."""
    return (ledger_id << PACK_SHIFT) + entry_id


def packed(ledger_ids: pa.ChunkedArray | pa.Array, entry_ids: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """``ledger_id << 32 | entry_id`` as int64 (the caller checked that the ids pack)."""
    lid = np.asarray(ledger_ids.to_numpy(), dtype=np.int64)
    eid = np.asarray(entry_ids.to_numpy(), dtype=np.int64)
    return (lid << PACK_SHIFT) | eid


def key_buckets(keys: pa.ChunkedArray | pa.Array, buckets: int) -> np.ndarray:
    """A bucket in ``[0, buckets)`` for each key, from its length and its first and last eight
    bytes (nulls: bucket 0). Only splits work: equal keys always share a bucket."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if keys.type != pa.string():
        keys = keys.cast(pa.string())
    n = len(keys)
    if buckets == 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=n + 1, offset=keys.offset * 4)
    starts, ends = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64)
    h = (ends - starts).astype(np.uint64)
    data = keys.buffers()[2]
    if data is not None and len(data):
        raw = np.frombuffer(data, dtype=np.uint8)
        last = len(raw) - 1
        for i in range(8):
            for at, sign in ((starts + i, 1), (ends - 1 - i, -1)):
                inside = (at >= starts) & (at < ends)
                byte = raw[np.clip(at, 0, last)].astype(np.uint64) * inside.astype(np.uint64)
                h = (h * np.uint64(1099511628211)) ^ (byte + np.uint64(sign + 2))
    h ^= h >> np.uint64(33)
    h *= _MIX
    h ^= h >> np.uint64(33)
    out = (h % np.uint64(buckets)).astype(np.int64)
    if keys.null_count:
        out[np.asarray(keys.is_null().to_numpy(zero_copy_only=False))] = 0
    return out


def _chunks(segment: Segment, columns: list[str]) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """The segment's rows in its id range, in order, a bounded chunk at a time (a compacted
    part can be large), with their packed ids."""
    with pq.ParquetFile(segment.path) as f:
        for batch in f.iter_batches(batch_size=_CHUNK_ROWS, columns=columns):
            table = pa.Table.from_batches([batch])
            ids = packed(table.column(LEDGER_ID), table.column(ENTRY_ID))
            mask = (ids > segment.lo) & (ids <= segment.hi)
            if not mask.all():
                table, ids = table.filter(pa.array(mask)), ids[mask]
            if table.num_rows:
                yield table, ids


def _first_value(batches: Iterable[pa.RecordBatch]) -> int | None:
    for b in batches:
        if b.num_rows:
            return int(b.column(0)[0].as_py())
    return None


# ---------------------------------------------------------------------------- phase one


@dataclass(frozen=True)
class PhaseOnePlan:
    """What every phase-one task needs to know (pickled into the task)."""

    segments: tuple[Segment, ...]
    buckets: int
    group_bounds: tuple[int, ...]  # the last packed id of each group but the last
    labels: tuple[int, ...]  # the label of each group (see ``spread_labels``)
    retain_null_key: bool
    keep_tombstones_since: int | None
    # Incremental round: segments before this index are the previous compacted ledger, whose
    # keys are each already unique and latest; phase one reads only the segments after it.
    first_new: int = 0


def _bucket_winners(bucket: int, plan: PhaseOnePlan) -> Iterator[pa.RecordBatch]:
    """Runs in a task: the ids to keep among the keys of ``bucket``, labelled by group, then
    one stats row with the number of rows of the bucket that were read."""
    folded: pa.Table | None = None
    pending: list[pa.Table] = []
    pending_rows = 0
    keyless: list[np.ndarray] = []
    rows_read = 0

    def fold(tables: list[pa.Table]) -> pa.Table:
        # Rows in id order and one thread: "last" is each key's row with the latest id.
        agg = (
            pa.concat_tables(tables)
            .group_by(KEY, use_threads=False)
            .aggregate([(LATEST_ID, "last"), (LATEST_IS_TOMBSTONE, "last"), (LATEST_PUBLISH_TIME, "last")])
        )
        return pa.table(
            {
                KEY: agg.column(KEY),
                LATEST_ID: agg.column(f"{LATEST_ID}_last"),
                LATEST_IS_TOMBSTONE: agg.column(f"{LATEST_IS_TOMBSTONE}_last"),
                LATEST_PUBLISH_TIME: agg.column(f"{LATEST_PUBLISH_TIME}_last"),
            }
        )

    if bucket == 0:
        # A marker per group, so that every group reaches a phase-two task even when none of
        # its ids was kept (an incremental round copies the previous ledger's rows by key).
        yield pa.record_batch(
            [pa.array(plan.labels, pa.int32()), pa.array([-1] * len(plan.labels), pa.int64())],
            names=[LABEL, ID],
        )
    chunks = (c for segment in plan.segments[plan.first_new :] for c in _chunks(segment, _NARROW))
    for table, ids in chunks:
        keys = table.column(KEY)
        mine = key_buckets(keys, plan.buckets) == bucket
        null_key = np.asarray(keys.is_null().to_numpy(zero_copy_only=False))
        if bucket == 0 and null_key.any():
            # Keyless rows are never deduplicated: each live one is kept, or none.
            rows_read += int(null_key.sum())
            if plan.retain_null_key:
                live = ~np.asarray(table.column(IS_TOMBSTONE).to_numpy(zero_copy_only=False))
                keyless.append(ids[null_key & live])
        mine &= ~null_key
        if not mine.any():
            continue
        selected = pa.array(mine)
        rows = pa.table(
            {
                KEY: keys.filter(selected),
                LATEST_ID: pa.array(ids[mine], pa.int64()),
                LATEST_IS_TOMBSTONE: table.column(IS_TOMBSTONE).filter(selected),
                LATEST_PUBLISH_TIME: table.column(PUBLISH_TIME).filter(selected),
            }
        )
        rows_read += rows.num_rows
        pending.append(rows)
        pending_rows += rows.num_rows
        if pending_rows >= _FOLD_ROWS:
            folded = fold([folded, *pending] if folded is not None else pending)
            pending, pending_rows = [], 0
    if pending:
        folded = fold([folded, *pending] if folded is not None else pending)

    kept: list[np.ndarray] = list(keyless)
    if folded is not None:
        live = pc.invert(folded.column(LATEST_IS_TOMBSTONE))
        if plan.keep_tombstones_since is not None:
            # Kafka's delete.retention.ms: a recent delete stays visible to slow readers.
            live = pc.or_(
                live, pc.greater_equal(folded.column(LATEST_PUBLISH_TIME), plan.keep_tombstones_since)
            )
        kept.append(np.asarray(folded.column(LATEST_ID).filter(live).to_numpy(), dtype=np.int64))
    ids_out = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
    if len(ids_out):
        groups = np.searchsorted(np.asarray(plan.group_bounds, dtype=np.int64), ids_out, side="left")
        labels = np.asarray(plan.labels, dtype=np.int32)[groups]
        yield pa.record_batch(
            [pa.array(labels, pa.int32()), pa.array(ids_out, pa.int64())], names=[LABEL, ID]
        )
    yield pa.record_batch(
        [pa.array([STATS_LABEL], pa.int32()), pa.array([rows_read], pa.int64())], names=[LABEL, ID]
    )


def phase_one(spark: SparkSession, plan: PhaseOnePlan) -> DataFrame:
    """``(label, id)`` rows: every id to keep with its group's label, and per bucket one row
    ``(STATS_LABEL, rows read)``."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        bucket = _first_value(batches)
        if bucket is None:
            return iter(())
        return _bucket_winners(bucket, plan)

    rdd = spark.sparkContext.parallelize([(b,) for b in range(plan.buckets)], plan.buckets)
    return spark.createDataFrame(rdd, "bucket INT").mapInArrow(task, KEEP_DDL)


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
    """The group label of packed ids, as a Spark expression (for the SQL phase one)."""
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


# ---------------------------------------------------------------------------- phase two


@dataclass(frozen=True)
class WritePlan:
    """What every phase-two task needs to know (pickled into the task)."""

    groups: tuple[tuple[Segment, ...], ...]
    labels: tuple[int, ...]
    out_dir: str
    row_group_bytes: int
    # For the previous ledger's parts of an incremental round (see ``Segment.previous``):
    new_segments: tuple[Segment, ...] = ()
    retain_null_key: bool = False
    keep_tombstones_since: int | None = None


def _superseded(plan: WritePlan) -> pa.Array:
    """Every key that has a row in the new segments: its previous compacted row is replaced."""
    chunks = [
        c
        for s in plan.new_segments
        for t, _ in _chunks(s, [LEDGER_ID, ENTRY_ID, KEY])
        for c in t.column(KEY).chunks
    ]
    return pc.unique(pa.chunked_array(chunks, pa.string()))


def _previous_rows_kept(table: pa.Table, superseded: pa.Array, plan: WritePlan) -> np.ndarray:
    """Rows of the previous compacted ledger that stay: their key has no newer row, and they
    are not a tombstone past its retention, nor keyless when keyless rows are not retained."""
    key = table.column(KEY)
    tomb = np.asarray(table.column(IS_TOMBSTONE).to_numpy(zero_copy_only=False))
    replaced = np.asarray(pc.is_in(key, value_set=superseded, skip_nulls=True).to_numpy(zero_copy_only=False))
    keep = ~replaced
    if plan.keep_tombstones_since is None:
        keep &= ~tomb
    else:
        published = np.asarray(table.column(PUBLISH_TIME).to_numpy(), dtype=np.int64)
        keep &= ~tomb | (published >= plan.keep_tombstones_since)
    if not plan.retain_null_key:
        keep &= ~np.asarray(key.is_null().to_numpy(zero_copy_only=False))
    return keep


def _write_groups(batches: Iterator[pa.RecordBatch], plan: WritePlan) -> Iterator[pa.RecordBatch]:
    """Runs in a task: for each group it received, the rows it keeps (full columns), written
    in id order as ``part-{group:05d}.parquet``; yields (part, rows) per part written."""
    tables = [b for b in batches if b.num_rows]
    if not tables:
        return
    received = pa.Table.from_batches(tables)
    group_of = {label: g for g, label in enumerate(plan.labels)}
    all_labels = received.column(LABEL).to_numpy()
    all_ids = received.column(ID).to_numpy()
    superseded: pa.Array | None = None
    for label in np.unique(all_labels):
        g = group_of[int(label)]
        wanted = np.sort(all_ids[(all_labels == label) & (all_ids >= 0)])
        path = os.path.join(plan.out_dir, f"part-{g:05d}.parquet")
        writer: pq.ParquetWriter | None = None
        rows = 0
        try:
            for segment in plan.groups[g]:
                if segment.previous:
                    if superseded is None:
                        superseded = _superseded(plan)
                    chunks = _chunks(segment, list(ARROW_SCHEMA.names))
                    masked = ((t, _previous_rows_kept(t, superseded, plan)) for t, _ in chunks)
                else:
                    lo = int(np.searchsorted(wanted, segment.lo, side="right"))
                    hi = int(np.searchsorted(wanted, segment.hi, side="right"))
                    if lo == hi:
                        continue  # no kept row in this segment: not even read
                    mine = wanted[lo:hi]
                    chunks = _chunks(segment, list(ARROW_SCHEMA.names))
                    masked = ((t, np.isin(ids, mine, assume_unique=True)) for t, ids in chunks)
                for table, mask in masked:
                    kept = table.filter(pa.array(mask)).cast(ARROW_SCHEMA)
                    if not kept.num_rows:
                        continue
                    if writer is None:
                        writer = pq.ParquetWriter(path, ARROW_SCHEMA, compression="zstd")
                    # Row groups of about row_group_bytes: a page read decodes one, not a part.
                    per_group = max(1, plan.row_group_bytes * kept.num_rows // max(1, kept.nbytes))
                    writer.write_table(kept, row_group_size=per_group)
                    rows += kept.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            continue
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        yield pa.record_batch(
            [pa.array([g], pa.int32()), pa.array([rows], pa.int64())], names=["part", "rows"]
        )


def phase_two(keep: DataFrame, plan: WritePlan) -> int:
    """Write the kept rows (``keep``: label, id, with a marker per group) under the plan's
    directory; returns how many rows were written."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _write_groups(batches, plan)

    os.makedirs(plan.out_dir, exist_ok=True)
    if not plan.groups:
        return 0
    shuffled = keep.where(F.col(LABEL) != STATS_LABEL).repartition(len(plan.groups), LABEL)
    # One small row per part file comes back: counts, not data.
    return sum(int(r["rows"]) for r in shuffled.mapInArrow(task, WRITTEN_DDL).collect())
