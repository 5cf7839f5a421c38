"""The service's Spark engine at start-up: the warm-up runs in the background and ends when
the service stops, instead of holding Spark busy for its full length."""

from __future__ import annotations

import time

from pyspark.sql import SparkSession

from compactor.warmup import JIT_JOB_GROUP
from service.engine import AVAILABLE, SparkEngine
from service.settings import Settings


def test_stopping_the_service_ends_its_warm_up(spark: SparkSession, settings: Settings) -> None:
    # The warm-up's empty jobs would run for hours: only the stop ends them.
    engine = SparkEngine(settings.model_copy(update={"spark_warmup": True, "spark_warmup_jobs": 1_000_000}))
    tracker = spark.sparkContext.statusTracker()
    before = len(tracker.getJobIdsForGroup(JIT_JOB_GROUP))
    thread = engine.start_in_background()
    deadline = time.monotonic() + 120
    while len(tracker.getJobIdsForGroup(JIT_JOB_GROUP)) < before + 3:
        assert thread.is_alive() and time.monotonic() < deadline, "the warm-up's jobs did not start"
        time.sleep(0.05)
    assert engine.status == AVAILABLE  # rounds need not wait for the warm-up's end
    assert engine.warming_up  # /health says so meanwhile

    engine.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert not engine.warming_up
    ran = len(tracker.getJobIdsForGroup(JIT_JOB_GROUP)) - before
    time.sleep(0.5)
    assert len(tracker.getJobIdsForGroup(JIT_JOB_GROUP)) - before == ran  # none after the stop
    assert list(settings.data_dir.glob(".compactor-warm-up-*")) == []  # the round's scratch is gone
