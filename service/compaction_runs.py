"""The bookkeeping of compaction rounds: each run's row (RUNNING, then SUCCESS or ERROR with
its one-line error; runs a stop interrupted marked failed as their topic loads), the progress
of each topic's latest round while it runs, a topic's run history and its Pulsar
``CompactionRecord``, and the metrics of every finished round.

A run's row is made RUNNING before its round starts, its progress kept before that row is
committed (whoever sees the run RUNNING finds its progress); a successful round's row is
finished by the round's commit itself (``service.compaction_cursor.commit_round``), any other by
:meth:`CompactionRuns.finish`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import select

from compactor import CompactionResult
from compactor.progress import ProgressSnapshot, RoundProgress
from ledger.entry import Position
from service import models
from service.clock import now_ms
from service.managed_topic import ManagedTopic
from service.metrics import ServiceMetrics
from service.names import TopicName
from service.topics import Broker

NOT_RUN, RUNNING, SUCCESS, ERROR = "NOT_RUN", "RUNNING", "SUCCESS", "ERROR"


@dataclass(frozen=True)
class CompactionStatus:
    status: str
    last_error: str | None = None
    run_id: int | None = None
    # While RUNNING: how far the round is (None once it is done, or for a run of a previous process).
    progress: ProgressSnapshot | None = None


@dataclass(frozen=True)
class CompactionRecord:
    """Pulsar's ``CompactionRecord`` of topic stats: the last round that succeeded (what it
    removed, when, how long it took) and when one last failed; 0 where there is none."""

    last_removed_event_count: int = 0
    last_succeed_timestamp: int = 0
    last_failed_timestamp: int = 0
    last_duration_ms: int = 0


class CompactionRuns:
    """The runs of a service's rounds: their rows (started, finished, failed, interrupted),
    the progress of each topic's latest round, their history and record, and their metrics.
    Its own state, ``_progress``, takes no lock: each change of it is one assignment or ``pop``."""

    def __init__(self, *, broker: Broker, metrics: ServiceMetrics | None = None) -> None:
        self.broker = broker
        self.metrics = metrics
        self.db = broker.db
        # The progress of each topic's latest round (its run id with it), kept after the round
        # ends: a status read that saw the run RUNNING in the database still finds it.
        self._progress: dict[TopicName, tuple[int, RoundProgress]] = {}

    def interrupt(self, topic: ManagedTopic) -> None:
        """Mark the topic's runs left RUNNING (by a previous process, or an owner that lost
        it) as failed, as the topic loads."""
        with self.db.session() as s:
            for run in s.scalars(
                select(models.CompactionRun).where(
                    models.CompactionRun.topic_id == topic.topic_id, models.CompactionRun.status == RUNNING
                )
            ):
                run.status = ERROR
                # With several instances, the run of an owner that lost the topic: it cannot commit.
                run.error = "interrupted: the service stopped (or the topic changed owners) during the run"
                run.finished_at = now_ms()

    def new(self, topic: ManagedTopic, trigger: str) -> int:
        with self.db.session() as s:
            run = models.CompactionRun(
                topic_id=topic.topic_id, trigger=trigger, status=RUNNING, started_at=now_ms()
            )
            s.add(run)
            s.flush()
            # Before the commit: whoever sees the run RUNNING finds its progress.
            self._progress[topic.name] = (run.id, RoundProgress(started_at_ms=run.started_at))
            run_id = run.id
        live = {t.name for t in self.broker.topics()}
        for gone in [n for n in list(self._progress) if n not in live]:  # deleted topics'
            self._progress.pop(gone, None)
        return run_id

    def progress(self, name: TopicName, run_id: int) -> RoundProgress:
        """The progress of run ``run_id`` of topic ``name`` (a new one if that run is not the
        topic's latest)."""
        latest = self._progress.get(name)
        return latest[1] if latest is not None and latest[0] == run_id else RoundProgress()

    def finish(
        self, run_id: int, status: str, *, horizon: Position | None = None, error: str | None = None
    ) -> None:
        with self.db.session() as s:
            run = s.get(models.CompactionRun, run_id)
            if run is None:  # the topic was deleted meanwhile
                return
            run.status = status
            run.error = error
            run.finished_at = now_ms()
            if horizon is not None:
                run.horizon_ledger, run.horizon_entry = horizon.ledger_id, horizon.entry_id

    def observe(
        self,
        topic: ManagedTopic,
        started: float,
        result: CompactionResult | None = None,
        *,
        failed: bool = False,
    ) -> None:
        """Add a finished round to the metrics (``result`` None: a round with nothing to do)."""
        if self.metrics is None:
            return
        duration_ms = int((time.monotonic() - started) * 1000)
        if failed:
            self.metrics.compaction.failed(topic.topic_id, duration_ms=duration_ms)
            return
        if result is None:
            self.metrics.compaction.succeeded(topic.topic_id, duration_ms=duration_ms)
            return
        self.metrics.compaction.succeeded(
            topic.topic_id,
            duration_ms=duration_ms,
            removed=result.records_removed,
            bytes_in=result.bytes_in,
            bytes_out=result.bytes_out,
        )
        self.metrics.spark_job_seconds.labels("phase-one").observe(result.phase_one_ms / 1000)
        self.metrics.spark_job_seconds.labels("phase-two").observe(result.phase_two_ms / 1000)

    def status(self, name: TopicName) -> CompactionStatus:
        topic = self.broker.topic(name)
        with self.db.session() as s:
            run = s.scalar(
                select(models.CompactionRun)
                .where(models.CompactionRun.topic_id == topic.topic_id)
                .order_by(models.CompactionRun.id.desc())
                .limit(1)
            )
            if run is None:
                return CompactionStatus(NOT_RUN)
            status, error, run_id = run.status, run.error, run.id
        latest = self._progress.get(name)
        progress = latest[1] if latest is not None and latest[0] == run_id and status == RUNNING else None
        return CompactionStatus(status, error, run_id, progress.snapshot() if progress is not None else None)

    def record(self, name: TopicName) -> CompactionRecord:
        """The topic's :class:`CompactionRecord`, from its run history."""
        topic = self.broker.topic(name)
        runs = models.CompactionRun
        with self.db.session() as s:

            def last(status: str) -> models.CompactionRun | None:
                return s.scalar(
                    select(runs)
                    .where(runs.topic_id == topic.topic_id, runs.status == status)
                    .order_by(runs.id.desc())
                    .limit(1)
                )

            ok, failed = last(SUCCESS), last(ERROR)
            return CompactionRecord(
                last_removed_event_count=ok.records_removed if ok else 0,
                last_succeed_timestamp=(ok.finished_at or 0) if ok else 0,
                last_failed_timestamp=(failed.finished_at or 0) if failed else 0,
                last_duration_ms=((ok.finished_at or ok.started_at) - ok.started_at) if ok else 0,
            )

    def history(self, name: TopicName, limit: int = 100) -> list[models.CompactionRun]:
        """The topic's runs, newest first."""
        topic = self.broker.topic(name)
        with self.db.session() as s:
            return list(
                s.scalars(
                    select(models.CompactionRun)
                    .where(models.CompactionRun.topic_id == topic.topic_id)
                    .order_by(models.CompactionRun.id.desc())
                    .limit(limit)
                )
            )
