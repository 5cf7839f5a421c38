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

Where its jobs live: :class:`CompactionService` (here) starts, runs and commits rounds;
``service.compaction_runs`` keeps their runs, progress and metrics; ``service.compaction_inputs``
verifies what a round reads; ``service.compaction_damage`` handles the damage it meets;
``service.compaction_cursor`` reads and moves the cursor that names the compacted ledger;
``service.compacted_cleanup`` removes compacted ledgers no one uses.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from compactor import CompactionJob, CompactionResult, TwoPhaseCompactor
from compactor.progress import COMMIT, RoundProgress
from ledger.checksums import IntegrityError, crc32c_bytes
from ledger.compacted_store import MANIFEST_NAME
from ledger.storage import StoragePath
from ledger.value_columns import TYPED_SCHEMAS, ValueSchema
from service import compacted_cleanup, models
from service.clock import now_ms
from service.compacted_view import CompactedView
from service.compaction_cursor import allocate_ledger, commit_round, load_view, referenced_id
from service.compaction_damage import RoundDamage, RoundDamaged
from service.compaction_inputs import RoundInputs
from service.compaction_runs import (
    ERROR,
    RUNNING,
    SUCCESS,
    CompactionRecord,
    CompactionRuns,
    CompactionStatus,
)
from service.errors import CompactionUnavailable, Conflict, NotOwner
from service.managed_topic import ManagedTopic
from service.metrics import ServiceMetrics
from service.names import TopicName
from service.policies import Policy, PolicyStore
from service.schemas import SchemaRegistry
from service.tables import TopicTables
from service.topics import Broker

log = logging.getLogger(__name__)


# The trigger of a round that rebuilds a dropped (damaged) compacted ledger.
REPAIR = "repair"


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
        self._runs = CompactionRuns(broker=broker, metrics=metrics)
        self._damage = RoundDamage(broker=broker, metrics=metrics)
        self._inputs = RoundInputs(broker=broker, damage=self._damage, metrics=metrics)
        self.tables = TopicTables(broker=broker, policies=self.policies, metrics=metrics)
        self._schemas = SchemaRegistry(self.db, policies=self.policies)

    # ---------------------------------------------------------------- start-up

    def start(self) -> None:
        """For each topic as it is loaded: mark its interrupted runs as failed, load its
        compacted view from its cursor, and remove compacted ledgers that no cursor references;
        a damaged compacted ledger is dropped and rebuilt from the originals."""
        self.broker.on_compacted_damage = self.compacted_damaged
        self.broker.sweep_orphans = self.sweep_orphans
        self.broker.on_load(self._load_topic)
        self.broker.on_delete(self.tables.deleted)
        if self.broker.ownership is None:  # with several instances, another may be committing
            try:
                self.tables.remove_orphans()
            except Exception:  # noqa: BLE001 - they are removed at the next start
                log.exception("removing orphan table directories failed")

    def _load_topic(self, topic: ManagedTopic) -> None:
        self._runs.interrupt(topic)
        try:
            referenced = load_view(db=self.db, topic=topic)
        except IntegrityError as e:
            self._damage.drop_damaged_view(topic, e, ledger_id=referenced_id(db=self.db, topic=topic))
            compacted_cleanup.remove_unreferenced(
                db=self.db, topic=topic, referenced=None, pinned=self._table_pins(topic)
            )
            # The broker serves the topic only once every load listener has run: rebuild then.
            self._pool.submit(self._repair_once_served, topic)
            return
        compacted_cleanup.remove_unreferenced(
            db=self.db, topic=topic, referenced=referenced, pinned=self._table_pins(topic)
        )

    def _table_pins(self, topic: ManagedTopic) -> set[StoragePath]:
        """The files of the compacted ledgers the topic's table's kept snapshots name (pinned in
        its ``LayerFiles``, so the load's clean-up and the scrub's sweep keep them)."""
        try:
            return self.tables.load(topic)
        except Exception:  # noqa: BLE001 - the topic loads; its table's older snapshots may not read
            log.exception("pinning the table snapshots' ledgers of %s failed", topic.name)
            return set()

    # ---------------------------------------------------------------- repair

    def compacted_damaged(self, topic: ManagedTopic, view: CompactedView, error: IntegrityError) -> None:
        """A read met damage in ``view``'s compacted ledger: drop it and rebuild (the broker
        calls this; reads answer 503 until the rebuild commits)."""
        if topic.view is not view:
            return  # replaced meanwhile
        self._damage.drop_damaged_view(topic, error, ledger_id=view.ledger_id, view=view)
        self._start_repair(topic)

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
        """Remove the compacted ledger directories no one uses any more (a scrub's last step;
        ``service.compacted_cleanup.sweep_orphans``). Returns how many went."""
        return compacted_cleanup.sweep_orphans(db=self.db, topic=topic)

    def stop(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ---------------------------------------------------------------- triggering

    def trigger(self, name: TopicName, *, trigger: str = "manual") -> int:
        """Start a round in the background; 409 while one runs. Returns the run id."""
        topic = self.broker.topic(name)
        if not topic.admin_lock.acquire(blocking=False):
            raise Conflict(f"a compaction of {name} is already running")
        try:
            run_id = self._runs.new(topic, trigger)
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
                    runs.append((topic, self._runs.new(topic, trigger)))
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
        run_id = self._runs.new(topic, trigger)
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
        """The topic's latest run (``CompactionRuns.status``); RUNNING while the run, committed,
        commits the topic's Iceberg table (``service.tables``)."""
        st = self._runs.status(name)
        if st.status == SUCCESS and st.run_id is not None and self.tables.committing(name) == st.run_id:
            # RUNNING comes with its progress, as always: the round's, in its commit phase.
            progress = self._runs.progress(name, st.run_id).snapshot()
            return CompactionStatus(RUNNING, None, st.run_id, progress)
        return st

    def record(self, name: TopicName) -> CompactionRecord:
        """The topic's :class:`CompactionRecord`, from its run history."""
        return self._runs.record(name)

    def history(self, name: TopicName, limit: int = 100) -> list[models.CompactionRun]:
        """The topic's runs, newest first."""
        return self._runs.history(name, limit)

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
            horizon = self._inputs.horizon(
                topic, topic.ledger.roll_over(), policy.minCompactionLagMs or 0, now
            )
            rolled = time.monotonic()
            if horizon is None or (previous is not None and horizon <= previous.horizon):
                # Nothing new since the last horizon (or nothing old enough): a quick success.
                if previous is not None:
                    self.tables.begin(topic.name, run_id)
                self._runs.finish(run_id, SUCCESS, horizon=previous.horizon if previous else None)
                if previous is not None:  # a table behind the view (or just turned on) catches up
                    schema = self._value_schema(topic.name, policy)
                    self.tables.catch_up(topic, previous, run_id, schema.columns() if schema else None)
                self._runs.observe(topic, started)
                return None
            previous_horizon = previous.horizon if previous else None
            layer_copies: dict[str, StoragePath] = {}
            checksums: dict[int, str] = {}
            sealed = self._inputs.verified_inputs(
                topic, previous, previous_horizon, horizon, layer_copies, copies, checksums
            )
            sealed = self._inputs.local_copies(sealed, copies)
            new_ledger_id = allocate_ledger(db=self.db, topic=topic)
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
                value_schema=self._value_schema(topic.name, policy),
            )
        except Exception as e:  # noqa: BLE001 - recorded as the round's error
            self._inputs.release_copies(copies)
            self._failed(topic, run_id, e, started, previous=previous, new_ledger_id=new_ledger_id)
            return None
        progress = self._runs.progress(topic.name, run_id)
        return _Pending(topic, run_id, started, previous, job, progress, rolled, time.monotonic(), copies)

    def _value_schema(self, name: TopicName, policy: Policy) -> ValueSchema | None:
        """A table topic's JSON or Avro schema (its latest version), whose fields the round
        writes as typed columns (``ledger.value_columns``); None for any other topic."""
        if not policy.table:
            return None
        latest = self._schemas.latest(name)
        if latest is None or latest.info.type not in TYPED_SCHEMAS:
            return None
        schema = ValueSchema(latest.info.type, latest.info.data)
        return schema if schema.columns() is not None else None

    def _complete(self, p: _Pending, outcome: CompactionResult | Exception) -> None:
        """Commit a round's result (or record how it failed), then swap the topic's view."""
        try:
            self._commit_or_fail(p, outcome)
        finally:
            self._inputs.release_copies(p.copies)

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
            # The run reports RUNNING from its commit until its table's (``self.tables``) is done.
            self.tables.begin(topic.name, p.run_id)
            commit_round(
                db=self.db, topic=topic, run_id=p.run_id, result=result, previous=previous, checksum=checksum
            )
        except Exception as e:  # noqa: BLE001 - recorded as the round's error
            self.tables.end(topic.name)
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
        # Before the previous view retires: a kept snapshot may pin its files. While the topic is
        # still the round's: the next round of it commits after this one.
        schema = p.job.value_schema
        self.tables.after_round(topic, view, p.run_id, schema.columns() if schema is not None else None)
        self._runs.observe(topic, p.started, result)
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
        elif (finding := self._damage.damage_in(e)) is not None:
            error = self._damage.damaged_round(topic, finding, previous)
        else:
            log.error("compaction of %s failed", topic.name, exc_info=e)
            error = f"{type(e).__name__}: {e}".strip() or traceback.format_exc()
        if view is not None:
            view.retire()  # its own files go; the ones it shares stay with the current view
        if new_ledger_id is not None:
            compacted_cleanup.discard_compacted(db=self.db, topic=topic, ledger_id=new_ledger_id)
        self._runs.finish(run_id, ERROR, error=error)
        self._runs.observe(topic, started, failed=True)
