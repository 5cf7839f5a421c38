"""The start-up warm-up: the round works on a fresh directory and leaves nothing behind; the
empty jobs after it run on Spark and end when the service stops."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from pyspark.sql import SparkSession

from compactor.warmup import JIT_JOB_GROUP, warm_up, warm_up_jit
from ledger.storage import Storage

# 16 keys; each ledger deletes the keys of entries 0, 7, 14, ... (i % 7 == 0).
KEPT = len({i % 16 for i in range(64) if i % 7 != 0} - {i % 16 for i in range(64) if i % 7 == 0 and i >= 48})


def test_warm_up_compacts_a_scratch_topic_and_removes_it(spark: SparkSession, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    stale = data_dir / ".compactor-warm-up-crashed"
    stale.mkdir(parents=True)  # as a process killed during its warm-up leaves it
    assert warm_up(spark, data_dir) == KEPT
    assert list(data_dir.iterdir()) == []


def test_warm_up_in_the_ledgers_storage_leaves_nothing_there(spark: SparkSession, storage: Storage) -> None:
    # A cluster whose executors share no disk with the service warms up where they read: the
    # ledgers' storage. A crashed start-up's scratch goes once old; a recent one (another
    # instance's, warming up now) and everything else stay.
    storage.put(".compactor-warm-up-1000-crashed/topic/x.parquet", b"x")
    recent = f".compactor-warm-up-{int(time.time() * 1000)}-another/topic/x.parquet"
    storage.put(recent, b"x")
    storage.put("tenant/ns/topic/y.parquet", b"y")
    assert warm_up(spark, storage.at()) == KEPT
    assert sorted(f.key for f in storage.list("")) == sorted([recent, "tenant/ns/topic/y.parquet"])


def test_jit_warm_up_runs_its_jobs_on_spark_and_ends_when_asked(spark: SparkSession) -> None:
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(JIT_JOB_GROUP))
    assert warm_up_jit(spark, 3) == 3
    ran = set(tracker.getJobIdsForGroup(JIT_JOB_GROUP)) - before
    assert len(ran) == 3
    assert all(tracker.getJobInfo(j).status == "SUCCEEDED" for j in ran)  # type: ignore[union-attr]
    # A job submitted after it returns is not in its group (the group was the thread's only).
    spark.sparkContext.parallelize([1]).count()
    assert set(tracker.getJobIdsForGroup(JIT_JOB_GROUP)) - before == ran

    stop = threading.Event()
    stop.set()
    assert warm_up_jit(spark, 1000, stop=stop) == 0
