"""Live progress of a round: Spark's completed tasks while a job runs, and a round's phases."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compactor import TwoPhaseCompactor
from compactor.progress import (
    COMMIT,
    PHASE_ONE,
    PHASE_TWO,
    ProgressSnapshot,
    RoundProgress,
    SparkJobTracker,
    combined,
)
from ledger.entry import Position
from tests.compactor.test_two_phase import Topic

pytestmark = pytest.mark.spark


@contextmanager
def sampling(progress: RoundProgress, every_s: float = 0.02) -> Iterator[list[ProgressSnapshot]]:
    """Snapshots of ``progress`` taken from another thread while the body runs, as a reader
    of the REST status would."""
    seen: list[ProgressSnapshot] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(progress.snapshot())
            time.sleep(every_s)

    t = threading.Thread(target=sample)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join()
        seen.append(progress.snapshot())


def slow_task(x: int) -> int:
    time.sleep(0.4)
    return x


def test_the_tracker_reports_tasks_completed_while_the_job_runs(spark: SparkSession) -> None:
    progress = RoundProgress()
    progress.set_totals(entries=600, bytes_=6000)
    with sampling(progress) as seen, SparkJobTracker(spark, "progress-test", progress).tracking():
        # Six tasks on two cores: three waves, so the job is seen a third and two thirds done.
        spark.sparkContext.parallelize(range(6), 6).map(slow_task).collect()
    percents = [s.percent for s in seen]
    assert percents == sorted(percents)  # never goes back
    middle = [s for s in seen if 0 < s.entries_read < 600]
    assert middle, "no progress seen while the job ran"
    assert {s.entries_read for s in middle} <= {100, 200, 300, 400, 500}
    assert seen[-1].entries_read == 600 and seen[-1].bytes_read == 6000
    assert seen[-1].percent == 45.0 and seen[-1].phase == PHASE_ONE


def test_jobs_outside_the_group_do_not_count(spark: SparkSession) -> None:
    progress = RoundProgress()
    tracker = SparkJobTracker(spark, "progress-other", progress)
    spark.sparkContext.parallelize(range(2), 2).count()  # not in the group
    assert tracker.fraction() is None


def test_bands_of_the_phases() -> None:
    p = RoundProgress(started_at_ms=123)
    p.set_totals(entries=10, bytes_=100)
    p.advance(0.5)
    assert (p.snapshot().percent, p.snapshot().entries_read) == (22.5, 5)
    p.enter(PHASE_TWO)
    assert (p.snapshot().percent, p.snapshot().entries_read) == (45.0, 0)
    p.advance(1.0)
    p.advance(0.2)  # a fraction that drops (a new stage appeared) does not move it back
    assert p.snapshot().percent == 95.0
    p.enter(COMMIT)
    p.advance(1.0)
    snap = p.snapshot()
    assert (snap.phase, snap.percent, snap.started_at) == (COMMIT, 100.0, 123)


def test_the_progress_of_partitions_together_weighs_each_by_its_bytes() -> None:
    def snap(phase: str, percent: float, read: int, total: int, started: int) -> ProgressSnapshot:
        return ProgressSnapshot(phase, read, total, read * 10, total * 10, percent, started, 1_000 - started)

    both = combined([snap(PHASE_TWO, 90.0, 30, 30, 100), snap(PHASE_ONE, 10.0, 5, 90, 200)])
    assert both == ProgressSnapshot(PHASE_ONE, 35, 120, 350, 1200, 30.0, 100, 900)
    # Before any round knows its bytes: each counts the same.
    assert combined([snap(PHASE_ONE, 40.0, 0, 0, 5), snap(COMMIT, 100.0, 0, 0, 9)]).percent == 70.0
    with pytest.raises(ValueError):
        combined([])


@pytest.mark.parametrize("strategy", ["offset", "eventTime"])
def test_a_round_goes_through_its_phases_to_the_commit(tmp_path: Path, spark: SparkSession, strategy) -> None:
    topic = Topic(tmp_path / "t")
    topic.root.mkdir()
    for ledger in range(1, 5):
        topic.seal(ledger, [(f"k{i % 7}", b"v%d" % i) for i in range(40)])
    job = dataclasses.replace(topic.job(9, horizon=Position(4, 39)), strategy=strategy)
    progress = RoundProgress()
    with sampling(progress, 0.005) as seen:
        result = TwoPhaseCompactor(spark, min_part_bytes=0).compact(job, progress)
    final = seen[-1]
    assert (final.phase, final.percent) == (COMMIT, 95.0)
    assert final.entries_total == result.entries_read == 160
    assert final.bytes_total == result.bytes_in
    percents = [s.percent for s in seen]
    assert percents == sorted(percents)
    # The phases in order, each entered before its Spark work starts.
    order = [p for i, p in enumerate(s.phase for s in seen) if i == 0 or p != seen[i - 1].phase]
    assert order in ([PHASE_ONE, PHASE_TWO, COMMIT], [PHASE_ONE, COMMIT])
    if strategy == "eventTime":  # Spark SQL for phase one: always two jobs
        assert PHASE_TWO in order
