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

import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from pyspark.sql import SparkSession

from compactor.result import CompactionJob
from compactor.spark import job_group
from compactor.two_phase import TwoPhaseCompactor
from ledger.entry import Entry, Position
from ledger.parquet_store import seal
from ledger.paths import sealed_path
from ledger.storage import StoragePath, as_storage_path

_PREFIX = ".compactor-warm-up-"
_LEDGERS = 2
_ENTRIES = 64
# Empty jobs after the warm-up round: enough for C2 to have compiled the job path (see above).
JIT_JOBS = 150
# The Spark job group of those jobs (as the UI and the status tracker show them).
JIT_JOB_GROUP = "compactor-warm-up"
# A warm-up scratch prefix in a bucket this old was left by a start-up that crashed.
_STALE_MS = 3600_000


def warm_up(spark: SparkSession, under: Path | StoragePath | None = None) -> int:
    """Compact a tiny topic in a scratch directory inside ``under``, removed after, through
    both phases on every core, incrementally too. Returns the records the last round kept.

    ``under`` is storage the executors read, as the real rounds' files are: a local directory
    (default: the system's temporary directory) when they share this machine's disk, the
    ledgers' storage (a bucket) on a cluster that shares none. The scratch directory is named
    by its start time, so that a later start-up removes what a crashed one left, and nothing
    that another instance sharing that storage is warming up with now."""
    if under is None:
        with tempfile.TemporaryDirectory(prefix=_PREFIX) as temporary:
            return _round_trip(spark, as_storage_path(Path(temporary)) / "topic")
    where = as_storage_path(under)
    now_ms = int(time.time() * 1000)
    for stale in where.dirs():
        if stale.name.startswith(_PREFIX) and now_ms - _started_ms(stale.name) > _STALE_MS:
            stale.delete_tree()
    scratch = where / f"{_PREFIX}{now_ms}-{uuid.uuid4().hex[:12]}"
    try:
        return _round_trip(spark, scratch / "topic")
    finally:
        scratch.delete_tree()


def _started_ms(name: str) -> int:
    """When the warm-up that named its scratch directory ``name`` started (0: not said, as
    older versions named it)."""
    stamp = name[len(_PREFIX) :].split("-", 1)[0]
    return int(stamp) if stamp.isdigit() else 0


def _round_trip(spark: SparkSession, topic: StoragePath) -> int:
    """Seal a few tiny ledgers under ``topic``, compact them, then compact once more over one
    more ledger (a layered round)."""
    paths = []
    for ledger in range(1, _LEDGERS + 2):
        entries = [
            Entry(ledger, i, f"k{i % 16}", None if i % 7 == 0 else b"v", {}, i, None) for i in range(_ENTRIES)
        ]
        paths.append(sealed_path(topic, ledger))
        seal(entries, paths[-1])
    compactor = TwoPhaseCompactor(spark, min_part_bytes=0)
    horizon = Position(_LEDGERS, _ENTRIES - 1)
    ids = list(range(1, _LEDGERS + 1))
    first = compactor.compact(
        CompactionJob(topic, paths[:_LEDGERS], ids, None, None, horizon, output_ledger_id=100)
    )
    last = Position(_LEDGERS + 1, _ENTRIES - 1)
    every = [*ids, _LEDGERS + 1]
    second = compactor.compact(
        CompactionJob(topic, paths, every, first.directory, horizon, last, output_ledger_id=101)
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
