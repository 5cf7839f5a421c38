"""The ``shapes`` section: a full round on differently shaped data, the project against DuckDB.

The main workload (short keys, 100-byte values, no properties, every message keyed) is one
shape among many a topic can have; issue 28 found full rounds behind DuckDB on shapes it
never used. Each shape here changes one thing of a common base (2M messages over 200k keys,
100-byte random values, 5% tombstones) -- see ``workload.shapes`` -- and is compacted by the project's
``TwoPhaseCompactor`` and by DuckDB in turn (which goes first alternating between runs),
after one unmeasured round of each, with the outputs checked equal every run.

A shape's workload is kept under the work directory with its spec beside it, so that a run
with ``--work-dir`` and ``--keep-work-dir`` reuses it (generating the big-value shape alone
writes 8 GB).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks.compactors import Compactor, Round, remove_output, verify_same_output
from tests.benchmarks.measure import median
from tests.benchmarks.runner import Bench, Log
from tests.benchmarks.workload import BASE, QUICK_BASE, Shape, Workload, generate, shapes

__all__ = ["BASE", "QUICK_BASE", "Shape", "ShapeResult", "run", "shapes", "workload"]


@dataclass
class ShapeResult:
    shape: Shape
    messages: int
    parquet_bytes: int
    output_rows: int
    seconds: dict[str, list[float]]
    # CPU seconds of each run (the project's: driver, JVM and Python workers; DuckDB's: its
    # threads), steadier than the time on a machine whose cores are shared with others.
    cpu_seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def median(self, name: str) -> float:
        return median(self.seconds[name])

    def median_cpu(self, name: str) -> float:
        return median(self.cpu_seconds[name])


def workload(work_dir: Path, shape: Shape, log: Log) -> Workload:
    """The shape's sealed ledgers, generated or (same spec on disk) reused."""
    root = work_dir / "shapes" / shape.name.replace(" ", "-").replace("+", "and")
    marker = root / "spec.json"
    wanted = json.dumps(dataclasses.asdict(shape.spec), sort_keys=True)
    if marker.exists() and (root / "workload.json").exists() and marker.read_text() == wanted:
        saved = json.loads((root / "workload.json").read_text())
        from ledger.entry import Position

        log(f"shape {shape.name}: reusing {root}")
        return Workload(
            spec=shape.spec,
            topic_root=root / "topic",
            ledgers=[(i, Path(p)) for i, p in saved["ledgers"]],
            horizon=Position(*saved["horizon"]),
            messages=saved["messages"],
            parquet_bytes=saved["parquet_bytes"],
            payload_bytes=saved["payload_bytes"],
        )
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    w = generate(root / "topic", shape.spec)
    log(f"shape {shape.name}: generated {w.parquet_bytes / 1e6:,.0f} MB in {time.perf_counter() - t0:.1f} s")
    (root / "workload.json").write_text(
        json.dumps(
            {
                "ledgers": [[i, str(p)] for i, p in w.ledgers],
                "horizon": [w.horizon.ledger_id, w.horizon.entry_id],
                "messages": w.messages,
                "parquet_bytes": w.parquet_bytes,
                "payload_bytes": w.payload_bytes,
            }
        )
    )
    marker.write_text(wanted)
    return w


def run(
    bench: Bench,
    compactors: Sequence[Compactor],
    chosen: Sequence[Shape],
    *,
    runs: int,
    warmups: int = 1,
    keep: bool = False,
    log: Log,
) -> list[ShapeResult]:
    """Every shape in ``chosen``: ``warmups`` unmeasured and ``runs`` measured rounds of each
    compactor, the order alternating, the outputs checked equal each time."""
    results: list[ShapeResult] = []
    for shape in chosen:
        w = workload(bench.work_dir, shape, log)
        work = Round(w.topic_root, w.ledgers, w.horizon)
        seconds: dict[str, list[float]] = {c.name: [] for c in compactors}
        cpu: dict[str, list[float]] = {c.name: [] for c in compactors}
        rows = 0
        for i in range(warmups + runs):
            order = list(compactors) if i % 2 == 0 else list(reversed(compactors))
            outs = []
            for c in order:
                out, peak = bench.run_one(c, work, f"shape {shape.name} run {i}")
                outs.append(out)
                if i >= warmups:
                    seconds[c.name].append(out.seconds)
                    cpu[c.name].append(peak.cpu_seconds)
                what = "run" if i >= warmups else "warm-up"
                cpu_s = peak.cpu_seconds
                log(f"shape {shape.name} {what} {i}: {c.name} {out.seconds:.2f} s, CPU {cpu_s:.2f} s")
            rows = verify_same_output(outs)
            for o in outs:
                remove_output(o)
        results.append(ShapeResult(shape, w.messages, w.parquet_bytes, rows, seconds, cpu))
        if not keep:
            shutil.rmtree(w.topic_root.parent, ignore_errors=True)
    return results
