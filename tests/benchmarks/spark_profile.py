"""Stage-level profile of the project's Spark jobs, from Spark's event log (``--spark-profile``).

With ``--spark-profile`` the benchmark starts Spark with ``spark.eventLog.enabled`` and reads
the log after the session stops: per compaction (found by the job description the compactor
sets, ``compaction {ledger_id}: both phases|phase one|phase two``), per stage: tasks, wall time, summed task
run time and CPU time, input read, shuffle written and read, memory and disk spill, peak
execution memory, GC time. The figures are Spark's own task metrics summed over the stage.
The final (adaptive) physical plans are written next to it for reading.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.benchmarks.report import Table, f_mb

_DESC = re.compile(r"^compaction (\d+): (both phases|phase one|phase two)$")

_METRICS = {
    "internal.metrics.executorRunTime": "run_ms",
    "internal.metrics.executorCpuTime": "cpu_ns",
    "internal.metrics.jvmGCTime": "gc_ms",
    "internal.metrics.input.bytesRead": "input_bytes",
    "internal.metrics.input.recordsRead": "input_records",
    "internal.metrics.shuffle.write.bytesWritten": "shuffle_write",
    "internal.metrics.shuffle.write.recordsWritten": "shuffle_records",
    "internal.metrics.shuffle.read.localBytesRead": "shuffle_read_local",
    "internal.metrics.shuffle.read.remoteBytesRead": "shuffle_read_remote",
    "internal.metrics.memoryBytesSpilled": "spill_memory",
    "internal.metrics.diskBytesSpilled": "spill_disk",
    "internal.metrics.peakExecutionMemory": "peak_exec_memory",
    "internal.metrics.output.bytesWritten": "output_bytes",
}


@dataclass
class StageFigures:
    stage_id: int
    name: str
    tasks: int
    wall_ms: int
    metrics: dict[str, int] = field(default_factory=dict)


@dataclass
class CompactionProfile:
    ledger_id: int
    stages: dict[str, list[StageFigures]] = field(default_factory=dict)  # phase -> stages


def enable_conf(event_dir: Path) -> dict[str, str]:
    """The Spark settings that write an event log into ``event_dir``."""
    event_dir.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": "file:" + str(event_dir.absolute()),
        "spark.eventLog.compress": "false",  # plain JSON lines, one file
        "spark.eventLog.rolling.enabled": "false",
    }


def read_profiles(event_dir: Path) -> tuple[dict[int, CompactionProfile], list[str]]:
    """Per compacted-ledger id, its stages; and the final physical plans of the SQL executions."""
    profiles: dict[int, CompactionProfile] = {}
    stage_owner: dict[int, tuple[int, str]] = {}
    plans: list[str] = []
    for path in sorted(event_dir.rglob("*")):
        if not path.is_file() or path.stat().st_size == 0:
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                ev = json.loads(line)
                kind = ev.get("Event", "")
                if kind == "SparkListenerJobStart":
                    desc = (ev.get("Properties") or {}).get("spark.job.description") or ""
                    m = _DESC.match(desc)
                    if m:
                        for sid in ev.get("Stage IDs", []):
                            stage_owner[int(sid)] = (int(m.group(1)), m.group(2))
                elif kind == "SparkListenerStageCompleted":
                    info = ev["Stage Info"]
                    owner = stage_owner.get(int(info["Stage ID"]))
                    if owner is None or "Submission Time" not in info:
                        continue
                    fig = StageFigures(
                        stage_id=int(info["Stage ID"]),
                        name=str(info.get("Stage Name", ""))[:60],
                        tasks=int(info.get("Number of Tasks", 0)),
                        wall_ms=int(info.get("Completion Time", 0)) - int(info["Submission Time"]),
                    )
                    for acc in info.get("Accumulables", []):
                        key = _METRICS.get(acc.get("Name", ""))
                        if key is not None:
                            with contextlib.suppress(TypeError, ValueError):
                                fig.metrics[key] = int(acc["Value"])
                    ledger_id, phase = owner
                    profiles.setdefault(ledger_id, CompactionProfile(ledger_id)).stages.setdefault(
                        phase, []
                    ).append(fig)
                elif kind == "org.apache.spark.sql.execution.ui.SparkListenerSQLAdaptiveExecutionUpdate":
                    plan = ev.get("physicalPlanDescription", "")
                    if "isFinalPlan=true" in plan:
                        plans.append(plan)
    return profiles, plans


def profile_table(profile: CompactionProfile, label: str) -> Table:
    t = Table(
        f"Spark stages of the project's compaction: {label}",
        [
            "phase / stage",
            "tasks",
            "wall ms",
            "task run ms",
            "task CPU ms",
            "GC ms",
            "input MB",
            "shuffle write MB",
            "shuffle read MB",
            "spill mem/disk MB",
            "peak exec mem MB",
        ],
    )
    for phase in ("both phases", "phase one", "phase two"):
        for s in profile.stages.get(phase, []):
            m = s.metrics
            t.add(
                f"{phase} / {s.stage_id}: {s.name}",
                s.tasks,
                s.wall_ms,
                m.get("run_ms", 0),
                m.get("cpu_ns", 0) // 1_000_000,
                m.get("gc_ms", 0),
                f_mb(m.get("input_bytes", 0)),
                f_mb(m.get("shuffle_write", 0)),
                f_mb(m.get("shuffle_read_local", 0) + m.get("shuffle_read_remote", 0)),
                f"{f_mb(m.get('spill_memory', 0))}/{f_mb(m.get('spill_disk', 0))}",
                f_mb(m.get("peak_exec_memory", 0)),
            )
    t.notes.append(
        "Spark's task metrics summed over each stage (event log); wall ms = stage submission to completion"
    )
    return t
