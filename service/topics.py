"""Topics: creating, deleting, listing them, and the live state of each loaded topic.

The ``Broker`` owns one ``ManagedTopic`` per topic in the metadata store, loaded (and
recovered) at start-up. Everything a route asks of a topic goes through it.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from ledger import paths
from ledger.entry import Entry, Position, Record, record_size
from service import models
from service.clock import now_ms
from service.compacted_view import CompactedView, LayerFiles, RetiredView
from service.counters import Tally
from service.db import Database
from service.errors import Conflict, InvalidInput, NotFound, TooLarge
from service.managed_ledger import LedgerResources, ManagedLedger
from service.names import TopicName
from service.resources import descriptor_limit, ledger_file_budget
from service.settings import Settings

log = logging.getLogger(__name__)

EARLIEST = "earliest"
LATEST = "latest"


@dataclass
class ManagedTopic:
    """A loaded topic: its log and the state of its compaction."""

    name: TopicName
    topic_id: int
    ledger: ManagedLedger
    # Serialises compaction rounds and deletion of this topic.
    admin_lock: threading.Lock = field(default_factory=threading.Lock)
    view: CompactedView | None = None
    # The files of the compacted views alive now (the view, and replaced ones still leased).
    layer_files: LayerFiles = field(default_factory=LayerFiles)
    # Durable subscriptions by name (service.cursors.Subscription), loaded at start.
    subscriptions: dict[str, Any] = field(default_factory=dict)
    # Messages delivered to consumers and readers since the service started (pulsar_out_messages_total).
    messages_out: Tally = field(default_factory=Tally)

    def compacted_view(self) -> CompactedView | None:
        return self.view


class Broker:
    """The topics of one service instance. Thread-safe."""

    def __init__(self, *, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self._topics: dict[TopicName, ManagedTopic] = {}
        self._lock = threading.Lock()
        # Seals rolled-over ledgers to Parquet off the produce path, one at a time.
        self._sealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-sealer")
        # Sized from the descriptor limit as it is now: the service raises it before this.
        max_files = ledger_file_budget(settings.max_open_ledger_files, descriptor_limit())
        if max_files < settings.max_open_ledger_files:
            log.info(
                "keeping at most %d sealed-ledger files open (a quarter of the open-file limit; "
                "max_open_ledger_files is %d)",
                max_files,
                settings.max_open_ledger_files,
            )
        self.resources = LedgerResources.from_settings(settings, self._sealer, max_files)
        self._stopping = threading.Event()
        self._sweeper: threading.Thread | None = None

    # ---------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Load every topic, recovering its ledgers, and remove files no topic owns."""
        with self.db.session() as s:
            rows = s.scalars(select(models.Topic).order_by(models.Topic.id)).all()
            topics = [(r.id, TopicName(r.tenant, r.namespace, r.name)) for r in rows]
        for topic_id, name in topics:
            ml = ManagedLedger.recover(
                topic_id=topic_id,
                root=self._root(name),
                db=self.db,
                settings=self.settings,
                shared=self.resources,
            )
            self._topics[name] = ManagedTopic(name=name, topic_id=topic_id, ledger=ml)
        self._remove_orphan_dirs()
        self._sweeper = threading.Thread(
            target=self._close_idle_files, name="ledger-file-sweeper", daemon=True
        )
        self._sweeper.start()

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
        self._sealer.shutdown(wait=True)  # finish sealing what was rolled over
        with self._lock:
            for topic in self._topics.values():
                topic.ledger.close()
            self._topics.clear()
        self.resources.files.clear()

    def _root(self, name: TopicName) -> Path:
        return paths.topic_dir(self.settings.data_dir, name.tenant, name.namespace, name.topic)

    def _remove_orphan_dirs(self) -> None:
        """A topic deleted in the metadata store whose files a crash left behind."""
        base = self.settings.data_dir / "ledgers"
        if not base.is_dir():
            return
        for tenant in base.iterdir():
            for namespace in tenant.iterdir() if tenant.is_dir() else ():
                for topic in namespace.iterdir() if namespace.is_dir() else ():
                    if TopicName(tenant.name, namespace.name, topic.name) not in self._topics:
                        log.warning("removing files of deleted topic %s", topic)
                        shutil.rmtree(topic, ignore_errors=True)

    # ---------------------------------------------------------------- admin

    def create_topic(self, name: TopicName) -> ManagedTopic:
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
            root = self._root(name)
            if root.exists():  # left by a deletion that crashed before removing its files
                shutil.rmtree(root)
            ml = ManagedLedger.create(
                topic_id=topic_id, root=root, db=self.db, settings=self.settings, shared=self.resources
            )
            topic = ManagedTopic(name=name, topic_id=topic_id, ledger=ml)
            self._topics[name] = topic
            return topic

    def delete_topic(self, name: TopicName) -> None:
        """Delete a topic, its subscriptions and all its files. 409 while it compacts."""
        topic = self.topic(name)
        if not topic.admin_lock.acquire(blocking=False):
            raise Conflict(f"topic {name} is being compacted; try again when it is done")
        try:
            with self._lock:
                self._topics.pop(name, None)
            topic.ledger.close()
            with self.db.session() as s:
                s.execute(delete(models.Topic).where(models.Topic.id == topic.topic_id))
            # Files go after the commit: a crash in between leaves an orphan directory,
            # which start-up removes, never metadata pointing at missing files.
            shutil.rmtree(self._root(name), ignore_errors=True)
        finally:
            topic.admin_lock.release()

    def list_topics(self, tenant: str, namespace: str) -> list[str]:
        with self._lock:
            return sorted(str(n) for n in self._topics if n.tenant == tenant and n.namespace == namespace)

    def topic(self, name: TopicName) -> ManagedTopic:
        with self._lock:
            topic = self._topics.get(name)
        if topic is None:
            raise NotFound(f"topic {name} not found")
        return topic

    def topics(self) -> list[ManagedTopic]:
        with self._lock:
            return list(self._topics.values())

    # ---------------------------------------------------------------- data

    def produce(self, name: TopicName, records: Sequence[Record]) -> list[Position]:
        """Append a batch atomically checked: every record is valid, or none is written."""
        if not records:
            raise InvalidInput("a produce request needs at least one message")
        limit = self.settings.max_message_size
        for i, r in enumerate(records):
            size = record_size(r.key, r.value, r.properties)
            if size > limit:
                raise TooLarge(f"message {i} is {size} bytes; the limit is {limit}")
        topic = self.topic(name)
        publish_time = now_ms()
        stamped = [
            Record(
                key=r.key,
                value=r.value,
                properties=r.properties,
                publish_time=publish_time,
                event_time=r.event_time,
            )
            for r in records
        ]
        return topic.ledger.append(stamped)

    def resolve_start(self, topic: ManagedTopic, start: str) -> Position:
        """``earliest``, ``latest`` or ``"L:E"`` as a position of the topic's log."""
        if start == EARLIEST:
            # Not the oldest ledger's first entry: a compacted ledger may hold records from
            # ledgers that retention has since deleted, and reads move on past missing ids.
            return Position(0, 0)
        if start == LATEST:
            return topic.ledger.end_position()
        try:
            return Position.parse(start)
        except ValueError as e:
            raise InvalidInput(f"invalid startMessageId: {e}") from None

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

    @staticmethod
    def read_at(
        topic: ManagedTopic, pos: Position, limit: int, read_compacted: bool
    ) -> tuple[list[Entry], Position]:
        """Up to ``limit`` messages from ``pos`` inclusive, and where the next read starts."""
        while True:
            view = topic.view if read_compacted else None
            if view is None or pos > view.horizon:
                return topic.ledger.read(pos, limit)
            try:
                with view.lease():
                    out, nxt = view.ledger.read(pos, limit)
            except RetiredView:
                continue  # a compaction committed meanwhile: read its ledger instead
            if nxt is not None:
                return out, nxt
            rest, nxt_pos = topic.ledger.read(view.horizon.next(), limit - len(out))
            return out + rest, nxt_pos
