"""COMPACTOR_WAL=object through the broker: no local write-ahead file, every acknowledged
message back after a restart, chunks and objects gone once their ledgers are sealed or their
topic deleted, a fenced-off owner acknowledging nothing. On both storage backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import func, select

from ledger.entry import Record
from ledger.storage import Storage
from service import models
from service.db import Database
from service.errors import OwnershipLost
from service.ledger_info import LedgerInfo
from service.managed_ledger import ManagedLedger
from service.names import TopicName
from service.sealing import seal
from service.settings import Settings
from service.topics import Broker

NAME = TopicName("t", "ns", "objects")


@pytest.fixture
def object_settings(settings: Settings, storage: Storage) -> Settings:
    settings.wal = "object"
    settings.wal_flush_ms = 5
    settings.storage_url = storage.url
    if storage.s3 is not None:
        settings.s3_endpoint_url = storage.s3.endpoint_url or ""
        settings.s3_region = storage.s3.region or ""
    settings.max_entries_per_ledger = 10
    return settings


@pytest.fixture
def object_broker(object_settings: Settings, db: Database) -> Iterator[Broker]:
    b = Broker(settings=object_settings, db=db)
    b.start()
    yield b
    b.stop()


def records(n: int, tag: str) -> list[Record]:
    return [Record(key=f"k{i % 7}", value=f"{tag}-{i}".encode()) for i in range(n)]


def read_all(broker: Broker) -> list[bytes | None]:
    got, start = [], "earliest"
    while True:
        page, nxt = broker.read(NAME, start, 100)
        if not page:
            return got
        got += [e.value for e in page]
        start = str(nxt)


def chunks(db: Database) -> list[models.WalChunk]:
    with db.session() as s:
        return list(s.scalars(select(models.WalChunk)).all())


def test_every_acknowledged_message_is_in_objects_and_back_after_a_restart(
    object_broker: Broker, object_settings: Settings, db: Database, storage: Storage
) -> None:
    broker = object_broker
    broker.create_topic(NAME)
    sent: list[bytes] = []
    for batch in range(5):
        recs = records(7, f"b{batch}")
        broker.produce(NAME, recs)
        sent += [r.value for r in recs if r.value is not None]
    assert read_all(broker) == sent
    # No local write-ahead file: the open ledger is in objects of the storage.
    assert not list(object_settings.data_dir.rglob("*.wal"))
    broker.topic(NAME).ledger.wait_sealed()
    ledgers = broker.topic(NAME).ledger.ledgers()
    assert [i.state for i in ledgers] == ["CLOSED"] * 3 + ["OPEN"]
    open_id = ledgers[-1].ledger_id
    # Sealed ledgers' chunks are gone, and so is every object only they needed.
    assert {c.ledger_id for c in chunks(db)} == {open_id}
    assert {f.key for f in storage.list("wal")} == {c.object_key for c in chunks(db)}

    broker.stop()
    again = Broker(settings=object_settings, db=db)
    again.start()
    try:
        assert read_all(again) == sent
        again.produce(NAME, records(2, "after"))
        assert read_all(again)[-2:] == [b"after-0", b"after-1"]
    finally:
        again.stop()


def test_a_deleted_topic_leaves_no_write_ahead_object_nor_chunk(
    object_broker: Broker, db: Database, storage: Storage
) -> None:
    object_broker.create_topic(NAME)
    object_broker.produce(NAME, records(25, "x"))
    assert storage.list("wal")
    object_broker.delete_topic(NAME)
    assert chunks(db) == []
    assert storage.list("wal") == []


def test_the_sweep_removes_objects_no_open_ledger_needs(
    object_broker: Broker, db: Database, storage: Storage
) -> None:
    object_broker.create_topic(NAME)
    object_broker.produce(NAME, records(3, "x"))
    needed = {f.key for f in storage.list("wal")}
    # A dead process's flush that never committed, one of this process's that failed (a
    # sequence before the last flush that is over), and one of its flushes under way.
    storage.put("wal/i0-0123456789ab/0000000000000001.wal", b"never recorded")
    committer = object_broker.object_wal.committer  # type: ignore[union-attr]
    storage.put(committer.key(0), b"failed to commit")
    under_way = committer.key(committer.completed + 1000)
    storage.put(under_way, b"not committed yet")
    assert object_broker.sweep_write_ahead(force=True) == 2
    assert {f.key for f in storage.list("wal")} == needed | {under_way}
    assert read_all(object_broker) == [b"x-0", b"x-1", b"x-2"]


def test_an_owner_fenced_off_acknowledges_nothing_and_cannot_replace_what_the_next_owner_sealed(
    object_broker: Broker, object_settings: Settings, db: Database, storage: Storage
) -> None:
    """The fence runs in the flush's transaction: once the lease moved, no chunk of the old
    owner is recorded, so the new owner's recovery and the old owner's acknowledgements agree.
    And the new owner seals the old owner's ledger under a name of its own epoch: the old
    owner's late sealing of it publishes nothing and replaces nothing."""
    topic = object_broker.create_topic(NAME)
    assert topic is not None
    topic_id = topic.topic_id
    object_broker.stop()
    holder = [1]  # the epoch that holds the topic

    def fence_of(epoch: int) -> Callable[[object], None]:
        def fence(session: object) -> None:
            if holder[0] != epoch:
                raise OwnershipLost(f"this instance no longer owns topic {topic_id} (epoch {epoch})")

        return fence

    broker = Broker(settings=object_settings, db=db)
    assert broker.object_wal is not None
    broker.object_wal.start()
    store = broker.storage.at("ledgers/t/ns/objects")

    def open_ledger(epoch: int) -> ManagedLedger:
        return ManagedLedger.recover(
            topic_id=topic_id,
            root=object_settings.data_dir / "unused",
            db=db,
            settings=object_settings,
            shared=broker.resources,
            epoch=epoch,
            fence=fence_of(epoch),
            store=store,
        )

    try:
        old = open_ledger(epoch=1)
        acked = old.append(records(4, "old"))
        holder[0] = 2
        with pytest.raises(OwnershipLost):
            old.append(records(3, "late"))
        with db.session() as s:
            assert s.scalar(select(func.sum(models.WalChunk.entries))) == len(acked) == 4
        new = open_ledger(epoch=2)  # seals the old owner's ledger from its chunks
        sealed = next(i for i in new.ledgers() if i.ledger_id == acked[0].ledger_id)
        assert (sealed.state, sealed.entries, sealed.sealed_epoch) == ("CLOSED", 4, 2)
        published = new.sealed_file(sealed.ledger_id)
        assert published.name.endswith(".e2.parquet")
        before = published.read_bytes()

        # The old owner, unaware, seals its ledger late (with what it holds).
        old_wal = old._wal
        stale = LedgerInfo(sealed.ledger_id, "OPEN", 0, 0, 0, sealed.created_at, epoch=1)
        with pytest.raises(OwnershipLost):
            seal(db, store, stale, old_wal, old_wal.read_all(), fence=fence_of(1), epoch=1)
        assert published.read_bytes() == before
        got, _ = new.read(acked[0], 100)
        assert [e.value for e in got] == [f"old-{i}".encode() for i in range(4)]
        # Its file is an orphan, which the next scrub's sweep removes.
        assert new.sweep_stale_sealed_files() == 1
        published_names = {new.sealed_file(i.ledger_id).name for i in new.ledgers() if i.state == "CLOSED"}
        assert published.name in published_names
        assert {f.name for f in store.files() if f.name.endswith(".parquet")} == published_names
        old.close()
        new.close()
    finally:
        broker.stop()
