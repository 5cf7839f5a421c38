"""A throw-away compaction round that warms a new SparkSession up.

The first round in a process pays for starting the Python workers, importing pyarrow in
them and compiling the JVM's code paths: seconds, against well under one for a warm round of
millions of messages. The service runs this in the background at start-up, right after the
session starts, so that the first real round does not.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from compactor.result import CompactionJob
from compactor.two_phase import TwoPhaseCompactor
from ledger.entry import Entry, Position
from ledger.parquet_store import seal
from ledger.paths import sealed_path

_PREFIX = ".compactor-warm-up-"
_LEDGERS = 2
_ENTRIES = 64


def warm_up(spark: SparkSession, under: Path | None = None) -> int:
    """Compact a tiny topic in a scratch directory inside ``under`` (storage the executors
    read, as the real rounds' files are; default: the system's temporary directory), removed
    after, through both phases on every core, incrementally too. Returns the records the last
    round kept."""
    if under is not None:
        Path(under).mkdir(parents=True, exist_ok=True)
        for stale in Path(under).glob(f"{_PREFIX}*"):  # left by a process that crashed here
            shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=_PREFIX, dir=under) as scratch:
        root = Path(scratch) / "topic"
        root.mkdir()
        paths = []
        for ledger in range(1, _LEDGERS + 2):
            entries = [
                Entry(ledger, i, f"k{i % 16}", None if i % 7 == 0 else b"v", {}, i, None)
                for i in range(_ENTRIES)
            ]
            paths.append(sealed_path(root, ledger))
            seal(entries, paths[-1])
        compactor = TwoPhaseCompactor(spark, min_part_bytes=0)
        horizon = Position(_LEDGERS, _ENTRIES - 1)
        ids = list(range(1, _LEDGERS + 1))
        first = compactor.compact(
            CompactionJob(root, paths[:_LEDGERS], ids, None, None, horizon, output_ledger_id=100)
        )
        last = Position(_LEDGERS + 1, _ENTRIES - 1)
        second = compactor.compact(
            CompactionJob(
                root, paths, [*ids, _LEDGERS + 1], first.directory, horizon, last, output_ledger_id=101
            )
        )
        return second.records_kept
