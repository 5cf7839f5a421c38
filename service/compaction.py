"""Running a topic's compaction and committing its result.

A round (DESIGN.md, "The compaction"): roll the open ledger over, so the last entry before it
is the new horizon H; compact the previous compacted ledger plus the original entries in
(previous horizon, H] on Spark; then commit in ONE metadata transaction — the new compacted
ledger registered, the ``__compaction`` cursor's mark-delete set to H and its property
``CompactedTopicLedger`` to the new ledger id, the run recorded. Only after the commit is the
previous compacted ledger deleted (once no read of it is in flight). Before the commit any
failure deletes the new ledger's files and leaves the topic as it was.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from compactor import CompactionJob, CompactionResult, TwoPhaseCompactor
from compactor.progress import COMMIT, ProgressSnapshot, RoundProgress
from ledger import paths
from ledger.entry import Position
from service import models
from service.clock import now_ms
from service.compacted_view import CompactedView
from service.cursors import COMPACTION_CURSOR
from service.errors import CompactionUnavailable, Conflict
from service.metrics import ServiceMetrics
from service.names import TopicName
from service.policies import PolicyStore
from service.topics import Broker, ManagedTopic

log = logging.getLogger(__name__)

COMPACTED_LEDGER_PROPERTY = "CompactedTopicLedger"

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


class CompactionService:
    """Starts compaction rounds on a bounded worker pool, one round per topic at a time."""

    def __init__(
        self,
        *,
        broker: Broker,
        compactor: Callable[[], TwoPhaseCompactor],
        workers: int = 1,
        policies: PolicyStore | None = None,
        fault_hook: Callable[[str], None] | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.broker = broker
        self.metrics = metrics
        self.policies = policies or PolicyStore(db=broker.db, settings=broker.settings)
        self.workers = workers
        self.db = broker.db
        self._compactor = compactor
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="compaction")
        # Tests inject failures at named points: "phase_one", "phase_two", "manifest", "rename",
        # "before_commit" (raising there fails the round), and observe "after_commit".
        self.fault_hook = fault_hook
        self._futures: dict[TopicName, Future[None]] = {}
        self._lock = threading.Lock()
        # The progress of each topic's latest round (its run id with it), kept after the round
        # ends: a status read that saw the run RUNNING in the database still finds it.
        self._progress: dict[TopicName, tuple[int, RoundProgress]] = {}

    # ---------------------------------------------------------------- start-up

    def start(self) -> None:
        """Load each topic's compacted view from its cursor, mark interrupted runs as failed,
        and remove compacted ledgers that no cursor references."""
        with self.db.session() as s:
            for run in s.scalars(select(models.CompactionRun).where(models.CompactionRun.status == RUNNING)):
                run.status = ERROR
                run.error = "interrupted: the service stopped during the run"
                run.finished_at = now_ms()
        for topic in self.broker.topics():
            referenced = self._load_view(topic)
            self._remove_unreferenced(topic, referenced)

    def _load_view(self, topic: ManagedTopic) -> int | None:
        with self.db.session() as s:
            cursor = s.scalar(
                select(models.Cursor).where(
                    models.Cursor.topic_id == topic.topic_id, models.Cursor.name == COMPACTION_CURSOR
                )
            )
            if cursor is None:
                return None
            prop = s.get(models.CursorProperty, (cursor.id, COMPACTED_LEDGER_PROPERTY))
            if prop is None or cursor.mark_delete_ledger < 0:
                return None
            horizon = Position(cursor.mark_delete_ledger, cursor.mark_delete_entry)
        ledger_id = prop.value
        topic.view = CompactedView(
            horizon=horizon,
            ledger_id=ledger_id,
            directory=paths.compacted_dir(topic.ledger.root, ledger_id),
            files=topic.layer_files,
        )
        return ledger_id

    def _remove_unreferenced(self, topic: ManagedTopic, referenced: int | None) -> None:
        """Mark compacted ledgers other than ``referenced`` deleted, and remove every file under
        the topic's ``compacted-*`` directories that the current view does not name: ledgers a
        crash left half-built or uncommitted, and layers, deletion vectors and manifests of
        replaced ledgers whose removal a stop interrupted."""
        with self.db.session() as s:
            for row in s.scalars(
                select(models.Ledger).where(
                    models.Ledger.topic_id == topic.topic_id,
                    models.Ledger.kind == models.COMPACTED,
                    models.Ledger.state != models.DELETED,
                )
            ):
                if row.id != referenced:
                    row.state = models.DELETED
        keep = topic.view.files if topic.view is not None else set()
        for d in topic.ledger.root.glob("compacted-*"):
            if not d.is_dir() or not any(f.parent == d for f in keep):
                log.info("removing unreferenced compacted ledger %s", d)
                shutil.rmtree(d, ignore_errors=True)
                continue
            for f in d.iterdir():
                if f not in keep:
                    log.info("removing unreferenced compacted file %s", f)
                    if f.is_dir():
                        shutil.rmtree(f, ignore_errors=True)
                    else:
                        f.unlink(missing_ok=True)

    def stop(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ---------------------------------------------------------------- triggering

    def trigger(self, name: TopicName, *, trigger: str = "manual") -> int:
        """Start a round in the background; 409 while one runs. Returns the run id."""
        topic = self.broker.topic(name)
        if not topic.admin_lock.acquire(blocking=False):
            raise Conflict(f"a compaction of {name} is already running")
        try:
            run_id = self._new_run(topic, trigger)
            future = self._pool.submit(self._run_and_release, topic, run_id)
        except BaseException:
            topic.admin_lock.release()
            raise
        with self._lock:
            self._futures[name] = future
        return run_id

    def compact_now(self, name: TopicName, *, trigger: str = "manual") -> CompactionStatus:
        """Run a round in the calling thread and wait for it (tests, CLI). 409 while one runs."""
        topic = self.broker.topic(name)
        if not topic.admin_lock.acquire(blocking=False):
            raise Conflict(f"a compaction of {name} is already running")
        run_id = self._new_run(topic, trigger)
        self._run_and_release(topic, run_id)
        return self.status(name)

    def running(self) -> int:
        """Rounds queued or running now."""
        with self._lock:
            return sum(1 for f in self._futures.values() if not f.done())

    def wait(self, name: TopicName, timeout: float | None = None) -> None:
        with self._lock:
            future = self._futures.get(name)
        if future is not None:
            future.result(timeout)

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

    def _new_run(self, topic: ManagedTopic, trigger: str) -> int:
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

    def _run_and_release(self, topic: ManagedTopic, run_id: int) -> None:
        try:
            self._run(topic, run_id)
        finally:
            topic.admin_lock.release()

    # ---------------------------------------------------------------- a round

    def _run(self, topic: ManagedTopic, run_id: int) -> None:
        new_ledger_id: int | None = None
        view: CompactedView | None = None
        started = time.monotonic()
        try:
            policy = self.policies.effective(topic.name)
            now = now_ms()
            horizon = self._horizon(topic, topic.ledger.roll_over(), policy.minCompactionLagMs or 0, now)
            previous = topic.view
            if horizon is None or (previous is not None and horizon <= previous.horizon):
                # Nothing new since the last horizon (or nothing old enough): a quick success.
                self._finish(run_id, SUCCESS, horizon=previous.horizon if previous else None)
                self._observe(topic, started)
                return
            new_ledger_id = self._allocate_ledger(topic)
            previous_horizon = previous.horizon if previous else None
            sealed = topic.ledger.sealed_files(previous_horizon, horizon)
            job = CompactionJob(
                topic_root=topic.ledger.root,
                inputs=[p for _, p in sealed],
                input_ledger_ids=[i for i, _ in sealed],
                previous_compacted=previous.directory if previous else None,
                previous_horizon=previous_horizon,
                horizon=horizon,
                output_ledger_id=new_ledger_id,
                retain_null_key=bool(policy.retainNullKey),
                strategy=policy.compactionStrategy or "offset",
                delete_retention_ms=policy.deleteRetentionMs or 0,
                now_ms=now,
                max_deltas=self.broker.settings.compaction_max_deltas,
                consolidation_ratio=self.broker.settings.compaction_consolidation_ratio,
            )
            compactor = self._compactor()
            compactor.fault_hook = self.fault_hook
            latest = self._progress.get(topic.name)
            progress = latest[1] if latest is not None and latest[0] == run_id else RoundProgress()
            result = compactor.compact(job, progress)
            progress.enter(COMMIT)
            if self.fault_hook is not None:
                self.fault_hook("before_commit")
            # Made before the commit (it reads the manifest), so it holds the files it shares
            # with the previous view before that view lets them go.
            view = CompactedView(
                horizon=horizon, ledger_id=new_ledger_id, directory=result.directory, files=topic.layer_files
            )
            self._commit(topic, run_id, result, previous)
        except Exception as e:
            if isinstance(e, CompactionUnavailable):
                error = str(e)  # one line, logged once by the engine
            else:
                log.exception("compaction of %s failed", topic.name)
                error = f"{type(e).__name__}: {e}".strip() or traceback.format_exc()
            if view is not None:
                view.retire()  # its own files go; the ones it shares stay with the current view
            if new_ledger_id is not None:
                self._discard(topic, new_ledger_id)
            self._finish(run_id, ERROR, error=error)
            self._observe(topic, started, failed=True)
            return
        topic.view = view
        if self.fault_hook is not None:
            self.fault_hook("after_commit")  # tests see the files between commit and clean-up
        self._observe(topic, started, result)
        if previous is not None:
            previous.retire()

    def _observe(
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

    @staticmethod
    def _horizon(topic: ManagedTopic, last: Position | None, min_lag_ms: int, now: int) -> Position | None:
        """The last entry this round may compact: the end of the log, or with a minimum
        compaction lag the last entry published at least that long ago (None: no such entry)."""
        if last is None or min_lag_ms <= 0:
            return last
        first_young = topic.ledger.find_by_publish_time(now - min_lag_ms + 1)
        horizon = min(last, Position(first_young.ledger_id, first_young.entry_id - 1))
        first, _ = topic.ledger.read(Position(0, 0), 1)
        if not first or first[0].position > horizon:
            return None
        return horizon

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

    def _allocate_ledger(self, topic: ManagedTopic) -> int:
        with self.db.session() as s:
            row = models.Ledger(
                topic_id=topic.topic_id,
                kind=models.COMPACTED,
                state=models.BUILDING,
                entries=0,
                size_bytes=0,
                file_bytes=0,
                created_at=now_ms(),
            )
            s.add(row)
            s.flush()
            return row.id

    def _commit(
        self, topic: ManagedTopic, run_id: int, result: CompactionResult, previous: CompactedView | None
    ) -> None:
        """The one transaction that makes a round visible."""
        with self.db.session() as s:
            ledger = s.get(models.Ledger, result.ledger_id)
            assert ledger is not None
            ledger.state = models.CLOSED
            ledger.entries = result.records_kept
            ledger.file_bytes = result.bytes_out
            ledger.size_bytes = result.bytes_out
            ledger.closed_at = now_ms()
            if previous is not None:
                old = s.get(models.Ledger, previous.ledger_id)
                if old is not None:
                    old.state = models.DELETED
            cursor = s.scalar(
                select(models.Cursor).where(
                    models.Cursor.topic_id == topic.topic_id, models.Cursor.name == COMPACTION_CURSOR
                )
            )
            if cursor is None:
                cursor = models.Cursor(topic_id=topic.topic_id, name=COMPACTION_CURSOR, created_at=now_ms())
                s.add(cursor)
                s.flush()
            cursor.mark_delete_ledger = result.horizon.ledger_id
            cursor.mark_delete_entry = result.horizon.entry_id
            prop = s.get(models.CursorProperty, (cursor.id, COMPACTED_LEDGER_PROPERTY))
            if prop is None:
                s.add(
                    models.CursorProperty(
                        cursor_id=cursor.id, name=COMPACTED_LEDGER_PROPERTY, value=result.ledger_id
                    )
                )
            else:
                prop.value = result.ledger_id
            run = s.get(models.CompactionRun, run_id)
            assert run is not None
            run.status = SUCCESS
            run.finished_at = now_ms()
            run.horizon_ledger = result.horizon.ledger_id
            run.horizon_entry = result.horizon.entry_id
            run.compacted_ledger_id = result.ledger_id
            run.entries_read = result.entries_read
            run.records_kept = result.records_kept
            run.records_removed = result.records_removed
            run.bytes_in = result.bytes_in
            run.bytes_out = result.bytes_out
            run.phase_one_ms = result.phase_one_ms
            run.phase_two_ms = result.phase_two_ms

    def _discard(self, topic: ManagedTopic, ledger_id: int) -> None:
        directory = paths.compacted_dir(topic.ledger.root, ledger_id)
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(Path(str(directory) + paths.TMP_SUFFIX), ignore_errors=True)
        try:
            with self.db.session() as s:
                row = s.get(models.Ledger, ledger_id)
                if row is not None:
                    row.state = models.DELETED
        except Exception:  # the start-up sweep removes it if this fails too
            log.exception("could not mark compacted ledger %s deleted", ledger_id)

    def _finish(
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
