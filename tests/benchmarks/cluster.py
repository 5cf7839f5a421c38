"""The ``cluster`` section: the project's compactor on a Spark standalone cluster of two Workers
(one core each, started from the pyspark wheel as separate processes, executors running an
interpreter with only pyarrow, numpy and pandas) against ``local[*]``, on the same workload.

Both modes compact the same generated workload (full round, then an incremental round of 1%),
after the same warm-up; their outputs are checked equal. The cluster's session is configured
as the service configures it (``compactor.spark.get_spark`` with ``python``, the code zip
shipped with ``addPyFile``), and its executors are probed (``compactor.cluster``) before the
clock starts, so executor start-up is not in the figure.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks.compactors import Fingerprint, ProjectCompactor, fingerprint
from tests.benchmarks.report import Table, f_s, f_x
from tests.benchmarks.runner import Bench, CompactorRuns, Log
from tests.benchmarks.workload import WorkloadSpec

WORKERS, CORES_PER_WORKER = 2, 1
WORKER_MEMORY, EXECUTOR_MEMORY = "3g", "2g"


@dataclass
class ModeResult:
    """One deployment's full and incremental rounds of the workload."""

    mode: str
    full: CompactorRuns
    incremental: CompactorRuns
    parts: int
    fingerprint: tuple[int, str, str, str]
    setup_s: float = 0.0


@dataclass
class ClusterResult:
    spec: WorkloadSpec
    new_messages: int
    local: ModeResult
    cluster: ModeResult
    cluster_start_s: float


def _digest(fp: Fingerprint) -> tuple[int, str, str, str]:
    """What must be equal between the deployments' last incremental outputs."""
    return fp.rows, hashlib.sha256(fp.ids.tobytes()).hexdigest(), fp.key_digest, fp.value_digest


def _measure(
    mode: str, spark: object, work_dir: Path, spec: WorkloadSpec, runs: int, warm: WorkloadSpec
) -> ModeResult:
    project = ProjectCompactor(spark)
    bench = Bench(work_dir, [project], runs=runs, warmups=1)
    bench.warm_up(warm)
    full, w, last = bench.full_round(spec, keep=True)
    inc = bench.incremental(full, w, last)
    out = last[project.name]
    result = ModeResult(
        mode,
        full.runs[project.name],
        inc.runs[project.name],
        len(out.files),
        _digest(fingerprint(out.files, out.dead)),
    )
    bench.drop(w)
    return result


def run(
    work_dir: Path, spec: WorkloadSpec, warm: WorkloadSpec, *, runs: int, driver_memory: str, log: Log
) -> ClusterResult:
    from compactor.cluster import check_executors
    from compactor.spark import get_spark, stop_spark
    from tests.cluster import SparkCluster, executor_python

    stop_spark()
    log(f"cluster section: local[*] on {spec.label}")
    local = _measure("local[*]", get_spark(driver_memory=driver_memory), work_dir / "local", spec, runs, warm)
    stop_spark()

    python = executor_python()
    cluster = SparkCluster(
        work_dir / "spark-cluster", workers=WORKERS, cores=CORES_PER_WORKER, memory=WORKER_MEMORY
    )
    log(f"cluster section: starting a Master and {WORKERS} Workers from the pyspark wheel")
    t0 = time.perf_counter()
    cluster.start()
    started = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        spark = get_spark(
            master=cluster.master_url,
            driver_memory=driver_memory,
            python=str(python),
            extra_conf={
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.memory": EXECUTOR_MEMORY,
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            },
        )
        hosts = check_executors(spark, work_dir)
        setup = time.perf_counter() - t0
        log(f"cluster section: session and executors ready in {setup:.1f} s ({', '.join(hosts)})")
        remote = _measure(f"standalone, {WORKERS} Workers x {CORES_PER_WORKER} core", spark,
                          work_dir / "cluster", spec, runs, warm)  # fmt: skip
        remote.setup_s = setup
    finally:
        stop_spark()
        cluster.stop()
    if remote.fingerprint != local.fingerprint:
        raise AssertionError(f"cluster output {remote.fingerprint} differs from local {local.fingerprint}")
    return ClusterResult(spec, max(1, spec.messages // 100), local, remote, started)


def table(r: ClusterResult) -> Table:
    t = Table(
        f"Spark cluster: {r.spec.label}, two-Worker standalone cluster against local[*]",
        ["deployment", "full round s", "runs (s)", "incremental s (+1%)", "runs (s)", "part files"],
    )
    for m in (r.local, r.cluster):
        t.add(
            m.mode,
            f_s(m.full.median_s),
            " / ".join(f_s(x) for x in m.full.seconds),
            f_s(m.incremental.median_s),
            " / ".join(f_s(x) for x in m.incremental.seconds),
            m.parts,
        )
    t.notes.append(
        f"cluster / local[*]: full round {f_x(r.cluster.full.median_s / r.local.full.median_s)}, "
        f"incremental round {f_x(r.cluster.incremental.median_s / r.local.incremental.median_s)}"
    )
    t.notes.append(
        f"the cluster: a Master and {WORKERS} Workers ({CORES_PER_WORKER} core, {WORKER_MEMORY} each; "
        f"executors {EXECUTOR_MEMORY}) started from the pyspark wheel's bin/spark-class in "
        f"{r.cluster_start_s:.1f} s; executors run a venv with only pyarrow, numpy and pandas, the code "
        f"arrives as the zip the service ships; session start and the executor probe took "
        f"{r.cluster.setup_s:.1f} s, before the clock"
    )
    t.notes.append(
        "what the shared 2 cores mean: the cluster adds no cores here. The driver, the Master, two "
        "Worker daemons, two executor JVMs and their Python workers all run on this machine's 2 cores, "
        "which local[*] uses with one JVM; both modes compact in 2 tasks at a time. So the ratio is "
        "what the cluster deployment itself costs at equal cores (scheduling and task results over RPC, "
        "separate executor JVMs competing for the same cores), within the noise of a shared machine; "
        "it is no speed-up: on real hardware each Worker brings its own cores and disks, and a round "
        "runs one task per executor core"
    )
    t.notes.append("outputs of the two deployments checked equal (rows, ids, keys, values)")
    return t
