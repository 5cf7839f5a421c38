"""Topics: the ``Broker``, which creates, deletes, lists and loads them and takes every produce
and read on them.

The ``Broker`` owns one ``ManagedTopic`` per topic it serves. A single instance (SQLite, the
default) serves every topic of the metadata store, loaded (and recovered) at start-up. With
several instances (``ownership`` given: PostgreSQL), it serves the topics it holds a lease on
(:mod:`service.ownership`): it loads a topic when it claims it (a request for a topic nobody
holds, its share of lapsed topics, a new topic assigned to it) and drops it when the lease
moves; a request for a topic another instance holds raises ``NotOwner`` (a redirect).
Everything a route asks of a topic goes through it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError as DuplicateRow

from ledger import row_group_cache
from ledger.entry import Appended, Entry, LedgerItem, Position, StoredBatch, item_entries, record_size
from service import chunked, deduplication, models, termination, topic_reads
from service.clock import now_ms
from service.db import Database
from service.deduplication import ProducerSequences
from service.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    NotOwner,
    OwnershipLost,
    TooLarge,
    Unavailable,
)
from service.instances import db_now_ms
from service.ledger_resources import LedgerResources
from service.managed_ledger import ManagedLedger
from service.managed_topic import CompactedDamageHandler, ManagedTopic
from service.names import TopicName
from service.ownership import Lease, LeaseOwnership, forever
from service.publishers import Publishers
from service.resources import descriptor_limit, ledger_file_budget
from service.settings import Settings
from service.topic_files import remove_orphan_dirs, remove_topic_files, topic_root, topic_store
from service.wal_objects import ObjectWal

log = logging.getLogger(__name__)

# How often the scrub's passes sweep the write-ahead objects at most (COMPACTOR_WAL=object).
WAL_SWEEP_EVERY_S = 60.0


class Broker:
    """The topics of one service instance. Thread-safe."""

    def __init__(self, *, settings: Settings, db: Database, ownership: LeaseOwnership | None = None) -> None:
        self.settings = settings
        self.db = db
        self.ownership = ownership
        # Where sealed and compacted ledgers are kept (write-ahead files stay under data_dir).
        self.storage = settings.ledger_storage()
        self._topics: dict[TopicName, ManagedTopic] = {}
        self._lock = threading.Lock()
        # Called with each topic as it is loaded (subscriptions, the compacted view).
        self._load_listeners: list[Callable[[ManagedTopic], None]] = []
        # Called with the name of each topic (or partitioned topic) deleted (its Iceberg table).
        self._delete_listeners: list[Callable[[TopicName], None]] = []
        self._claim_locks: dict[TopicName, threading.Lock] = {}
        self._owner_thread: threading.Thread | None = None
        # Seals rolled-over ledgers to Parquet off the produce path, one at a time.
        self._sealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-sealer")
        # Publishes (uploads) and commits what the sealer wrote, while it writes the next.
        self._publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-publisher")
        # Sized from the descriptor limit as it is now: the service raises it before this.
        max_files = ledger_file_budget(settings.max_open_ledger_files, descriptor_limit())
        if max_files < settings.max_open_ledger_files:
            log.info(
                "keeping at most %d sealed-ledger files open (a quarter of the open-file limit; "
                "max_open_ledger_files is %d)",
                max_files,
                settings.max_open_ledger_files,
            )
        # COMPACTOR_WAL=object: open ledgers are group-committed to the ledger storage.
        self.object_wal = (
            ObjectWal(db=db, storage=self.storage, settings=settings) if settings.wal == "object" else None
        )
        self._wal_swept_at = 0.0
        # The binary protocol's producers of each topic, for its stats.
        self.publishers = Publishers()
        self.resources = LedgerResources.from_settings(
            settings, self._sealer, self._publisher, max_files, self.object_wal
        )
        # Hot row groups of every topic's ledgers, one cache for the process (object storage:
        # what a read would otherwise request again; none on a local disk by default).
        row_group_cache.shared().resize(settings.row_group_cache_bytes())
        self._stopping = threading.Event()
        self._sweeper: threading.Thread | None = None
        # Set by the compaction service: what to do when a read meets a damaged compacted ledger.
        self.on_compacted_damage: CompactedDamageHandler | None = None
        # Set by the compaction service: remove the files a topic's failed rounds left behind
        # (a scrub calls it; returns how many compacted ledgers or files went).
        self.sweep_orphans: Callable[[ManagedTopic], int] | None = None

    # ---------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Load every topic (a single instance) and remove files no topic owns; with several
        instances, register and start holding leases instead (topics load as they are claimed)."""
        with self.db.session() as s:
            rows = s.scalars(select(models.Topic).order_by(models.Topic.id)).all()
            topics = [(r.id, TopicName(r.tenant, r.namespace, r.name)) for r in rows]
        if self.ownership is None:
            if self.object_wal is not None:
                self.object_wal.start()
            for topic_id, name in topics:
                self._load(topic_id, name, forever())
        else:
            self.ownership.registry.register()
            if self.object_wal is not None:
                self.object_wal.start(self.ownership.instance_id)
            # Restarted after a crash: the topics this instance held before are still leased to
            # its earlier process; take them back (after their leases lapse) before serving.
            for topic_id in self.ownership.earlier_selves():
                self._acquire_by_id(topic_id)
        if self.ownership is None:
            # Not with several instances: another one may be creating a topic's files right now.
            remove_orphan_dirs(self.settings.data_dir, self.storage, {name for _, name in topics})
            self.sweep_write_ahead(force=True)
        self._sweeper = threading.Thread(
            target=self._close_idle_files, name="ledger-file-sweeper", daemon=True
        )
        self._sweeper.start()
        if self.ownership is not None:
            self._owner_thread = threading.Thread(target=self._hold_leases, name="leases", daemon=True)
            self._owner_thread.start()

    def on_load(self, listener: Callable[[ManagedTopic], None]) -> None:
        """Call ``listener`` with every topic loaded so far and each one loaded later."""
        with self._lock:
            self._load_listeners.append(listener)
            loaded = list(self._topics.values())
        for topic in loaded:
            listener(topic)

    def on_delete(self, listener: Callable[[TopicName], None]) -> None:
        """Call ``listener`` with the name of each topic, and of each partitioned topic, deleted
        from now on (once its rows and files are gone)."""
        with self._lock:
            self._delete_listeners.append(listener)

    def deleted(self, name: TopicName) -> None:
        """Tell the delete listeners that ``name`` is gone (``delete_topic`` and the deletion
        of a partitioned topic call it)."""
        with self._lock:
            listeners = list(self._delete_listeners)
        for listener in listeners:
            listener(name)

    def _load(self, topic_id: int, name: TopicName, lease: Lease) -> ManagedTopic:
        fence = self.ownership.fence(topic_id, lease.epoch) if self.ownership is not None else None
        ml = ManagedLedger.recover(
            topic_id=topic_id,
            root=topic_root(self.settings.data_dir, name),
            db=self.db,
            settings=self.settings,
            shared=self.resources,
            epoch=lease.epoch,
            fence=fence,
            store=topic_store(self.storage, name),
        )
        ml.name = str(name)
        ml.terminated = termination.load(self.db, topic_id)
        topic = ManagedTopic(name=name, topic_id=topic_id, ledger=ml, lease=lease)
        try:
            for listener in list(self._load_listeners):
                listener(topic)
        except BaseException:
            ml.close()
            raise
        with self._lock:
            self._topics[name] = topic
        return topic

    # ---------------------------------------------------------------- ownership (several instances)

    def _hold_leases(self) -> None:
        """Renew this instance's leases, drop the topics it lost, load the ones assigned to it,
        and take its share of lapsed ones."""
        assert self.ownership is not None
        ownership = self.ownership
        while not self._stopping.wait(ownership.renew_every_s):
            try:
                lost, assigned = ownership.renew()
                for topic_id in lost:
                    self._unload(topic_id)
                for topic_id in assigned + ownership.to_balance():
                    if self._stopping.is_set():
                        return
                    self._acquire_by_id(topic_id)
            except Exception:  # noqa: BLE001 - the database may be away for a while; leases then lapse
                log.exception("renewing the topic leases failed")

    def _acquire_by_id(self, topic_id: int) -> None:
        with self.db.session() as s:
            row = s.get(models.Topic, topic_id)
            if row is None:
                return
            name = TopicName(row.tenant, row.namespace, row.name)
        try:
            self._acquire(name, topic_id)
        except (NotOwner, NotFound):
            pass
        except Exception:  # noqa: BLE001 - tried again at the next round
            log.exception("taking over topic %s failed", name)

    def _acquire(self, name: TopicName, topic_id: int) -> ManagedTopic:
        """The topic loaded here: claimed if this instance may, else ``NotOwner``."""
        assert self.ownership is not None
        with self._lock:
            claim_lock = self._claim_locks.setdefault(name, threading.Lock())
        with claim_lock:
            with self._lock:
                topic = self._topics.get(name)
            if topic is not None:
                return topic
            lease = self.ownership.claim(topic_id)
            if lease is None:
                owner = self.ownership.owner(topic_id)
                if owner.url is not None and owner.url != self.ownership.url:
                    raise NotOwner(f"topic {name} is owned by {owner.url}", owner.url, owner.broker_url)
                raise Unavailable(f"topic {name} is changing owners; look it up again", retry_after=1)
            log.info("taking topic %s (epoch %d)", name, lease.epoch)
            try:
                return self._load(topic_id, name, lease)
            except BaseException:
                self.ownership.forget(topic_id)
                raise

    def _unload(self, topic_id: int) -> None:
        """Drop a topic whose lease moved to another instance (nothing is written any more)."""
        with self._lock:
            topic = next((t for t in self._topics.values() if t.topic_id == topic_id), None)
            if topic is None:
                return
            self._topics.pop(topic.name, None)
        topic.lease.lose()
        log.warning("lost the lease of topic %s: another instance owns it now", topic.name)
        topic.ledger.close()

    def _locate(self, name: TopicName) -> ManagedTopic:
        """A topic not loaded here: ``NotFound``, ``NotOwner`` (owned elsewhere), or claimed."""
        assert self.ownership is not None
        with self.db.session() as s:
            row = s.scalar(
                select(models.Topic).where(
                    models.Topic.tenant == name.tenant,
                    models.Topic.namespace == name.namespace,
                    models.Topic.name == name.topic,
                )
            )
            if row is None:
                raise NotFound(f"topic {name} not found")
            topic_id = row.id
        owner = self.ownership.owner(topic_id)
        if owner.valid and owner.url is not None and owner.url != self.ownership.url:
            raise NotOwner(f"topic {name} is owned by {owner.url}", owner.url, owner.broker_url)
        return self._acquire(name, topic_id)

    def sweep_write_ahead(self, *, force: bool = False) -> int:
        """``COMPACTOR_WAL=object``: remove the write-ahead objects no open ledger needs (a
        crash's, a failed flush's); at most once a minute unless ``force``. Returns how many."""
        wal = self.object_wal
        if wal is None or (not force and time.monotonic() - self._wal_swept_at < WAL_SWEEP_EVERY_S):
            return 0
        self._wal_swept_at = time.monotonic()
        live: set[int] | None = None
        if self.ownership is not None:
            with self.db.session() as s:
                live = set(self.ownership.registry.live(s, db_now_ms(s)))
        return wal.sweep(live, dead_age_ms=3 * self.settings.ownership_lease_ms)

    def _close_idle_files(self) -> None:
        """Close sealed-ledger files no read used lately: a consumer that keeps up reads each
        ledger once, and its files would otherwise stay open until the LRU's bound."""
        files = self.resources.files
        while not self._stopping.wait(max(0.05, files.idle_s / 4)):
            files.close_idle()

    def stop(self) -> None:
        self._stopping.set()
        if self._sweeper is not None:
            self._sweeper.join()
        if self._owner_thread is not None:
            self._owner_thread.join()
        self._sealer.shutdown(wait=True)  # finish sealing what was rolled over
        self._publisher.shutdown(wait=True)  # ... and publishing it (the sealer hands it over)
        with self._lock:
            for topic in self._topics.values():
                topic.ledger.close()
            self._topics.clear()
        self.resources.files.clear()
        if self.object_wal is not None:
            self.object_wal.stop()
        row_group_cache.shared().clear()
        if self.ownership is not None:
            try:  # nothing is written any more: other instances may take the topics at once
                self.ownership.release_all()
                self.ownership.registry.deregister()
            except Exception:  # noqa: BLE001 - the leases then lapse on their own
                log.exception("releasing the topic leases failed")

    def _remove_files(self, name: TopicName) -> None:
        """Every file of a topic, on the local disk and in the ledger storage."""
        remove_topic_files(self.settings.data_dir, self.storage, self.resources.copies, name)

    # ---------------------------------------------------------------- admin

    def create_topic(self, name: TopicName) -> ManagedTopic | None:
        """Create a topic; returns it when this instance serves it (with several instances it
        is given to the live instance with the fewest topics, None when that is another)."""
        if self.ownership is not None:
            return self._create_shared(name)
        with self._lock:
            if name in self._topics:
                raise Conflict(f"topic {name} already exists")
            with self.db.session() as s:
                row = models.Topic(
                    tenant=name.tenant, namespace=name.namespace, name=name.topic, created_at=now_ms()
                )
                s.add(row)
                s.flush()
                topic_id = row.id
            root = topic_root(self.settings.data_dir, name)
            self._remove_files(name)  # left by a deletion that crashed before removing them
            ml = ManagedLedger.create(
                topic_id=topic_id,
                root=root,
                db=self.db,
                settings=self.settings,
                shared=self.resources,
                store=topic_store(self.storage, name),
            )
            ml.name = str(name)
            topic = ManagedTopic(name=name, topic_id=topic_id, ledger=ml)
            self._topics[name] = topic
            return topic

    def _create_shared(self, name: TopicName) -> ManagedTopic | None:
        assert self.ownership is not None
        try:
            with self.db.session() as s:
                row = models.Topic(
                    tenant=name.tenant, namespace=name.namespace, name=name.topic, created_at=now_ms()
                )
                s.add(row)
                s.flush()
                topic_id = row.id
                owner = self.ownership.assign(s, topic_id, db_now_ms(s))
        except DuplicateRow:
            raise Conflict(f"topic {name} already exists") from None
        if owner != self.ownership.instance_id:
            return None
        self._remove_files(name)  # left by a deletion that crashed before removing them
        return self._acquire(name, topic_id)

    def delete_topic(self, name: TopicName) -> None:
        """Delete a topic, its subscriptions and all its files. 409 while it compacts."""
        topic = self.topic(name)
        if not topic.admin_lock.acquire(blocking=False):
            raise Conflict(f"topic {name} is being compacted; try again when it is done")
        try:
            with self._lock:
                self._topics.pop(name, None)
            topic.ledger.close()
            wal_objects: set[str] = set()
            with self.db.session() as s:
                if topic.ledger.fence is not None:
                    topic.ledger.fence(s)
                if self.object_wal is not None:
                    wal_objects = self.object_wal.keys_of_topic(s, topic.topic_id)
                s.execute(delete(models.Topic).where(models.Topic.id == topic.topic_id))
            if self.ownership is not None:
                self.ownership.forget(topic.topic_id)
            # Files go after the commit: a crash in between leaves an orphan directory,
            # which start-up removes, never metadata pointing at missing files.
            self._remove_files(name)
            if self.object_wal is not None:  # its chunks went with its ledgers' rows
                self.object_wal.remove_unnamed(wal_objects)
            self.deleted(name)
        finally:
            topic.admin_lock.release()

    def list_topics(self, tenant: str, namespace: str) -> list[str]:
        if self.ownership is not None:  # every instance's topics
            with self.db.session() as s:
                names = s.scalars(
                    select(models.Topic.name).where(
                        models.Topic.tenant == tenant, models.Topic.namespace == namespace
                    )
                ).all()
            return sorted(str(TopicName(tenant, namespace, n)) for n in names)
        with self._lock:
            return sorted(str(n) for n in self._topics if n.tenant == tenant and n.namespace == namespace)

    def topic(self, name: TopicName) -> ManagedTopic:
        with self._lock:
            topic = self._topics.get(name)
        if topic is None:
            if self.ownership is not None:
                return self._locate(name)
            raise NotFound(f"topic {name} not found")
        return topic

    def served(self, name: TopicName) -> ManagedTopic | None:
        """The topic if this instance serves it now, else None: never claims or loads one
        (cheap enough for the event loop)."""
        with self._lock:
            return self._topics.get(name)

    def topics(self) -> list[ManagedTopic]:
        with self._lock:
            return list(self._topics.values())

    # ---------------------------------------------------------------- data

    def check_records(self, records: Sequence[Appended]) -> list[int]:
        """Each record's size, once every one is within the limit (``InvalidInput`` for no
        records, ``TooLarge`` naming the first over it). A Pulsar batch's size is its members'
        (each of them was checked against the limit as its batch arrived)."""
        if not records:
            raise InvalidInput("a produce request needs at least one message")
        limit = self.settings.max_message_size
        sizes = [
            0 if type(r) is StoredBatch else record_size(r.key, r.value, r.properties)  # type: ignore[union-attr]
            for r in records
        ]
        if max(sizes) > limit:
            # Only a stored chunk of a chunked message (``service.chunked``) may pass it: by the
            # whole message its last chunk holds.
            over = [i for i, size in enumerate(sizes) if size > limit and _limit_size(records[i]) > limit]
            if over:
                i = over[0]
                raise TooLarge(f"message {i} is {sizes[i]} bytes; the limit is {limit}")
        for i, r in enumerate(records):
            if type(r) is StoredBatch:
                sizes[i] = r.size
        return sizes

    def produce(self, name: TopicName, records: Sequence[Appended]) -> list[Position]:
        """Append records atomically checked: every record is valid, or none is written; returns
        each one's id (a Pulsar batch's: its first member's). The records are the caller's to
        give away: each gets its publish time here."""
        sizes = self.check_records(records)
        topic = self.topic(name)
        lease = topic.lease
        if not lease.valid():
            raise _lost(name)
        refusal = topic.quota_refusal
        if refusal is not None:  # over a producer_* backlog quota (service.backlog_quota_checks)
            raise refusal()
        publish_time = now_ms()
        for r in records:
            r.publish_time = publish_time  # the broker's clock, as Pulsar's broker stamps it
        try:
            positions = topic.ledger.append(records, sizes)
        except Exception as e:
            if not lease.valid():  # dropped while writing: the lease moved
                raise _lost(name) from e
            raise
        # Acknowledged only while the lease holds (a monotonic comparison, no database round
        # trip): after it, another instance may have taken the topic over and not seen these.
        if not lease.valid():
            raise _lost(name)
        return positions

    def terminate(self, name: TopicName) -> Position:
        """Terminate a topic (Pulsar's terminate): no write is taken after it, reads go on.
        Returns its last message's id once that is acknowledged (the same id again for a
        topic terminated before); the state is in the metadata, for restarts and other owners."""
        topic = self.topic(name)
        if not topic.lease.valid():
            raise _lost(name)
        last = topic.ledger.terminate()
        termination.store(self.db, topic.topic_id, last, topic.ledger.fence)
        # Appends written before it are acknowledged by their writers: wait for them.
        if last.entry_id >= 0:
            topic.ledger.wait_for_entries(Position(last.ledger_id, last.entry_id - 1), 30.0)
        return last

    def resolve_start(self, topic: ManagedTopic, start: str) -> Position:
        """``earliest``, ``latest`` or ``"L:E"`` as a position of the topic's log."""
        return topic_reads.resolve_start(topic, start)

    def read(
        self, name: TopicName, start: str, max_messages: int, *, read_compacted: bool = False
    ) -> tuple[list[Entry], Position]:
        """Read from ``start`` inclusive; returns the messages and where the next page starts.

        ``read_compacted=False`` reads the original log, every message. With ``True``, a start
        at or before the compaction horizon reads the compacted ledger from the first record
        with an id >= start, then the original log after the horizon.
        """
        if max_messages < 1:
            raise InvalidInput("maxMessages must be at least 1")
        topic = self.topic(name)
        pos = self.resolve_start(topic, start)
        out, nxt = self.read_at(
            topic, pos, min(max_messages, self.settings.max_read_messages), read_compacted
        )
        topic.messages_out.add(len(out))
        return out, nxt

    def read_waiting(
        self,
        name: TopicName,
        pos: Position,
        limit: int,
        *,
        read_compacted: bool,
        timeout_s: float,
        whole: bool = False,
    ) -> tuple[list[LedgerItem], Position]:
        """``read_at`` for a reader that keeps its own position (Pulsar's non-durable cursor):
        when nothing is there yet, wait up to ``timeout_s`` for the next entry. ``whole``:
        stored batches whole (:meth:`read_batches_at`)."""
        topic = self.topic(name)
        limit = min(limit, self.settings.max_read_messages)
        read = cast(
            Callable[[ManagedTopic, Position, int, bool], tuple[list[LedgerItem], Position]],
            self.read_batches_at if whole else self.read_at,
        )
        out, nxt = read(topic, pos, limit, read_compacted)
        if not out and timeout_s > 0:
            topic.ledger.wait_for_entries(Position(nxt.ledger_id, nxt.entry_id - 1), timeout_s)
            out, nxt = read(topic, nxt, limit, read_compacted)
        topic.messages_out.add(sum(map(item_entries, out)) if whole else len(out))
        return out, nxt

    def producer_sequences(self, name: TopicName) -> ProducerSequences:
        """The highest sequence id stored from each Pulsar producer of the topic (built from its
        ledgers the first time, then kept by the producers that write)."""
        topic = self.topic(name)
        with topic.sequences_lock:
            if topic.sequences is None:
                topic.sequences = deduplication.load(topic.ledger)
            return topic.sequences

    def last_message_id(self, name: TopicName, *, read_compacted: bool) -> Position | None:
        """The id of the topic's last message a reader of that kind sees, None when it has none
        (:func:`service.topic_reads.last_message_id`)."""
        return topic_reads.last_message_id(self.topic(name), read_compacted)

    def read_batches_at(
        self, topic: ManagedTopic, pos: Position, limit: int, read_compacted: bool
    ) -> tuple[list[LedgerItem], Position]:
        """:func:`service.topic_reads.read_batches_at`, with this broker's damage handler."""
        return topic_reads.read_batches_at(topic, pos, limit, read_compacted, self.on_compacted_damage)

    def read_at(
        self, topic: ManagedTopic, pos: Position, limit: int, read_compacted: bool
    ) -> tuple[list[Entry], Position]:
        """Up to ``limit`` messages from ``pos`` inclusive, and where the next read starts
        (:func:`service.topic_reads.read_at`, with this broker's damage handler)."""
        return topic_reads.read_at(topic, pos, limit, read_compacted, self.on_compacted_damage)


def _limit_size(r: Appended) -> int:
    return r.size if type(r) is StoredBatch else chunked.limit_size(r)  # type: ignore[union-attr,arg-type]


def _lost(name: TopicName) -> OwnershipLost:
    return OwnershipLost(
        f"this instance's lease on topic {name} lapsed or moved; the write was not acknowledged: "
        "look the topic up again"
    )
