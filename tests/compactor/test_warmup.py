"""The start-up warm-up round: it works on a fresh directory and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from compactor.warmup import warm_up


def test_warm_up_compacts_a_scratch_topic_and_removes_it(spark: SparkSession, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    stale = data_dir / ".compactor-warm-up-crashed"
    stale.mkdir(parents=True)  # as a process killed during its warm-up leaves it
    # 16 keys; each ledger deletes the keys of entries 0, 7, 14, ... (i % 7 == 0).
    kept = warm_up(spark, data_dir)
    assert kept == len(
        {i % 16 for i in range(64) if i % 7 != 0} - {i % 16 for i in range(64) if i % 7 == 0 and i >= 48}
    )
    assert list(data_dir.iterdir()) == []
