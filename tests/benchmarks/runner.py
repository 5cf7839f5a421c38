"""Running the compaction benchmarks: full rounds, incremental rounds, sizes.

One *size* is a workload (``WorkloadSpec``) compacted ``runs`` times by each compactor, the
compactors taking turns within a run (project, DuckDB, Python) on the same files, after one
unmeasured warm-up round (``warmups``): the first round at a new size runs measurably slower
on the JVM (JIT, heap growth) and would otherwise skew a median of three. The
outputs of every run are checked equal row for row (:func:`verify_same_output`); a mismatch
stops the benchmark. What a run records per compactor: wall time of the whole call (read to
fsync), its output rows, its input bytes, and peak memory:

- project: RSS of this (driver) Python process and of its children (the Spark driver JVM,
  which in local mode runs the executors, and any Python workers), sampled every 50 ms;
- DuckDB and Python: the growth of this process's RSS during the call (peak - before), after
  handing freed memory back to the OS.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.benchmarks.compactors import (
    Compactor,
    Output,
    ProjectCompactor,
    Round,
    remove_output,
    verify_same_output,
)
from tests.benchmarks.measure import MemoryPeak, RssSampler, median, release_memory
from tests.benchmarks.workload import Workload, WorkloadSpec, generate, key_dictionary

Log = Callable[[str], None]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class CompactorRuns:
    """One compactor's runs on one input."""

    name: str
    seconds: list[float] = field(default_factory=list)
    peaks: list[MemoryPeak] = field(default_factory=list)
    details: list[dict[str, object]] = field(default_factory=list)
    warmup_seconds: list[float] = field(default_factory=list)  # unmeasured rounds, for the record
    rows: int = 0
    input_bytes: int = 0

    @property
    def median_s(self) -> float:
        return median(self.seconds)

    @property
    def median_cpu_s(self) -> float:
        return median([p.cpu_seconds for p in self.peaks])

    @property
    def max_peak(self) -> MemoryPeak | None:
        if not self.peaks:
            return None
        return MemoryPeak(
            baseline_self=min(p.baseline_self for p in self.peaks),
            peak_self=max(p.peak_self for p in self.peaks),
            peak_children=max(p.peak_children for p in self.peaks),
            peak_total=max(p.peak_total for p in self.peaks),
            cpu_seconds=max(p.cpu_seconds for p in self.peaks),
        )

    @property
    def max_delta_self(self) -> int:
        return max((p.delta_self for p in self.peaks), default=0)

    def add(self, out: Output, peak: MemoryPeak) -> None:
        self.seconds.append(out.seconds)
        self.peaks.append(peak)
        self.details.append(dict(out.details))
        self.rows = out.rows
        self.input_bytes = out.input_bytes


@dataclass
class SizeResult:
    """A full-compaction benchmark of one workload."""

    spec: WorkloadSpec
    messages: int
    ledgers: int
    parquet_bytes: int
    payload_bytes: int
    generate_s: float
    runs: dict[str, CompactorRuns]
    output_rows: int = 0


@dataclass
class IncrementalResult:
    """A second round with ``new_messages`` more, merged with each compactor's first round."""

    spec: WorkloadSpec
    new_messages: int
    full: dict[str, float]  # median full-round seconds per compactor
    runs: dict[str, CompactorRuns]
    output_rows: int = 0

    def share(self, name: str) -> float:
        return self.runs[name].median_s / self.full[name]


class Bench:
    """Holds the compactors (project first) and a scratch directory for workloads and outputs."""

    def __init__(
        self, work_dir: Path, compactors: Sequence[Compactor], *, runs: int, warmups: int = 1
    ) -> None:
        self.work_dir = Path(work_dir)
        self.compactors = list(compactors)
        self.runs = runs
        self.warmups = warmups
        self._n = 0
        self.labels: dict[int, str] = {}  # project output ledger id -> what it was (for profiles)

    # ------------------------------------------------------------------ helpers

    def make_workload(self, spec: WorkloadSpec) -> tuple[Workload, float]:
        root = self.work_dir / f"topic-{spec.messages}-{spec.keys}"
        if root.exists():
            shutil.rmtree(root)
        t0 = time.perf_counter()
        w = generate(root, spec)
        return w, time.perf_counter() - t0

    def _out_dir(self, c: Compactor, work: Round) -> Path:
        if isinstance(c, ProjectCompactor):
            return c.output_dir(work.topic_root)
        self._n += 1
        return self.work_dir / "outputs" / f"{c.name.split()[0].lower()}-{self._n}"

    def run_one(self, c: Compactor, work: Round, label: str) -> tuple[Output, MemoryPeak]:
        """One compaction by ``c``, with its memory sampled."""
        project = isinstance(c, ProjectCompactor)
        release_memory()
        out_dir = self._out_dir(c, work)
        if project:
            self.labels[int(out_dir.name.removeprefix("compacted-"))] = label
        with RssSampler(children=project) as sampler:
            out = c.compact(work, out_dir)
        assert sampler.peak is not None
        return out, sampler.peak

    def compact_all(
        self,
        work: Round | Callable[[Compactor], Round],
        label: str,
        runs: int,
        *,
        warmups: int | None = None,
        keep_last: bool = False,
        compactors: Sequence[Compactor] | None = None,
    ) -> tuple[dict[str, CompactorRuns], int, dict[str, Output]]:
        """``warmups`` unmeasured rounds, then ``runs`` measured rounds, of every compactor on
        ``work`` (a round, or a function giving each compactor its round); the outputs are
        checked equal every round. Returns the runs, the output row count, and
        (``keep_last``) the last outputs, left on disk."""
        compactors = list(compactors or self.compactors)
        warmups = self.warmups if warmups is None else warmups
        results = {c.name: CompactorRuns(c.name) for c in compactors}
        rows = 0
        last: dict[str, Output] = {}
        for i in range(warmups + runs):
            measured = i >= warmups
            what = f"{label} run {i - warmups + 1}" if measured else f"{label} warm-up {i + 1}"
            outs: list[Output] = []
            for c in compactors:
                out, peak = self.run_one(c, work(c) if callable(work) else work, what)
                if measured:
                    results[c.name].add(out, peak)
                else:
                    results[c.name].warmup_seconds.append(out.seconds)
                outs.append(out)
                log(f"{what}: {c.name} {out.seconds:.2f} s, {out.rows:,} rows")
            rows = verify_same_output(outs)
            final = i == warmups + runs - 1
            for o in outs:
                if keep_last and final:
                    last[o.compactor] = o
                else:
                    remove_output(o)
        return results, rows, last

    # ------------------------------------------------------------------ benchmarks

    def full_round(
        self,
        spec: WorkloadSpec,
        *,
        runs: int | None = None,
        warmups: int | None = None,
        keep: bool = False,
        compactors: Sequence[Compactor] | None = None,
    ) -> tuple[SizeResult, Workload, dict[str, Output]]:
        """Full compaction of a fresh workload by every compactor (or ``compactors``), ``runs``
        times."""
        log(f"{spec.label}: generating {spec.messages:,} messages over {spec.keys:,} keys")
        w, gen_s = self.make_workload(spec)
        log(f"{spec.label}: {len(w.ledgers)} ledgers, {w.parquet_bytes / 1e6:,.0f} MB in {gen_s:.1f} s")
        work = Round(w.topic_root, w.ledgers, w.horizon)
        runs_, rows, last = self.compact_all(
            work,
            f"{spec.label} full",
            runs or self.runs,
            warmups=warmups,
            keep_last=keep,
            compactors=compactors,
        )
        result = SizeResult(
            spec=spec,
            messages=w.messages,
            ledgers=len(w.ledgers),
            parquet_bytes=w.parquet_bytes,
            payload_bytes=w.payload_bytes,
            generate_s=gen_s,
            runs=runs_,
            output_rows=rows,
        )
        return result, w, last

    def incremental(
        self, base: SizeResult, w: Workload, previous: dict[str, Output], *, share: float = 0.01
    ) -> IncrementalResult:
        """Add ``share`` x messages as new sealed ledgers after ``w`` and compact again, each
        compactor merging its own previous output with the new ledgers."""
        spec = w.spec
        new = max(1, int(spec.messages * share))
        add = WorkloadSpec(
            messages=new,
            keys=spec.keys,
            value_bytes=spec.value_bytes,
            tombstone_share=spec.tombstone_share,
            entries_per_ledger=spec.entries_per_ledger,
            seed=spec.seed,
        )
        more = generate(
            w.topic_root, add, first_ledger_id=w.ledgers[-1][0] + 1, key_dict=key_dictionary(spec.keys)
        )
        log(f"{spec.label}: +{new:,} messages in {len(more.ledgers)} new ledger(s), horizon {more.horizon}")
        ledgers = [*w.ledgers, *more.ledgers]

        def work(c: Compactor) -> Round:
            return Round(w.topic_root, ledgers, more.horizon, previous[c.name].previous(w.horizon))

        results, rows, _ = self.compact_all(work, f"{spec.label} incremental", self.runs)
        return IncrementalResult(
            spec=spec,
            new_messages=new,
            full={name: r.median_s for name, r in base.runs.items()},
            runs=results,
            output_rows=rows,
        )

    def warm_up(self, spec: WorkloadSpec) -> None:
        """One round of every compactor on a tiny input: starts and JIT-warms the JVM, imports
        DuckDB. Not measured."""
        w, _ = self.make_workload(spec)
        work = Round(w.topic_root, w.ledgers, w.horizon)
        outs = [c.compact(work, self._out_dir(c, work)) for c in self.compactors]
        verify_same_output(outs)
        shutil.rmtree(w.topic_root, ignore_errors=True)
        for o in outs:
            remove_output(o)

    def drop(self, w: Workload) -> None:
        shutil.rmtree(w.topic_root, ignore_errors=True)
