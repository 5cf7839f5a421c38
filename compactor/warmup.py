"""Warming a new SparkSession up, so that the service's first rounds do not pay for it.

The first round in a process pays for starting the Python workers, importing pyarrow in
them and compiling the JVM's code paths: seconds, against well under one for a warm round of
millions of messages. :func:`warm_up` is a throw-away round that pays for that.

Then the JVM's optimising compiler (C2) keeps compiling the path every Spark job takes for
about the next hundred jobs, on a core the rounds would use: measured at 5M messages, a +1%
round took 137 ms over a fresh JVM's first 20 rounds (C2 busy 76 ms a round), 125 ms over the
next 20 and 108 ms from the 41st on. :func:`warm_up_jit` runs that many empty jobs (Python
tasks on every core, as a round's tasks run), so that the first real rounds start at the
settled speed (98 ms): about 13 s of a background thread at start-up, once.

The service runs both in the background at start-up, right after the session starts.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from pyspark.sql import SparkSession

from compactor.result import CompactionJob
from compactor.spark import job_group
from compactor.two_phase import TwoPhaseCompactor
from ledger.entry import Entry, Position
from ledger.parquet_store import seal
from ledger.paths import sealed_path
from ledger.storage import as_storage_path

_PREFIX = ".compactor-warm-up-"
_LEDGERS = 2
_ENTRIES = 64
# Empty jobs after the warm-up round: enough for C2 to have compiled the job path (see above).
JIT_JOBS = 150
# The Spark job group of those jobs (as the UI and the status tracker show them).
JIT_JOB_GROUP = "compactor-warm-up"


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
        topic = as_storage_path(root)  # a local disk's: the warm-up pays for Spark, not for storage
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
        inputs = [as_storage_path(p) for p in paths]
        first = compactor.compact(
            CompactionJob(topic, inputs[:_LEDGERS], ids, None, None, horizon, output_ledger_id=100)
        )
        last = Position(_LEDGERS + 1, _ENTRIES - 1)
        second = compactor.compact(
            CompactionJob(
                topic, inputs, [*ids, _LEDGERS + 1], first.directory, horizon, last, output_ledger_id=101
            )
        )
        return second.records_kept


def _each(partition: Iterable[int]) -> Iterator[int]:
    yield from partition


def warm_up_jit(spark: SparkSession, jobs: int = JIT_JOBS, stop: threading.Event | None = None) -> int:
    """Run ``jobs`` empty Spark jobs, one Python task per core each, one after the other, for
    the JVM's compilers (see the module docstring); ends early once ``stop`` is set. Returns
    the jobs run."""
    sc = spark.sparkContext
    cores = max(1, sc.defaultParallelism)
    rdd = sc.parallelize(range(cores), cores)
    with job_group(spark, JIT_JOB_GROUP):  # thread-local: only these jobs
        for done in range(jobs):
            if stop is not None and stop.is_set():
                return done
            rdd.mapPartitions(_each).collect()
        return jobs
