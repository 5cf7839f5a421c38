"""Live progress of one compaction round, for whoever started it to read while it runs.

The compactor writes a :class:`RoundProgress` (the phase, and how far its Spark job is), the
caller reads :meth:`RoundProgress.snapshot` from any thread. How far a Spark job is comes from
Spark's status tracker (:class:`SparkJobTracker`): the tasks completed of the stages of the
round's job group, polled by a small thread while the job runs. The tasks themselves report
nothing, so a round's tasks pay nothing for it; progress moves by whole tasks (a round has one
task per group of input files, see ``TwoPhaseCompactor._group_count``).

The round's percent runs across phases: phase one takes it to 45%, phase two to 95%, the
commit (fsyncs, manifest, rename; then the caller's metadata transaction) to 100%. A round
that runs both phases in one Spark job reports ``phase-one`` from 0 to 95%. ``entriesRead``
and ``bytesRead`` are the current phase's share of the round's input: its input totals
prorated by the phase's completed tasks (exact at the end of each phase).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import SparkSession

from compactor.spark import job_group

PHASE_ONE, PHASE_TWO, COMMIT = "phase-one", "phase-two", "commit"

# The share of the round's percent each phase ends at.
BANDS = {PHASE_ONE: (0.0, 45.0), PHASE_TWO: (45.0, 95.0), COMMIT: (95.0, 100.0)}
BOTH_PHASES_BAND = (0.0, 95.0)

# How often the tracker asks Spark how far the job is. Each poll is a few calls to the JVM.
POLL_INTERVAL_S = 0.2


@dataclass(frozen=True)
class ProgressSnapshot:
    """A round's progress at one moment (the REST ``progress`` object, in snake case)."""

    phase: str
    entries_read: int
    entries_total: int
    bytes_read: int
    bytes_total: int
    percent: float
    started_at: int  # epoch ms
    elapsed_ms: int


def combined(snapshots: Sequence[ProgressSnapshot]) -> ProgressSnapshot:
    """The progress of several rounds running together (a partitioned topic's partitions):
    their entries and bytes summed, their percent weighted by each round's bytes (equal
    when none has bytes yet), the least advanced phase, from the first start."""
    if not snapshots:
        raise ValueError("no rounds to combine")
    order = list(BANDS)
    weights = [s.bytes_total for s in snapshots]
    if not any(weights):
        weights = [1] * len(snapshots)
    percent = sum(w * s.percent for w, s in zip(weights, snapshots, strict=True)) / sum(weights)
    return ProgressSnapshot(
        phase=min((s.phase for s in snapshots), key=order.index),
        entries_read=sum(s.entries_read for s in snapshots),
        entries_total=sum(s.entries_total for s in snapshots),
        bytes_read=sum(s.bytes_read for s in snapshots),
        bytes_total=sum(s.bytes_total for s in snapshots),
        percent=round(percent, 1),
        started_at=min(s.started_at for s in snapshots),
        elapsed_ms=max(s.elapsed_ms for s in snapshots),
    )


class RoundProgress:
    """One round's progress: written by the compactor (and its tracker thread), read by anyone.

    Percent never goes back: a job group whose later stages appear only as they start (Spark
    SQL) could otherwise make the fraction of completed tasks drop."""

    def __init__(self, started_at_ms: int | None = None) -> None:
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self.started_at = started_at_ms if started_at_ms is not None else int(time.time() * 1000)
        self._phase = PHASE_ONE
        self._band = BANDS[PHASE_ONE]
        self._fraction = 0.0
        self._percent = 0.0
        self._entries_total = 0
        self._bytes_total = 0

    def set_totals(self, *, entries: int | None = None, bytes_: int | None = None) -> None:
        with self._lock:
            if entries is not None:
                self._entries_total = entries
            if bytes_ is not None:
                self._bytes_total = bytes_

    def enter(self, phase: str, band: tuple[float, float] | None = None) -> None:
        """Start ``phase`` (its share of the percent: ``band``, else the phase's own)."""
        with self._lock:
            self._phase = phase
            self._band = band or BANDS[phase]
            self._fraction = 0.0
            self._percent = max(self._percent, self._band[0])

    def advance(self, fraction: float) -> None:
        """The current phase is ``fraction`` (0..1) done."""
        with self._lock:
            self._fraction = max(self._fraction, min(1.0, max(0.0, fraction)))
            lo, hi = self._band
            self._percent = max(self._percent, lo + (hi - lo) * self._fraction)

    def snapshot(self) -> ProgressSnapshot:
        with self._lock:
            return ProgressSnapshot(
                phase=self._phase,
                entries_read=int(self._entries_total * self._fraction),
                entries_total=self._entries_total,
                bytes_read=int(self._bytes_total * self._fraction),
                bytes_total=self._bytes_total,
                percent=round(self._percent, 1),
                started_at=self.started_at,
                elapsed_ms=int((time.monotonic() - self._t0) * 1000),
            )


class SparkJobTracker:
    """Feeds ``progress`` (or each of several rounds' progress: rounds that share their Spark
    jobs share their fraction) the fraction of completed tasks of the Spark jobs in ``group``."""

    def __init__(
        self, spark: SparkSession, group: str, progress: RoundProgress | Sequence[RoundProgress]
    ) -> None:
        self.spark = spark
        self.group = group
        self.progresses = [progress] if isinstance(progress, RoundProgress) else list(progress)
        self._stop = threading.Event()

    def fraction(self) -> float | None:
        """Completed tasks / tasks of the group's stages so far; None before any job started."""
        tracker = self.spark.sparkContext.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done / total if total else None

    def _poll(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            try:
                f = self.fraction()
            except Exception:  # noqa: BLE001 - progress is best effort; the round goes on
                return
            if f is not None:
                for p in self.progresses:
                    p.advance(f)

    @contextmanager
    def tracking(self) -> Iterator[None]:
        """Run the body's Spark jobs in the group, polling their progress meanwhile."""
        with job_group(self.spark, self.group):  # thread-local: only this round's jobs
            poller = threading.Thread(target=self._poll, name=f"progress-{self.group}", daemon=True)
            poller.start()
            try:
                yield
            finally:
                self._stop.set()
                poller.join()
        for p in self.progresses:
            p.advance(1.0)
