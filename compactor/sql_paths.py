"""The Arrow tasks of the Spark SQL path (which is ``compactor.phases``).

- :func:`rows_frame`: the live rows of segments, their deletion vectors applied, as a DataFrame
  that Arrow tasks read: how Spark SQL reads a previous compacted ledger that has dead rows, and
  any input on object storage (whose files Spark SQL does not read).
- :func:`phase_two_from_ids`: phase two when phase one ran in Spark SQL (the event-time and
  property strategies): the ids to keep, labelled by group (:func:`label_column`,
  :func:`spread_labels`), each shuffled to its group's task, which writes the part
  (``compactor.parts.write_part``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from compactor.parts import write_part
from compactor.round_plan import RoundPlan, TaskResult
from compactor.segments import Segment, _chunks
from ledger.layers import PartInfo
from ledger.schema import ENTRY_ID, LEDGER_ID, SPARK_DDL

WRITTEN_DDL = "part INT, rows BIGINT, described STRING"
LABEL, ID = "label", "id"


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
