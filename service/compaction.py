"""Running a topic's compaction and committing its result.

A round (DESIGN.md, "The compaction"): roll the open ledger over, so the last entry before it
is the new horizon H; compact the previous compacted ledger plus the original entries in
(previous horizon, H] on Spark; then commit in ONE metadata transaction — the new compacted
ledger registered, the ``__compaction`` cursor's mark-delete set to H and its property
``CompactedTopicLedger`` to the new ledger id, the run recorded. Only after the commit is the
previous compacted ledger deleted (once no read of it is in flight). Before the commit any
failure deletes the new ledger's files and leaves the topic as it was.

Integrity (README, "Integrity and repair"): before the Spark work, a round verifies the
whole-file CRC32C of every original ledger it reads, the previous compacted ledger's manifest,
and the key indexes and deletion vectors of its layers (no page checksums guard those); its
tasks verify every page they decode. A damaged original ledger stops the round
(ERROR, a one-line ``lastError`` naming it) until an operator accepts the loss; the round then
reads the verified copy of its intact rows. A damaged compacted ledger -- any file of any
layer its manifest names, wherever that file is -- is dropped and a ``repair`` round rebuilds it
from the original ledgers, at once (a full round: it writes a new base).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from sqlalchemy import select

from compactor import CompactionJob, CompactionResult, TwoPhaseCompactor
from compactor.progress import COMMIT, ProgressSnapshot, RoundProgress
from ledger import paths, prefetch
from ledger.checksums import IntegrityError, crc32c_bytes, read_verified, verify_file
from ledger.compacted_store import MANIFEST_NAME, Manifest
from ledger.entry import Position
from ledger.local_copies import LocalCopies
from ledger.storage import StoragePath
from service import models
from service.clock import now_ms
from service.compacted_view import CompactedView
from service.cursor_store import COMPACTION_CURSOR
from service.errors import CompactionUnavailable, Conflict, NotOwner
from service.integrity import (
    COMPACTED,
    Finding,
    compacted_damage_line,
    find_damage,
    finding_of,
    names_file,
    skip_damaged_path,
)
from service.managed_topic import DroppedView, ManagedTopic
from service.metrics import ServiceMetrics
from service.names import TopicName
from service.policies import PolicyStore
from service.topics import Broker

log = logging.getLogger(__name__)

# A compacted ledger's directory (with its temporary suffix while a round writes it locally).
_COMPACTED_DIR = re.compile(r"compacted-(\d+)(?:\.tmp)?")

COMPACTED_LEDGER_PROPERTY = "CompactedTopicLedger"

NOT_RUN, RUNNING, SUCCESS, ERROR = "NOT_RUN", "RUNNING", "SUCCESS", "ERROR"
# The trigger of a round that rebuilds a dropped (damaged) compacted ledger.
REPAIR = "repair"


class RoundDamaged(Exception):
    """A round met a damaged file; ``str()`` is the one line its ``lastError`` shows."""


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


@dataclass(frozen=True)
class ManyTriggered:
    """What ``CompactionService.trigger_many`` did not start: topics whose round runs already,
    and topics another instance owns, with the owner's URL."""

    busy: list[TopicName]
    elsewhere: dict[TopicName, str]


@dataclass(frozen=True)
class _Pending:
    """A round prepared for its Spark work (see ``CompactionService._prepare``)."""

    topic: ManagedTopic
    run_id: int
    started: float  # time.monotonic()
    previous: CompactedView | None
    job: CompactionJob
    progress: RoundProgress
    rolled: float  # time.monotonic() when the open ledger was rolled over and sealed
    prepared: float  # ... and when the inputs were verified and the job made
    # The local copies the round reads, sealed ledgers and older layers' files (leased until
    # it is over).
    copies: list[StoragePath] = field(default_factory=list)

    def timings(self, spark_done: float, committed: float) -> str:
        """Where the round's time went, for its log line."""
        ms = [int((b - a) * 1000) for a, b in ((self.started, self.rolled), (self.rolled, self.prepared))]
        spark, commit = int((spark_done - self.prepared) * 1000), int((committed - spark_done) * 1000)
        return f"roll-over and seal {ms[0]} ms, inputs {ms[1]} ms, Spark work {spark} ms, commit {commit} ms"


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
        """For each topic as it is loaded: mark its interrupted runs as failed, load its
        compacted view from its cursor, and remove compacted ledgers that no cursor references;
        a damaged compacted ledger is dropped and rebuilt from the originals."""
        self.broker.on_compacted_damage = self.compacted_damaged
        self.broker.sweep_orphans = self.sweep_orphans
        self.broker.on_load(self._load_topic)

    def _load_topic(self, topic: ManagedTopic) -> None:
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
        try:
            referenced = self._load_view(topic)
        except IntegrityError as e:
            self._drop_damaged_view(topic, e, ledger_id=self._referenced_id(topic))
            self._remove_unreferenced(topic, None)
            # The broker serves the topic only once every load listener has run: rebuild then.
            self._pool.submit(self._repair_once_served, topic)
            return
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
            row = s.get(models.Ledger, ledger_id)
            checksum = row.checksum if row is not None else None
        topic.view = CompactedView(
            horizon=horizon,
            ledger_id=ledger_id,
            directory=paths.compacted_dir(topic.ledger.store, ledger_id),
            checksum=checksum,
            files=topic.layer_files,
        )
        return ledger_id

    def _referenced_id(self, topic: ManagedTopic) -> int | None:
        with self.db.session() as s:
            cursor = s.scalar(
                select(models.Cursor).where(
                    models.Cursor.topic_id == topic.topic_id, models.Cursor.name == COMPACTION_CURSOR
                )
            )
            prop = s.get(models.CursorProperty, (cursor.id, COMPACTED_LEDGER_PROPERTY)) if cursor else None
            return prop.value if prop is not None else None

    # ---------------------------------------------------------------- repair

    def compacted_damaged(self, topic: ManagedTopic, view: CompactedView, error: IntegrityError) -> None:
        """A read met damage in ``view``'s compacted ledger: drop it and rebuild (the broker
        calls this; reads answer 503 until the rebuild commits)."""
        if topic.view is not view:
            return  # replaced meanwhile
        self._drop_damaged_view(topic, error, ledger_id=view.ledger_id, view=view)
        self._start_repair(topic)

    def _drop_damaged_view(
        self,
        topic: ManagedTopic,
        error: IntegrityError,
        *,
        ledger_id: int | None,
        view: CompactedView | None = None,
    ) -> str:
        """Forget a damaged compacted ledger: the cursor no longer names it (so a restart does
        not load it again), its row says what was found, reads of the compacted view answer
        503 until a repair round commits. Returns the finding's line."""
        detail = f"{error.check} failed: {error.detail}"
        line = compacted_damage_line(topic.name, error, ledger_id)
        log.error("%s; dropping it and rebuilding from the original ledgers", line)
        horizon = view.horizon if view is not None else Position(2**62, 0)
        with self.db.session() as s:
            cursor = s.scalar(
                select(models.Cursor).where(
                    models.Cursor.topic_id == topic.topic_id, models.Cursor.name == COMPACTION_CURSOR
                )
            )
            if cursor is not None:
                if view is None and cursor.mark_delete_ledger >= 0:
                    horizon = Position(cursor.mark_delete_ledger, cursor.mark_delete_entry)
                prop = s.get(models.CursorProperty, (cursor.id, COMPACTED_LEDGER_PROPERTY))
                if prop is not None:
                    s.delete(prop)
                cursor.mark_delete_ledger = cursor.mark_delete_entry = -1
            if ledger_id is not None:
                row = s.get(models.Ledger, ledger_id)
                if row is not None:
                    row.state = models.DELETED
                    row.damage, row.damaged_at = detail, now_ms()
        topic.repair = DroppedView(ledger_id=ledger_id or -1, horizon=horizon, finding=detail)
        if topic.view is view and view is not None:
            topic.view = None
            view.retire()
        if self.metrics is not None:
            self.metrics.integrity.damage_found(COMPACTED, error.check)
        return line

    def _start_repair(self, topic: ManagedTopic) -> None:
        """Start a repair round now, or after the round that runs (it checks ``topic.repair``)."""
        try:
            self.trigger(topic.name, trigger=REPAIR)
        except Conflict:
            pass  # _run_and_release starts it when the running round ends
        except RuntimeError:  # the pool is shut down: the service stops
            log.info("not rebuilding the compacted ledger of %s: the service is stopping", topic.name)

    def _repair_once_served(self, topic: ManagedTopic, wait_s: float = 60.0) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            # Not ``broker.topic()``: with several instances, that would claim a topic not served.
            if any(t is topic for t in self.broker.topics()):
                self._start_repair(topic)
                return
            time.sleep(0.05)
        log.warning("not rebuilding the compacted ledger of %s: the topic was not served", topic.name)

    def sweep_orphans(self, topic: ManagedTopic) -> int:
        """Remove the compacted ledger directories no one uses any more (a scrub's last step):
        what a failed round wrote and could not remove because the object store had stopped
        answering. A directory goes only when its ledger's row is DELETED (or gone) and no live
        view (one still leased by a reader included) names a file in it: a round that runs has
        its row BUILDING from before its first write, so its files are never taken. Returns
        how many directories went."""
        # The files views use first, the rows then: a round that commits in between has its
        # row live, and names the older layers that the view it replaces still holds.
        used = {f.parent.name for f in topic.layer_files.referenced()}
        with self.db.session() as s:
            live = set(
                s.scalars(
                    select(models.Ledger.id).where(
                        models.Ledger.topic_id == topic.topic_id,
                        models.Ledger.kind == models.COMPACTED,
                        models.Ledger.state != models.DELETED,
                    )
                )
            )
        removed = 0
        for d in topic.ledger.store.dirs():
            m = _COMPACTED_DIR.fullmatch(d.name)
            if m is None or int(m.group(1)) in live or d.name in used:
                continue
            log.info("removing compacted ledger %s, which no view uses", d)
            d.delete_tree()
            removed += 1
        return removed

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
        for d in topic.ledger.store.dirs():
            if not d.name.startswith("compacted-"):
                continue
            if not any(f.parent == d for f in keep):
                log.info("removing unreferenced compacted ledger %s", d)
                d.delete_tree()
                continue
            for sub in d.dirs():
                log.info("removing unreferenced compacted files %s", sub)
                sub.delete_tree()
            for f in d.files():
                if f not in keep:
                    log.info("removing unreferenced compacted file %s", f)
                    f.unlink()

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
            future = self._pool.submit(self._run_and_release, topic, run_id, trigger)
        except BaseException:
            topic.admin_lock.release()
            raise
        with self._lock:
            self._futures[name] = future
        return run_id

    def trigger_many(self, names: list[TopicName], *, trigger: str = "manual") -> ManyTriggered:
        """Start rounds of ``names`` (a partitioned topic's partitions) in the background, their
        Spark work in one job; each round commits or fails on its own. Says which topics were
        skipped: those a round of runs already, and those another instance owns (theirs to
        compact; the others are started)."""
        topics: list[ManagedTopic] = []
        elsewhere: dict[TopicName, str] = {}
        for n in names:
            try:
                topics.append(self.broker.topic(n))
            except NotOwner as e:
                elsewhere[n] = e.url
        runs: list[tuple[ManagedTopic, int]] = []
        busy: list[TopicName] = []
        try:
            for topic in topics:
                if not topic.admin_lock.acquire(blocking=False):
                    busy.append(topic.name)
                    continue
                try:
                    runs.append((topic, self._new_run(topic, trigger)))
                except BaseException:
                    topic.admin_lock.release()
                    raise
            future = self._pool.submit(self._run_many_and_release, runs, trigger) if runs else None
        except BaseException:
            for topic, _ in runs:
                topic.admin_lock.release()
            raise
        if future is not None:
            with self._lock:
                for topic, _ in runs:
                    self._futures[topic.name] = future
        return ManyTriggered(busy=busy, elsewhere=elsewhere)

    def compact_now(self, name: TopicName, *, trigger: str = "manual") -> CompactionStatus:
        """Run a round in the calling thread and wait for it (tests, CLI). 409 while one runs."""
        topic = self.broker.topic(name)
        if not topic.admin_lock.acquire(blocking=False):
            raise Conflict(f"a compaction of {name} is already running")
        run_id = self._new_run(topic, trigger)
        self._run_and_release(topic, run_id, trigger)
        return self.status(name)

    def running(self) -> int:
        """Rounds queued or running now."""
        with self._lock:
            # Distinct: the rounds that share a job share a future.
            return len({id(f) for f in self._futures.values() if not f.done()})

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

    def _run_and_release(self, topic: ManagedTopic, run_id: int, trigger: str = "") -> None:
        try:
            self._run(topic, run_id)
        finally:
            if trigger == REPAIR:
                # Rebuilt or not, the dropped ledger is gone: compacted reads go to the log
                # (every message, none damaged) until a round succeeds.
                topic.repair = None
            topic.admin_lock.release()
        self._retire(topic)
        if topic.repair is not None and topic.view is None and trigger != REPAIR:
            self._start_repair(topic)  # damage found while this round ran

    def _run_many_and_release(self, runs: list[tuple[ManagedTopic, int]], trigger: str) -> None:
        try:
            self._run_many(runs)
        finally:
            for topic, _ in runs:
                if trigger == REPAIR:
                    topic.repair = None
                topic.admin_lock.release()
        for topic, _ in runs:
            self._retire(topic)
            if topic.repair is not None and topic.view is None and trigger != REPAIR:
                self._start_repair(topic)  # damage found while the rounds ran

    @staticmethod
    def _retire(topic: ManagedTopic) -> None:
        """Retire the views the topic's rounds replaced (after the round let the topic go: a
        client that saw SUCCESS may start the next round at once)."""
        while topic.retiring:
            topic.retiring.pop(0).retire()

    # ---------------------------------------------------------------- a round

    def _run(self, topic: ManagedTopic, run_id: int) -> None:
        pending = self._prepare(topic, run_id)
        if pending is None:
            return
        try:
            # Spark may be unavailable (no Java, a storage root its executors cannot read):
            # the round then fails with the reason, as any other failure.
            compactor = self._compactor()
            compactor.fault_hook = self.fault_hook
            outcome: CompactionResult | Exception = compactor.compact(pending.job, pending.progress)
        except Exception as e:  # noqa: BLE001 - _complete records it
            outcome = e
        self._complete(pending, outcome)

    def _run_many(self, runs: list[tuple[ManagedTopic, int]]) -> None:
        """The rounds of several topics (a partitioned topic's partitions) with their Spark
        work in one job (``TwoPhaseCompactor.compact_many``); each commits or fails alone."""
        # Each round first rolls its topic's open ledger over and waits for it to be sealed:
        # side by side, so that hundreds of partitions do not seal one after another.
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(runs))), thread_name_prefix="prepare") as pool:
            prepared = list(pool.map(lambda run: self._prepare(*run), runs))
        pending = [p for p in prepared if p is not None]
        if not pending:
            return
        try:
            compactor = self._compactor()
            compactor.fault_hook = self.fault_hook
            outcomes = compactor.compact_many([p.job for p in pending], [p.progress for p in pending])
        except Exception as e:  # noqa: BLE001 - every round of the job fails with it
            outcomes = [e] * len(pending)
        for p, outcome in zip(pending, outcomes, strict=True):
            self._complete(p, outcome)

    def _prepare(self, topic: ManagedTopic, run_id: int) -> _Pending | None:
        """A round up to its Spark work: the horizon, the verified inputs, the new ledger's id,
        the job. None when the round is already over (nothing new: a quick success; or failed)."""
        new_ledger_id: int | None = None
        copies: list[StoragePath] = []
        started = time.monotonic()
        previous = topic.view
        try:
            policy = self.policies.effective(topic.name)
            now = now_ms()
            horizon = self._horizon(topic, topic.ledger.roll_over(), policy.minCompactionLagMs or 0, now)
            rolled = time.monotonic()
            if horizon is None or (previous is not None and horizon <= previous.horizon):
                # Nothing new since the last horizon (or nothing old enough): a quick success.
                self._finish(run_id, SUCCESS, horizon=previous.horizon if previous else None)
                self._observe(topic, started)
                return None
            previous_horizon = previous.horizon if previous else None
            layer_copies: dict[str, StoragePath] = {}
            checksums: dict[int, str] = {}
            sealed = self._verified_inputs(
                topic, previous, previous_horizon, horizon, layer_copies, copies, checksums
            )
            sealed = self._local_copies(sealed, copies)
            new_ledger_id = self._allocate_ledger(topic)
            job = CompactionJob(
                topic_root=topic.ledger.store,
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
                local_copies=layer_copies,
                previous_manifest=previous.ledger.manifest if previous else None,
                input_checksums=checksums,
            )
        except Exception as e:  # noqa: BLE001 - recorded as the round's error
            self._release_copies(copies)
            self._failed(topic, run_id, e, started, previous=previous, new_ledger_id=new_ledger_id)
            return None
        latest = self._progress.get(topic.name)
        progress = latest[1] if latest is not None and latest[0] == run_id else RoundProgress()
        return _Pending(topic, run_id, started, previous, job, progress, rolled, time.monotonic(), copies)

    def _complete(self, p: _Pending, outcome: CompactionResult | Exception) -> None:
        """Commit a round's result (or record how it failed), then swap the topic's view."""
        try:
            self._commit_or_fail(p, outcome)
        finally:
            self._release_copies(p.copies)

    def _local_copies(
        self, sealed: list[tuple[int, StoragePath]], leased: list[StoragePath]
    ) -> list[tuple[int, StoragePath]]:
        """The round's inputs, each sealed ledger this instance keeps a local copy of read from
        that copy (``ledger.local_copies``); the copies leased for the round go into ``leased``."""
        copies = self.broker.resources.copies
        if copies is None:
            return sealed
        out: list[tuple[int, StoragePath]] = []
        for ledger_id, path in sealed:
            copy = copies.lease(path)
            if copy is not None:
                leased.append(copy)
                path = copy
            out.append((ledger_id, path))
        return out

    def _release_copies(self, leased: list[StoragePath]) -> None:
        copies = self.broker.resources.copies
        if copies is not None:
            for copy in leased:
                copies.release(copy)
        leased.clear()

    def _commit_or_fail(self, p: _Pending, outcome: CompactionResult | Exception) -> None:
        topic, previous = p.topic, p.previous
        view: CompactedView | None = None
        spark_done = time.monotonic()
        try:
            if isinstance(outcome, Exception):
                raise outcome
            result = outcome
            p.progress.enter(COMMIT)
            if self.fault_hook is not None:
                self.fault_hook("before_commit")
            # The manifest's CRC32C (the manifest carries its files'): recorded by the commit.
            checksum = crc32c_bytes((result.directory / MANIFEST_NAME).read_bytes())
            # Made before the commit (it reads the manifest), so it holds the files it shares
            # with the previous view before that view lets them go.
            view = CompactedView(
                horizon=p.job.horizon,
                ledger_id=p.job.output_ledger_id,
                directory=result.directory,
                checksum=checksum,
                files=topic.layer_files,
            )
            self._commit(topic, p.run_id, result, previous, checksum)
        except Exception as e:  # noqa: BLE001 - recorded as the round's error
            ledger_id = p.job.output_ledger_id
            self._failed(topic, p.run_id, e, p.started, previous=previous, new_ledger_id=ledger_id, view=view)
            return
        topic.view = view
        topic.repair = None
        log.info(
            "compacted %s into ledger %d: %d messages read, %d kept, in %d ms (%s)",
            topic.name,
            result.ledger_id,
            result.entries_read,
            result.records_kept,
            int((time.monotonic() - p.started) * 1000),
            p.timings(spark_done, time.monotonic()),
        )
        if self.fault_hook is not None:
            self.fault_hook("after_commit")  # tests see the files between commit and clean-up
        self._observe(topic, p.started, result)
        if previous is not None:
            topic.retiring.append(previous)  # retired once the topic is let go

    def _failed(
        self,
        topic: ManagedTopic,
        run_id: int,
        e: Exception,
        started: float,
        *,
        previous: CompactedView | None,
        new_ledger_id: int | None,
        view: CompactedView | None = None,
    ) -> None:
        """Record a failed round: its one-line error (damage handled as damage), its files gone."""
        if isinstance(e, CompactionUnavailable | RoundDamaged):
            error = str(e)  # one line, logged once where it was found
        elif (finding := self._damage_in(e)) is not None:
            error = self._damaged_round(topic, finding, previous)
        else:
            log.error("compaction of %s failed", topic.name, exc_info=e)
            error = f"{type(e).__name__}: {e}".strip() or traceback.format_exc()
        if view is not None:
            view.retire()  # its own files go; the ones it shares stay with the current view
        if new_ledger_id is not None:
            self._discard(topic, new_ledger_id)
        self._finish(run_id, ERROR, error=error)
        self._observe(topic, started, failed=True)

    def _verified_inputs(
        self,
        topic: ManagedTopic,
        previous: CompactedView | None,
        previous_horizon: Position | None,
        horizon: Position,
        layer_copies: dict[str, StoragePath],
        leased: list[StoragePath],
        checksums: dict[int, str],
    ) -> list[tuple[int, StoragePath]]:
        """The round's original ledgers as (ledger id, file to read), each file's whole-file
        CRC32C verified against the metadata's unless it was verified since the service started
        (sealing reads every file back; a scrub or an earlier round's check). The previous
        compacted ledger's manifest is its view's, verified against its checksum when the view
        was made (the round reads it from memory: a later damage to the file is the scrub's
        to find, and the new ledger does not depend on it). Page checksums guard every page the
        round decodes either way; the whole-file check also covers footers and page headers.
        A damaged ledger whose loss no one accepted stops the round (``RoundDamaged``); one
        whose loss was accepted is read from the verified copy of its intact rows. The previous
        ledger's files verified from local copies go into ``layer_copies`` (the copies leased
        into ``leased``); each file's expected CRC32C, where known, into ``checksums`` by
        ledger id (the round's tasks check a file whole against it rather than page by page
        where they decode most of it)."""
        if previous is not None:
            try:
                # Read and verified against its checksum when the view was made.
                manifest = previous.ledger.manifest
                layer_copies.update(self._verify_layer_files(previous, manifest, leased))
            except IntegrityError as e:
                self._drop_damaged_view(topic, e, ledger_id=previous.ledger_id, view=previous)
                raise RoundDamaged(self._repair_line(topic, e, previous.ledger_id)) from e
        out: list[tuple[int, StoragePath]] = []
        for info in topic.ledger.sealed_inputs(previous_horizon, horizon):
            path = paths.sealed_path(topic.ledger.store, info.ledger_id, info.sealed_epoch)
            expected = info.checksum
            if info.damage is not None and not info.damage_accepted:
                raise RoundDamaged(
                    f"ledger {info.ledger_id} of {topic.name} is damaged: {info.damage}; compaction stops "
                    f"until the loss is accepted ({skip_damaged_path(topic.name, info.ledger_id)})"
                )
            if info.damage_accepted:
                path = paths.salvage_path(topic.ledger.store, info.ledger_id)
                expected = self._salvage_checksum(info.ledger_id)
            if expected is not None and not info.verified:
                try:
                    verify_file(path, expected)
                except IntegrityError as e:
                    damaged = topic.ledger.damaged(info.ledger_id, e)
                    if self.metrics is not None:
                        self.metrics.integrity.damage_found("original", e.check)
                    raise RoundDamaged(
                        f"{damaged.reason}; compaction stops until the loss is accepted "
                        f"({skip_damaged_path(topic.name, info.ledger_id)})"
                    ) from e
                topic.ledger.mark_verified(info.ledger_id)
            if expected is not None:
                checksums[info.ledger_id] = expected
            out.append((info.ledger_id, path))
        return out

    def _verify_layer_files(
        self, previous: CompactedView, manifest: Manifest, leased: list[StoragePath]
    ) -> dict[str, StoragePath]:
        """The previous compacted ledger's key indexes and deletion vectors against the CRC32C
        its manifest records, every round: they have no page checksums, and a damaged key index
        or vector would mark the wrong rows dead, silently. (The pass costs a fraction of the
        probe that reads every key index anyway: CRC32C runs at memory speed.) Its parts need
        no pass here: page checksums guard every page the round decodes (a delta round decodes
        none).

        On object storage, with local copies, each file is verified as the copy the round
        will read (leased into ``leased``): a copy is made of the object's bytes the first
        time, once they passed; a copy that fails is dropped and the object verified instead.
        Returns the copies by object name."""
        root = previous.directory.parent
        checked = manifest.checked_files()
        files = [(f.path(root), f.checksum) for f in checked if f.size is None and f.checksum]  # not parts
        copies = self.broker.resources.copies if root.local is None else None
        if copies is None:
            # On object storage a request each: all at once (the first damage in manifest order is raised).
            prefetch.each(lambda file: verify_file(*file), files, at_once=root.local is None)
            return {}
        found = prefetch.each(lambda file: _verified_copy(copies, *file), files, at_once=True)
        out: dict[str, StoragePath] = {}
        for (path, _), copy in zip(files, found, strict=True):
            if copy is not None:
                leased.append(copy)
                out[str(path)] = copy
        return out

    def _salvage_checksum(self, ledger_id: int) -> str | None:
        with self.db.session() as s:
            row = s.get(models.Ledger, ledger_id)
            return row.salvage_checksum if row is not None else None

    @staticmethod
    def _damage_in(e: BaseException) -> Finding | None:
        """The damaged file a failed round's error names (its Spark tasks raise
        ``IntegrityError``, which reaches here as text inside Spark's exception)."""
        seen: set[int] = set()
        exc: BaseException | None = e
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            if isinstance(exc, IntegrityError):
                return finding_of(exc)
            found = find_damage(str(exc))
            if found is not None:
                return found
            exc = exc.__cause__ or exc.__context__
        return None

    def _damaged_round(self, topic: ManagedTopic, finding: Finding, previous: CompactedView | None) -> str:
        """What a round whose Spark work met damage records: the ledger marked damaged, or the
        compacted ledger dropped for a rebuild; returns the round's one-line ``lastError``. A
        damaged local copy is only dropped: the next round reads the ledger's object."""
        copies = self.broker.resources.copies
        if copies is not None and copies.holds(finding.path):
            copies.drop(finding.path)
            return (
                f"{finding.line(topic.name)} (a local copy of the ledger's object: dropped, the next "
                "round reads the object)"
            )
        if finding.kind == COMPACTED:
            # A file of the previous compacted ledger: in its own directory, or an older
            # layer's that its manifest names where an earlier round wrote it.
            if previous is not None and (
                finding.ledger_id == previous.ledger_id or names_file(previous.files, finding.path)
            ):
                self._drop_damaged_view(topic, finding.error(), ledger_id=previous.ledger_id, view=previous)
                return self._repair_line(topic, finding.error(), previous.ledger_id)
            return finding.line(topic.name)  # the ledger this round was writing: discarded anyway
        damaged = topic.ledger.damaged(finding.ledger_id, finding.error())
        if self.metrics is not None:
            self.metrics.integrity.damage_found("original", finding.check)
        return (
            f"{damaged.reason}; compaction stops until the loss is accepted "
            f"({skip_damaged_path(topic.name, finding.ledger_id)})"
        )

    @staticmethod
    def _repair_line(topic: ManagedTopic, e: IntegrityError, ledger_id: int | None = None) -> str:
        line = compacted_damage_line(topic.name, e, ledger_id)
        return f"{line}; it was dropped and a repair round rebuilds it from the original ledgers"

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
        self,
        topic: ManagedTopic,
        run_id: int,
        result: CompactionResult,
        previous: CompactedView | None,
        checksum: str,
    ) -> None:
        """The one transaction that makes a round visible (only while this instance owns the topic)."""
        with self.db.session() as s:
            if topic.ledger.fence is not None:
                topic.ledger.fence(s)
            ledger = s.get(models.Ledger, result.ledger_id)
            assert ledger is not None
            ledger.state = models.CLOSED
            ledger.checksum = checksum
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
        directory = paths.compacted_dir(topic.ledger.store, ledger_id)
        try:
            directory.delete_tree()
            directory.with_name(directory.name + paths.TMP_SUFFIX).delete_tree()
        except OSError:  # object storage that stopped answering: the next scrub sweeps them
            log.warning("could not remove the files of compacted ledger %s", ledger_id, exc_info=True)
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


def _verified_copy(copies: LocalCopies, path: StoragePath, checksum: str) -> StoragePath | None:
    """``path`` (an object) verified against ``checksum`` as its local copy, leased (made from
    the object's bytes if there is none); None when no copy could be kept, the object verified
    all the same. ``IntegrityError`` when the object fails."""
    copy = copies.lease(path)
    if copy is not None:
        try:
            verify_file(copy, checksum)
            return copy
        except IntegrityError as e:  # the copy, not the ledger: the object decides
            log.warning("dropping a damaged local copy: %s", e)
            copies.release(copy)
            copies.drop(copy)
    copies.keep_bytes(path, read_verified(path, checksum))
    return copies.lease(path)
