"""A partitioned topic compacted in one Spark job against one job per partition (issue 30).

``partitions`` partitions, each a topic of its own with ``messages / partitions`` messages over
``keys / partitions`` keys (the main workload's shape otherwise), compacted in process on the
warm SparkSession two ways, alternating, ``runs`` times each: every partition's round in ONE
Spark job (``TwoPhaseCompactor.compact_many``, what the service now does), and the rounds one
after another, a job (or two) each (``compact`` per partition, what the service did before).
Then a +1% round of every partition on top of its first, both ways. The outputs of the two ways
are checked equal, partition by partition. The Spark jobs each way ran are counted through the
status tracker.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from compactor import CompactionJob, CompactionResult, TwoPhaseCompactor
from ledger.compacted_store import CompactedLedger
from ledger.entry import Position
from tests.benchmarks.measure import median
from tests.benchmarks.workload import Workload, WorkloadSpec, generate


@dataclass
class PartitionsResult:
    partitions: int
    messages: int
    keys: int
    one_job_s: list[float] = field(default_factory=list)
    per_partition_s: list[float] = field(default_factory=list)
    delta_one_job_s: list[float] = field(default_factory=list)
    delta_per_partition_s: list[float] = field(default_factory=list)
    jobs: dict[str, int] = field(default_factory=dict)  # Spark jobs of one round, each way
    rows: int = 0

    @property
    def speedup(self) -> float:
        return median(self.per_partition_s) / median(self.one_job_s)


def _rows(result: CompactionResult) -> list[tuple[Position, str | None, bytes | None]]:
    entries, _ = CompactedLedger(result.directory).read(Position(0, 0), 10_000_000)
    return [(e.position, e.key, e.value) for e in entries]


def run(
    spark: object,
    work_dir: Path,
    *,
    partitions: int = 16,
    messages: int = 2_000_000,
    keys: int = 200_000,
    runs: int = 3,
    log: Callable[[str], None] = print,
) -> PartitionsResult:
    compactor = TwoPhaseCompactor(spark)  # type: ignore[arg-type]
    sc = spark.sparkContext  # type: ignore[attr-defined]
    result = PartitionsResult(partitions, messages, keys)
    per = WorkloadSpec(messages // partitions, keys // partitions, entries_per_ledger=25_000)
    root = work_dir / "partitions"
    shutil.rmtree(root, ignore_errors=True)
    topics: list[Workload] = []
    for i in range(partitions):
        topics.append(generate(root / f"orders-partition-{i}", dataclasses.replace(per, seed=100 + i)))
    log(f"partitions: {partitions} x {per.messages:,} messages generated")
    out = 2_000_000_000

    def jobs_of(
        horizons: list[Position], previous: list[CompactionResult] | None, extra: int = 0
    ) -> list[CompactionJob]:
        nonlocal out
        made = []
        for i, w in enumerate(topics):
            out += 1
            ledgers = w.ledgers if previous is None else w.ledgers[-extra:]
            made.append(
                CompactionJob(
                    topic_root=w.topic_root,
                    inputs=[p for _, p in ledgers],
                    input_ledger_ids=[lid for lid, _ in ledgers],
                    previous_compacted=previous[i].directory if previous else None,
                    previous_horizon=previous[i].horizon if previous else None,
                    horizon=horizons[i],
                    output_ledger_id=out,
                )
            )
        return made

    def one_job(jobs: list[CompactionJob]) -> list[CompactionResult]:
        done = compactor.compact_many(jobs)
        for r in done:
            if isinstance(r, Exception):
                raise r
        return done  # type: ignore[return-value]

    def per_partition(jobs: list[CompactionJob]) -> list[CompactionResult]:
        return [compactor.compact(j) for j in jobs]

    ways: dict[str, Callable[[list[CompactionJob]], list[CompactionResult]]] = {
        "one job": one_job,
        "one after another": per_partition,
    }

    def timed(way: str, jobs: list[CompactionJob]) -> tuple[float, list[CompactionResult], int]:
        group = f"bench-partitions-{uuid.uuid4().hex}"
        sc.setJobGroup(group, way)
        try:
            t0 = time.perf_counter()
            done = ways[way](jobs)
            seconds = time.perf_counter() - t0
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        # compact_many names its own group: count both.
        n = len(sc.statusTracker().getJobIdsForGroup(group))
        if way == "one job":
            from compactor.two_phase import shared_group

            first = min(jobs, key=lambda j: j.output_ledger_id)
            shared = shared_group(first.topic_root, first.output_ledger_id, len(jobs))
            n += len(sc.statusTracker().getJobIdsForGroup(shared))
        return seconds, done, n

    horizons = [w.horizon for w in topics]
    firsts: dict[str, list[CompactionResult]] = {}
    for r in range(runs + 1):  # the first of each way unmeasured
        for way in ways if r % 2 == 0 else reversed(list(ways)):
            seconds, done, n = timed(way, jobs_of(horizons, None))
            if r == 0:
                result.jobs[way] = n
            else:
                (result.one_job_s if way == "one job" else result.per_partition_s).append(seconds)
            log(f"partitions: full round, {way}: {seconds:.2f} s ({n} Spark jobs)")
            firsts[way] = done
    for a, b in zip(firsts["one job"], firsts["one after another"], strict=True):
        rows = _rows(a)
        if rows != _rows(b):
            raise AssertionError(f"the two ways differ on {a.directory}")
        result.rows += len(rows)

    # +1% of every partition, on top of each way's own first round.
    more: list[Workload] = []
    for i, w in enumerate(topics):
        add = dataclasses.replace(per, messages=max(1, per.messages // 100), seed=500 + i)
        more.append(generate(w.topic_root, add, first_ledger_id=w.ledgers[-1][0] + 1))
    for i, w in enumerate(topics):
        w.ledgers.extend(more[i].ledgers)
    new = [m.horizon for m in more]
    extra = len(more[0].ledgers)
    for r in range(runs + 1):
        for way in ways if r % 2 == 0 else reversed(list(ways)):
            seconds, done, n = timed(way, jobs_of(new, firsts[way], extra))
            if r:
                (result.delta_one_job_s if way == "one job" else result.delta_per_partition_s).append(seconds)
            log(f"partitions: +1% round, {way}: {seconds:.2f} s ({n} Spark jobs)")
            for d in done:
                d.directory.delete_tree()
    shutil.rmtree(root, ignore_errors=True)
    return result
