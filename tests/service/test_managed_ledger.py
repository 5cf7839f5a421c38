"""Roll-over, sealing, reads across ledgers, and recovery from a crash at every roll-over step."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ledger.entry import Position, Record
from ledger.parquet_store import ROW_GROUP_SIZE
from ledger.schema import COLUMNS
from service.db import Database
from service.names import TopicName
from service.settings import Settings
from service.topics import Broker
from tests.batches import batch
from tests.conftest import local_wal_only

NAME = TopicName("t", "ns", "log")


def records(n: int, prefix: str = "k", size: int = 3) -> list[Record]:
    return [Record(key=f"{prefix}{i}", value=(f"{i}".encode() * size)[:size] or b"x") for i in range(n)]


def read_everything(broker: Broker, page: int) -> list:
    out, start = [], "earliest"
    while True:
        got, nxt = broker.read(NAME, start, page)
        if not got:
            return out
        out.extend(got)
        start = str(nxt)


def restart(broker: Broker, settings: Settings, db: Database) -> Broker:
    broker.stop()
    b = Broker(settings=settings, db=db)
    b.start()
    return b


@pytest.fixture
def small(settings: Settings) -> Settings:
    settings.max_entries_per_ledger = 10
    return settings


def test_roll_over_by_entries_makes_sealed_parquet_ledgers_and_reads_are_seamless(
    small, broker: Broker
) -> None:
    broker.create_topic(NAME)
    ids: list[Position] = []
    for _ in range(7):
        ids += broker.produce(NAME, records(6))
    broker.topic(NAME).ledger.wait_sealed()
    ledgers = broker.topic(NAME).ledger.ledgers()
    assert [i.entries for i in ledgers] == [10, 10, 10, 10, 2]
    assert [i.state for i in ledgers] == ["CLOSED"] * 4 + ["OPEN"]
    assert [p.ledger_id for p in ids] == sorted(p.ledger_id for p in ids)
    assert ids == sorted(ids) and len(set(ids)) == 42

    root = broker.topic(NAME).ledger.root
    sealed = sorted(root.glob("*.parquet"))
    assert len(sealed) == 4 and not list(root.glob("*.wal"))[1:]
    table = pq.read_table(sealed[0])
    assert tuple(table.column_names) == COLUMNS
    assert table.column("entry_id").to_pylist() == list(range(10))

    for page in (1, 3, 10, 11, 100):
        got = read_everything(broker, page)
        assert [e.position for e in got] == ids
    # Starting in the middle of a ledger and at a ledger's end both continue seamlessly.
    got, _ = broker.read(NAME, str(ids[9]), 3)
    assert [e.position for e in got] == ids[9:12]
    got, _ = broker.read(NAME, f"{ids[0].ledger_id}:10", 2)
    assert [e.position for e in got] == ids[10:12]


def test_a_batch_larger_than_a_ledger_is_split_across_ledgers(small, broker: Broker) -> None:
    broker.create_topic(NAME)
    ids = broker.produce(NAME, records(25))
    assert [p.entry_id for p in ids] == list(range(10)) * 2 + list(range(5))
    assert [e.key for e in read_everything(broker, 7)] == [f"k{i}" for i in range(25)]


def test_roll_over_by_size_and_by_age(settings: Settings, broker: Broker) -> None:
    settings.max_ledger_size_bytes = 100
    broker.create_topic(NAME)
    broker.produce(NAME, [Record(key="a", value=b"x" * 60)])
    broker.produce(NAME, [Record(key="b", value=b"x" * 60)])  # crosses 100 bytes: rolls after it
    broker.produce(NAME, [Record(key="c", value=b"x")])
    broker.topic(NAME).ledger.wait_sealed()
    assert [i.entries for i in broker.topic(NAME).ledger.ledgers()] == [2, 1]

    settings.max_ledger_size_bytes = 10**9
    settings.max_ledger_age_ms = 50
    time.sleep(0.08)
    broker.produce(NAME, [Record(key="d", value=b"x")])  # the open ledger is too old: rolls first
    broker.topic(NAME).ledger.wait_sealed()
    assert [i.entries for i in broker.topic(NAME).ledger.ledgers()] == [2, 1, 1]
    assert [e.key for e in read_everything(broker, 10)] == ["a", "b", "c", "d"]


def test_messages_survive_restart_including_the_open_ledger(small, broker: Broker, db: Database) -> None:
    broker.create_topic(NAME)
    ids = broker.produce(NAME, records(23))
    broker = restart(broker, small, db)
    assert [e.position for e in read_everything(broker, 5)] == ids
    more = broker.produce(NAME, records(3, prefix="x"))
    assert more[0] == Position(ids[-1].ledger_id, ids[-1].entry_id + 1)
    broker.stop()


@pytest.mark.parametrize("point", ["sealed", "committed"])
def test_crash_during_roll_over_recovers_every_message(small, settings, db: Database, point: str) -> None:
    broker = Broker(settings=settings, db=db)
    broker.start()
    broker.create_topic(NAME)
    ids = broker.produce(NAME, records(9))

    class Crash(Exception):
        pass

    def crash(at: str) -> None:
        if at == point:
            raise Crash(at)

    ml = broker.topic(NAME).ledger
    ml.fault_hook = crash
    ids += broker.produce(NAME, records(1, prefix="last"))  # fills the ledger: it rolls over
    # Sealing runs in the background: the producer was answered, the sealing "dies" at the point.
    with pytest.raises(RuntimeError, match="could not be sealed"):
        ml.wait_sealed(timeout=30)
    # The readers still see every message, from the write-ahead file.
    assert [e.position for e in read_everything(broker, 4)] == ids
    # The process "dies" here: nothing is closed cleanly (and a dead process retries no
    # sealing in the background). A new broker recovers the files.
    ml._closed = True
    b2 = Broker(settings=settings, db=db)
    b2.start()
    got = read_everything(b2, 4)
    assert [e.key for e in got] == [f"k{i}" for i in range(9)] + ["last0"]
    assert [e.position for e in got] == ids
    root: Path = b2.topic(NAME).ledger.root
    ledgers = b2.topic(NAME).ledger.ledgers()
    assert [i.state for i in ledgers] == ["CLOSED", "OPEN"]
    # Sealed at start-up either way, and its write-ahead file is gone.
    assert not (root / f"{ledgers[0].ledger_id:020d}.wal").exists()
    assert (root / f"{ledgers[0].ledger_id:020d}.parquet").exists()
    b2.produce(NAME, records(15, prefix="after"))
    assert len(read_everything(b2, 6)) == 25
    b2.stop()


@local_wal_only("a torn tail of a local write-ahead file")
def test_torn_wal_tail_is_truncated_and_quarantined_on_start(broker: Broker, settings, db) -> None:
    broker.create_topic(NAME)
    broker.produce(NAME, records(5))
    root = broker.topic(NAME).ledger.root
    broker.stop()
    wal = next(root.glob("*.wal"))
    data = wal.read_bytes()
    wal.write_bytes(data[:-3])  # the last record is torn
    b2 = Broker(settings=settings, db=db)
    b2.start()
    assert [e.key for e in read_everything(b2, 10)] == ["k0", "k1", "k2", "k3"]
    quarantine = list(root.glob("*quarantine*"))
    assert len(quarantine) == 1 and data[:-3].endswith(quarantine[0].read_bytes())
    b2.produce(NAME, records(1, prefix="z"))
    assert [e.key for e in read_everything(b2, 10)][-1] == "z0"
    b2.stop()


# ---------------------------------------------------------------- sealing ahead of the roll-over


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


def test_a_waiter_without_a_thread_is_called_once_an_entry_follows_its_position(broker: Broker) -> None:
    name = TopicName("t", "ns", "watched")
    broker.create_topic(name)
    ledger = broker.topic(name).ledger
    calls: list[str] = []
    first = broker.produce(name, records(1))[0]
    ledger.on_entry_after(Position(-1, -1), lambda: calls.append("at once"))  # an entry is there
    assert calls == ["at once"]
    ledger.on_entry_after(first, lambda: calls.append("next"))
    cancel = ledger.on_entry_after(first, lambda: calls.append("cancelled"))
    cancel()
    assert calls == ["at once"]  # nothing after ``first`` yet
    second = broker.produce(name, records(2))[-1]
    assert calls == ["at once", "next"]  # once, for a produce of two
    broker.produce(name, records(1))
    assert calls == ["at once", "next"]
    ledger.on_entry_after(Position(second.ledger_id, second.entry_id + 5), lambda: calls.append("closed"))
    ledger.close()
    assert calls == ["at once", "next", "closed"]  # closing wakes every waiter


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
