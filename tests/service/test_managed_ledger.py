"""Roll-over, sealing, reads across ledgers, and recovery from a crash at every roll-over step
(sealing ahead of the roll-over: ``test_sealing``)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ledger.entry import Position, Record
from ledger.schema import COLUMNS
from service.db import Database
from service.names import TopicName
from service.settings import Settings
from service.topics import Broker
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
