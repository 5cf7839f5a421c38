"""Sealing ahead of the roll-over (``service.sealing``): an open ledger's whole row groups
written to its sealed file while it is open, a crash with a ledger written ahead, writing ahead
that fails, and whole batches that row groups end inside."""

from __future__ import annotations

import time

import pyarrow.parquet as pq
import pytest

from ledger.entry import Position, Record
from ledger.parquet_store import ROW_GROUP_SIZE
from service.db import Database
from service.settings import Settings
from service.topics import Broker
from tests.batches import batch
from tests.conftest import local_wal_only
from tests.service.test_managed_ledger import NAME, read_everything, records


def drain_sealer(broker: Broker) -> None:
    """Wait until no write ahead of sealing is queued or running: each one queues the next
    when it ends, so wait for the queue until none is in flight."""
    ml = broker.topic(NAME).ledger
    deadline = time.monotonic() + 60
    while True:
        ml._sealer.submit(lambda: None).result(timeout=60)
        with ml._lock:
            if not ml._presealing:
                return
        assert time.monotonic() < deadline, "writing ahead of sealing never ended"
        time.sleep(0.01)


def produce_many(broker: Broker, n: int, prefix: str) -> list[Position]:
    ids: list[Position] = []
    for start in range(0, n, 1000):
        ids += broker.produce(NAME, records(min(1000, n - start), prefix=f"{prefix}{start}-", size=20))
    return ids


def test_an_open_ledger_is_written_ahead_by_row_group_and_seals_to_every_message(
    settings: Settings, broker: Broker
) -> None:
    settings.max_entries_per_ledger = 2 * ROW_GROUP_SIZE + 100
    broker.create_topic(NAME)
    ids = produce_many(broker, 2 * ROW_GROUP_SIZE + 50, "a")
    drain_sealer(broker)
    ml = broker.topic(NAME).ledger
    [open_ledger] = ml.ledgers()
    root = ml.root
    tmp = root / f"{open_ledger.ledger_id:020d}.parquet.tmp"
    # While the ledger is open, its first two row groups are already in its (temporary) file
    # and no longer held in memory; it is not under the sealed name yet.
    assert open_ledger.state == "OPEN" and tmp.stat().st_size > 0
    assert not (root / f"{open_ledger.ledger_id:020d}.parquet").exists()
    assert ml._cache is not None and len(ml._cache) == 50

    ids += produce_many(broker, 50, "b")  # fills the ledger: it rolls over and is sealed
    ml.wait_sealed()
    sealed = root / f"{open_ledger.ledger_id:020d}.parquet"
    assert not tmp.exists() and ml.ledgers()[0].state == "CLOSED"
    meta = pq.ParquetFile(sealed).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [ROW_GROUP_SIZE] * 2 + [100]
    table = pq.read_table(sealed)
    assert table.column("entry_id").to_pylist() == list(range(2 * ROW_GROUP_SIZE + 100))
    got = read_everything(broker, 5000)
    assert [e.position for e in got] == ids
    assert [e.key for e in got] == table.column("key").to_pylist()
    assert [e.value for e in got] == table.column("value").to_pylist()


def test_a_crash_with_a_ledger_written_ahead_loses_nothing(settings: Settings, db: Database) -> None:
    settings.max_entries_per_ledger = ROW_GROUP_SIZE + 100
    broker = Broker(settings=settings, db=db)
    broker.start()
    broker.create_topic(NAME)
    ids = produce_many(broker, ROW_GROUP_SIZE + 10, "a")
    drain_sealer(broker)
    ml = broker.topic(NAME).ledger
    tmp = ml.root / f"{ml.ledgers()[0].ledger_id:020d}.parquet.tmp"
    assert tmp.exists()
    ml._closed = True  # the process dies: nothing is closed cleanly, the temporary file stays
    b2 = Broker(settings=settings, db=db)
    b2.start()
    assert [e.position for e in read_everything(b2, 3000)] == ids
    ids += b2.produce(NAME, records(90, prefix="after"))  # fills it: sealed from its write-ahead file
    b2.topic(NAME).ledger.wait_sealed()
    assert not tmp.exists()
    assert [e.position for e in read_everything(b2, 3000)] == ids
    sealed = pq.read_table(b2.topic(NAME).ledger.root / f"{ids[0].ledger_id:020d}.parquet")
    assert sealed.column("entry_id").to_pylist() == list(range(ROW_GROUP_SIZE + 100))
    b2.stop()


@local_wal_only("makes the sealed file's staging path in the topic's local directory unwritable")
def test_writing_ahead_that_fails_leaves_the_sealing_to_the_roll_over(
    settings: Settings, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    n = 2 * ROW_GROUP_SIZE + 100
    settings.max_entries_per_ledger = n
    broker.create_topic(NAME)
    ml = broker.topic(NAME).ledger
    tmp = ml.root / f"{ml.ledgers()[0].ledger_id:020d}.parquet.tmp"
    tmp.mkdir()  # the temporary file cannot be written
    ids = produce_many(broker, ROW_GROUP_SIZE + 10, "a")
    drain_sealer(broker)
    tmp.rmdir()
    ids += produce_many(broker, ROW_GROUP_SIZE, "b")  # a second row group: not tried again
    drain_sealer(broker)
    assert caplog.text.count("ahead of its sealing failed") == 1
    assert not tmp.exists()
    ids += broker.produce(NAME, records(90, prefix="last"))  # fills the ledger: rolls over
    ml.wait_sealed()
    assert ml.ledgers()[0].state == "CLOSED"
    sealed = pq.read_table(ml.root / f"{ids[0].ledger_id:020d}.parquet")
    assert sealed.num_rows == n and len(ids) == n
    assert sealed.column("key").to_pylist() == [e.key for e in read_everything(broker, 5000)]


def test_whole_batches_are_written_ahead_by_row_group_and_seal_to_every_member(
    settings: Settings, broker: Broker
) -> None:
    """Batches of 999 members (row groups end inside them) are written ahead and sealed to
    exactly the rows of their members, in row groups of the usual size."""
    settings.max_entries_per_ledger = 2 * ROW_GROUP_SIZE + 500
    broker.create_topic(NAME)
    ids: list[Position] = []
    members: list[Record] = []
    while len(members) < 2 * ROW_GROUP_SIZE + 500:
        stored, records_ = batch(999, first_seq=len(members), tag=f"b{len(ids)}")
        ids += broker.produce(NAME, [stored])
        members += records_
    ml = broker.topic(NAME).ledger
    ml.wait_sealed()
    first_ledger = ml.ledgers()[0]
    assert first_ledger.state == "CLOSED"
    # One id per batch: its first member's entry, consecutive batches 999 entries apart.
    assert ids[:3] == [Position(first_ledger.ledger_id, 999 * i) for i in range(3)]
    sealed = ml.root / f"{first_ledger.ledger_id:020d}.parquet"
    meta = pq.ParquetFile(sealed).metadata
    rows = first_ledger.entries
    assert rows == 999 * 17  # the batch that passed the entry limit is not split
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [ROW_GROUP_SIZE] * 2 + [
        rows - 2 * ROW_GROUP_SIZE
    ]
    table = pq.read_table(sealed)
    assert table.column("entry_id").to_pylist() == list(range(rows))
    assert table.column("key").to_pylist() == [m.key for m in members[:rows]]
    assert table.column("value").to_pylist() == [m.value for m in members[:rows]]
    assert table.column("batch_index").to_pylist() == [i % 999 for i in range(rows)]
    got = read_everything(broker, 4000)
    assert [(e.key, e.value, e.properties) for e in got] == [(m.key, m.value, m.properties) for m in members]
