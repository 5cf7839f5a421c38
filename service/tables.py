"""A compacted topic's Apache Iceberg table, kept by its compaction rounds (docs/tables.md).

When a topic's effective compaction policy has ``table`` on, every successful round commits a
snapshot of the topic's table whose rows are that round's compacted view
(``ledger.iceberg_table.commit_round`` writes the files; this module decides when, and keeps
the metadata): the new metadata file is made the table's by a compare-and-swap of its
:class:`~service.models.TopicTable` row (retried when another partition's round, or another
instance, swapped first), then the compacted ledgers the kept snapshots name are *pinned* and
the table's files the current metadata no longer names are deleted.

Pins: an Iceberg snapshot's data files are the compacted ledgers' own part files, so a ledger a
kept snapshot names must keep its files after a newer round replaced it. A pin is one more
reference in the topic's :class:`~service.compacted_view.LayerFiles` to every file of that
ledger's manifest: the files then outlive the view, the load's clean-up and the scrub's sweep
(both keep what ``LayerFiles`` holds), and go once the snapshot naming them expires.

A table commit never fails or blocks the round: any error leaves the round successful and its
view served; the topic's :class:`~service.models.TableCommitState` counts the rounds since its
last committed snapshot (the table's lag) and keeps the error, and the next round commits its
own state. Turning ``table`` off drops the table at the next round; deleting the topic (or the
partitioned topic) drops it at once.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass

import pyarrow as pa
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError as DuplicateRow

from ledger import paths
from ledger.compacted_store import MANIFEST_NAME
from ledger.iceberg_table import Committed, RoundState, commit_round, garbage, pinned
from ledger.layers import Manifest
from ledger.storage import StoragePath
from service import models
from service.clock import now_ms
from service.compacted_view import CompactedView
from service.managed_topic import ManagedTopic
from service.metrics import ServiceMetrics
from service.names import TopicName, partition, partition_of
from service.policies import PolicyStore
from service.topics import Broker

log = logging.getLogger(__name__)

# Commits of one table by other partitions or instances that a round may lose to in a row
# before it gives up (the next round tries again).
SWAP_ATTEMPTS = 5
SWAP_BACKOFF_S = 0.05


class TableSwapLost(Exception):
    """Every attempt to make a round's metadata the table's lost to another commit."""


@dataclass(frozen=True)
class TableStatus:
    """A topic's table as the compaction status shows it (``GET .../compaction``, ``table``)."""

    enabled: bool  # the effective policy's ``table``
    snapshot_id: int | None  # the snapshot the topic's last committed round made
    lag_rounds: int  # rounds compacted since then
    last_error: str | None  # the last failed commit's, one line (None once one succeeds)


def table_of(name: TopicName) -> tuple[TopicName, int]:
    """The table a topic's rounds commit into and the topic's partition index in it: a
    partition's, its partitioned topic's table (-1 for a non-partitioned topic)."""
    parent = partition_of(name)
    return parent if parent is not None else (name, -1)


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class TopicTables:
    """The tables of one service instance's topics: their commits, pins, status and removal.

    Thread-safe. Commits of one table take its lock here (partitions' rounds of one instance
    run side by side); between instances the row's ``version`` decides.
    """

    def __init__(
        self, *, broker: Broker, policies: PolicyStore, metrics: ServiceMetrics | None = None
    ) -> None:
        self.broker = broker
        self.db = broker.db
        self.policies = policies
        self.metrics = metrics
        self._lock = threading.Lock()
        self._table_locks: dict[TopicName, threading.Lock] = {}
        # topic id -> (the topic, ledger id -> the files its pin holds).
        self._pins: dict[int, tuple[ManagedTopic, dict[int, set[StoragePath]]]] = {}
        # The run whose table commit is under way, by topic (its round reports RUNNING until then).
        self._committing: dict[TopicName, int] = {}

    def table_dir(self, table: TopicName) -> StoragePath:
        return paths.table_dir(self.broker.storage.at(), table.tenant, table.namespace, table.topic)

    def _table_lock(self, table: TopicName) -> threading.Lock:
        with self._lock:
            return self._table_locks.setdefault(table, threading.Lock())

    # ---------------------------------------------------------------- a round

    def after_round(
        self, topic: ManagedTopic, view: CompactedView, run_id: int, value_columns: pa.Schema | None = None
    ) -> None:
        """Commit the round's view as the table's new snapshot when the topic's policy asks for
        a table (``value_columns``: the typed columns the round wrote into its parts,
        ``ledger.value_columns``); drop the table when it no longer does. Never raises."""
        self.begin(topic.name, run_id)
        try:
            self._after_round(topic, view, run_id, value_columns)
        finally:
            self.end(topic.name)

    def begin(self, name: TopicName, run_id: int) -> None:
        """Run ``run_id`` of topic ``name`` is about to be recorded SUCCESS: it reports RUNNING
        until :meth:`end`, after its table commit (:meth:`committing`)."""
        with self._lock:
            self._committing[name] = run_id

    def end(self, name: TopicName) -> None:
        with self._lock:
            self._committing.pop(name, None)

    def committing(self, name: TopicName) -> int | None:
        """The run whose table commit is under way for topic ``name``, if one is: the round
        reports RUNNING until its snapshot is committed (or its failure recorded), so that a
        client that waited for SUCCESS finds the round's snapshot in the table."""
        with self._lock:
            return self._committing.get(name)

    def _after_round(
        self, topic: ManagedTopic, view: CompactedView, run_id: int, value_columns: pa.Schema | None
    ) -> None:
        table, _ = table_of(topic.name)
        try:
            if not self._enabled(topic.name):
                if self._row(table) is not None:
                    log.info("dropping the table of %s: its policy no longer asks for one", table)
                    self.drop(table)
                return
            started = time.monotonic()
            committed = self._commit(topic, view, run_id, value_columns)
        except Exception as e:  # noqa: BLE001 - the round stays successful; the next one retries
            log.warning("the table commit of %s (round %d) failed", topic.name, run_id, exc_info=True)
            self._record(topic, failed=_one_line(e))
            return
        log.info(
            "committed snapshot %d of table %s (ledger %d of %s) in %d ms",
            committed.snapshot_id,
            table,
            view.ledger_id,
            topic.name,
            int((time.monotonic() - started) * 1000),
        )
        self._record(topic, committed=committed, ledger_id=view.ledger_id)

    def catch_up(
        self, topic: ManagedTopic, view: CompactedView, run_id: int, value_columns: pa.Schema | None = None
    ) -> None:
        """A round with nothing new to compact: commit the current view if the table does not
        have it yet (a failed commit before, or ``table`` just turned on), or drop the table
        ``table`` was turned off for (ends what :meth:`begin` began). Never raises."""
        try:
            with self.db.session() as s:
                state = s.get(models.TableCommitState, topic.topic_id)
                current = state is not None and state.lag_rounds == 0 and state.ledger_id == view.ledger_id
            if current and self._row(table_of(topic.name)[0]) is not None and self._enabled(topic.name):
                self.end(topic.name)
                return
        except Exception:  # noqa: BLE001 - after_round records what fails
            log.debug("checking the table of %s failed", topic.name, exc_info=True)
        self.after_round(topic, view, run_id, value_columns)

    def _enabled(self, name: TopicName) -> bool:
        # The table's own topic decides: a partition's rounds follow their partitioned topic's
        # policy (its table is one for every partition; one partition's ``table`` is not asked).
        return bool(self.policies.effective(table_of(name)[0]).table)

    def _commit(
        self, topic: ManagedTopic, view: CompactedView, run_id: int, value_columns: pa.Schema | None
    ) -> Committed:
        table, index = table_of(topic.name)
        state = RoundState(
            partition=index,
            ledger_dir=view.directory,
            ledger_id=view.ledger_id,
            horizon=view.horizon,
            round=run_id,
            value_columns=value_columns,
        )
        settings = self.broker.settings
        directory = self.table_dir(table)
        with self._table_lock(table):
            for _ in range(SWAP_ATTEMPTS):
                row = self._row(table)
                current, version = (row.metadata_location, row.version) if row is not None else (None, None)
                committed = commit_round(
                    directory,
                    current,
                    state,
                    now_ms=now_ms(),
                    snapshots_kept=settings.table_snapshots_kept,
                    max_age_ms=int(settings.table_snapshot_max_age_seconds * 1000),
                )
                if self._swap(table, committed.metadata_location, version):
                    break
                log.info("the table commit of %s lost a swap; retrying on the new metadata", topic.name)
                # A random pause, so that two instances' commits that keep meeting drift apart.
                time.sleep(random.uniform(0, SWAP_BACKOFF_S))
            else:
                raise TableSwapLost(f"{SWAP_ATTEMPTS} commits of table {table} lost to other commits")
            self._repin(table, committed.pinned)
            self._collect_garbage(directory, committed.metadata_location)
        return committed

    def _row(self, table: TopicName) -> models.TopicTable | None:
        with self.db.session() as s:
            row = s.get(models.TopicTable, (table.tenant, table.namespace, table.topic))
            if row is not None:
                s.expunge(row)
            return row

    def _swap(self, table: TopicName, location: str, version: int | None) -> bool:
        """Make ``location`` the table's metadata if the row is still at ``version`` (None: no
        row yet). False when another commit came first."""
        now = now_ms()
        try:
            with self.db.session() as s:
                if version is None:
                    s.add(
                        models.TopicTable(
                            tenant=table.tenant,
                            namespace=table.namespace,
                            name=table.topic,
                            metadata_location=location,
                            version=1,
                            created_at=now,
                            updated_at=now,
                        )
                    )
                    s.flush()
                    return True
                done = s.execute(
                    update(models.TopicTable)
                    .where(
                        models.TopicTable.tenant == table.tenant,
                        models.TopicTable.namespace == table.namespace,
                        models.TopicTable.name == table.topic,
                        models.TopicTable.version == version,
                    )
                    .values(metadata_location=location, version=version + 1, updated_at=now)
                )
                return bool(done.rowcount == 1)  # type: ignore[attr-defined]
        except DuplicateRow:  # another commit created the row first
            return False

    def _collect_garbage(self, directory: StoragePath, location: str) -> None:
        """Delete the table's files its current metadata no longer names (what lost swaps
        and expired snapshots left); what fails here, the next commit deletes."""
        try:
            for f in garbage(directory, location):
                f.unlink()
        except Exception:  # noqa: BLE001 - only files no snapshot names are at stake
            log.warning("removing unused files of table %s failed", directory, exc_info=True)

    # ---------------------------------------------------------------- pins

    def _repin(self, table: TopicName, by_partition: dict[int, set[int]]) -> None:
        """Pin, in each of the table's topics this instance serves, the ledgers the kept
        snapshots name, and unpin the others (another instance's partitions catch up at their
        next round or load)."""
        with self._lock:
            held = [topic for topic, _ in self._pins.values() if table_of(topic.name)[0] == table]
        mine: dict[TopicName, ManagedTopic] = {}
        for topic in held:
            if self.broker.served(topic.name) is topic:
                mine[topic.name] = topic
            else:  # unloaded (another instance took it): its files are no longer this one's to free
                with self._lock:
                    self._pins.pop(topic.topic_id, None)
        for index in by_partition:
            name = table if index < 0 else partition(table, index)
            served = self.broker.served(name)
            if served is not None:
                mine[name] = served
        for name, topic in mine.items():
            self._pin(topic, by_partition.get(table_of(name)[1], set()))

    def _pin(self, topic: ManagedTopic, ledger_ids: set[int]) -> None:
        """Make ``ledger_ids`` the ledgers whose files ``topic`` keeps for its table: acquire
        the newly pinned ones' files before releasing those no snapshot names any more."""
        with self._lock:
            entry = self._pins.get(topic.topic_id)
            held = dict(entry[1]) if entry is not None and entry[0] is topic else {}
        for ledger_id in ledger_ids - held.keys():
            files = self._ledger_files(topic, ledger_id)
            topic.layer_files.acquire(files)
            held[ledger_id] = files
        for ledger_id in held.keys() - ledger_ids:
            topic.layer_files.release(held.pop(ledger_id))
        with self._lock:
            self._pins[topic.topic_id] = (topic, held)

    @staticmethod
    def _ledger_files(topic: ManagedTopic, ledger_id: int) -> set[StoragePath]:
        """Every file of compacted ledger ``ledger_id``'s manifest (as a view of it holds)."""
        view = topic.view
        if view is not None and view.ledger_id == ledger_id:
            return set(view.files)
        directory = paths.compacted_dir(topic.ledger.store, ledger_id)
        manifest = Manifest.load(directory)
        root = directory.parent
        return {root / name for name in manifest.files()} | {directory / MANIFEST_NAME}

    def load(self, topic: ManagedTopic) -> set[StoragePath]:
        """At a topic's load (after its view is loaded): pin the ledgers its table's kept
        snapshots name. Returns their files, for the load's clean-up to keep."""
        table, index = table_of(topic.name)
        with self._table_lock(table):  # not while a commit of another partition repins
            row = self._row(table)
            if row is None:
                return set()
            ids = pinned(self.broker.storage, row.metadata_location).get(index, set())
            self._pin(topic, ids)
        with self.db.session() as s:
            state = s.get(models.TableCommitState, topic.topic_id)
            lag = state.lag_rounds if state is not None else 0
        if self.metrics is not None:
            self.metrics.compaction.table_lag(topic.topic_id, lag)
        with self._lock:
            return set().union(*self._pins[topic.topic_id][1].values())

    def unpin_all(self, topic: ManagedTopic) -> None:
        with self._lock:
            entry = self._pins.pop(topic.topic_id, None)
        if entry is not None and entry[0] is topic:
            for files in entry[1].values():
                topic.layer_files.release(files)

    # ---------------------------------------------------------------- state

    def _record(
        self,
        topic: ManagedTopic,
        *,
        failed: str | None = None,
        committed: Committed | None = None,
        ledger_id: int | None = None,
    ) -> None:
        """The topic's lag and last error after a commit (0 and None) or a failed one (+1)."""
        try:
            with self.db.session() as s:
                state = s.get(models.TableCommitState, topic.topic_id)
                if state is None:
                    state = models.TableCommitState(topic_id=topic.topic_id, lag_rounds=0)
                    s.add(state)
                if failed is not None:
                    state.lag_rounds = (state.lag_rounds or 0) + 1
                    state.last_error = failed
                else:
                    assert committed is not None
                    state.lag_rounds, state.last_error = 0, None
                    state.snapshot_id, state.ledger_id = committed.snapshot_id, ledger_id
                state.updated_at = now_ms()
                lag = state.lag_rounds
        except Exception:  # noqa: BLE001 - the status misses one round; the round is fine
            log.exception("recording the table commit of %s failed", topic.name)
            return
        if self.metrics is not None:
            self.metrics.compaction.table_lag(topic.topic_id, lag, failed=failed is not None)

    def status(self, name: TopicName, partitions: list[TopicName] | None = None) -> TableStatus | None:
        """The table of a topic (or of a partitioned topic, given its partitions: the largest
        lag of any partition, with its error): None when it has none and its policy asks for none."""
        table, _ = table_of(name)
        enabled = self._enabled(name)
        row = self._row(table)
        if not enabled and row is None:
            return None
        names = partitions if partitions is not None else [name]
        with self.db.session() as s:
            ids = s.scalars(
                select(models.Topic.id).where(
                    models.Topic.tenant == name.tenant,
                    models.Topic.namespace == name.namespace,
                    models.Topic.name.in_([n.topic for n in names]),
                )
            ).all()
            states = s.scalars(
                select(models.TableCommitState).where(models.TableCommitState.topic_id.in_(ids))
            ).all()
            if not states:
                return TableStatus(enabled=enabled, snapshot_id=None, lag_rounds=0, last_error=None)
            worst = max(states, key=lambda st: (st.lag_rounds, st.updated_at))
            latest = max(states, key=lambda st: st.updated_at if st.snapshot_id is not None else -1)
            return TableStatus(
                enabled=enabled,
                snapshot_id=latest.snapshot_id,
                lag_rounds=worst.lag_rounds,
                last_error=worst.last_error,
            )

    # ---------------------------------------------------------------- removal

    def drop(self, table: TopicName) -> None:
        """Drop a table: its row (engines no longer find it), the pins of its topics, their
        commit states, then its files."""
        with self._table_lock(table):
            with self.db.session() as s:
                s.execute(
                    delete(models.TopicTable).where(
                        models.TopicTable.tenant == table.tenant,
                        models.TopicTable.namespace == table.namespace,
                        models.TopicTable.name == table.topic,
                    )
                )
                ids = [
                    i
                    for i, n in s.execute(
                        select(models.Topic.id, models.Topic.name).where(
                            models.Topic.tenant == table.tenant, models.Topic.namespace == table.namespace
                        )
                    ).all()
                    if table_of(TopicName(table.tenant, table.namespace, n))[0] == table
                ]
                if ids:
                    s.execute(
                        delete(models.TableCommitState).where(models.TableCommitState.topic_id.in_(ids))
                    )
            with self._lock:
                topics = [t for t, _ in self._pins.values() if table_of(t.name)[0] == table]
            for topic in topics:
                self.unpin_all(topic)
                if self.metrics is not None:
                    self.metrics.compaction.table_lag(topic.topic_id, None)
            self.table_dir(table).delete_tree()

    def remove_orphans(self) -> int:
        """Remove the table directories no table row names: what a drop, or a table's first
        commit, left when the process stopped in between (a single instance's start-up: no
        round commits meanwhile). Returns how many went."""
        with self.db.session() as s:
            named = {(r.tenant, r.namespace, r.name) for r in s.scalars(select(models.TopicTable))}
        removed = 0
        for tenant in self.broker.storage.at("tables").dirs():
            for namespace in tenant.dirs():
                for table in namespace.dirs():
                    if (tenant.name, namespace.name, table.name) not in named:
                        log.warning("removing table directory %s, which no table names", table)
                        table.delete_tree()
                        removed += 1
        return removed

    def deleted(self, name: TopicName) -> None:
        """A topic (or a partitioned topic) was deleted: forget its pins (its files are gone)
        and drop its table, unless it is one partition of a partitioned topic (whose table
        goes with the partitioned topic). Never raises."""
        with self._lock:
            for topic_id in [i for i, (t, _) in self._pins.items() if t.name == name]:
                del self._pins[topic_id]
        if partition_of(name) is not None:
            return
        try:
            self.drop(name)
        except Exception:  # noqa: BLE001 - the topic is deleted either way
            log.exception("dropping the table of deleted topic %s failed", name)
