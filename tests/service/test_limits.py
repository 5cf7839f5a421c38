"""Bounds on descriptors and memory (issue 15): the seal backlog holds producers back and refuses
them with nothing written, sealed ledgers are read through a bounded LRU of open files, and a
consumer's pending deliveries are bounded."""

from __future__ import annotations

import os
import threading
import time

import pytest

from ledger.entry import Record
from service.errors import SealBacklogFull
from service.names import TopicName
from service.seal_backlog import SealBacklog
from service.settings import Settings
from service.topics import Broker

NAME = TopicName("t", "ns", "limits")


def records(n: int, prefix: str = "k") -> list[Record]:
    return [Record(key=f"{prefix}{i}", value=f"{prefix}{i}".encode()) for i in range(n)]


def read_everything(broker: Broker, page: int = 7) -> list:
    out, start = [], "earliest"
    while True:
        got, nxt = broker.read(NAME, start, page)
        if not got:
            return out
        out.extend(got)
        start = str(nxt)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ------------------------------------------------------------------ the backlog itself


def test_reserve_waits_for_room_and_refuses_when_none_comes() -> None:
    backlog = SealBacklog(per_topic=2, total=3, cache_bytes=100)
    assert backlog.reserve(1, 2, timeout=0) == 2
    with pytest.raises(SealBacklogFull, match="1 of this topic|2 of this topic"):
        backlog.reserve(1, 1, timeout=0.05)
    assert backlog.reserve(2, 1, timeout=0) == 1  # the total (3) is reached now
    with pytest.raises(SealBacklogFull):
        backlog.reserve(3, 1, timeout=0)
    assert backlog.stats().refused == 2 and backlog.last_refused is not None
    threading.Timer(0.05, backlog.release, args=(1,)).start()
    assert backlog.reserve(1, 1, timeout=5) == 1  # woken by the release
    backlog.forget(1)
    assert backlog.stats().pending == 1 and backlog.pending(2) == 1
    backlog.release(1, 5)  # a forgotten topic's late release counts nothing
    assert backlog.stats().pending == 1


def test_seal_cache_budget() -> None:
    backlog = SealBacklog(per_topic=1, total=1, cache_bytes=100)
    assert backlog.charge_cache(60)
    assert not backlog.charge_cache(41)
    backlog.refund_cache(60)
    assert backlog.charge_cache(100)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Settings(max_pending_seals_per_topic=10, max_pending_seals=5)


# ------------------------------------------------------------------ the managed ledger


@pytest.fixture
def tight(settings: Settings) -> Settings:
    settings.max_entries_per_ledger = 10
    settings.max_pending_seals_per_topic = 2
    settings.max_pending_seals = 4
    settings.seal_wait_ms = 100
    return settings


def test_a_produce_waits_for_the_seal_backlog_then_is_refused_with_nothing_written(
    tight: Settings, broker: Broker
) -> None:
    broker.create_topic(NAME)
    ml = broker.topic(NAME).ledger
    stalled, entered = threading.Event(), threading.Event()

    def stall(point: str) -> None:  # the sealer stops before its commit, as a slow disk would
        if point == "sealed":
            entered.set()
            stalled.wait(30)

    ml.fault_hook = stall
    ids = broker.produce(NAME, records(20))  # two ledgers full: two pending seals
    assert entered.wait(10)
    before = ml.end_position()
    t0 = time.monotonic()
    with pytest.raises(SealBacklogFull):
        broker.produce(NAME, records(10, prefix="x"))  # would fill a third
    assert time.monotonic() - t0 >= 0.09  # it waited for room first
    assert ml.end_position() == before  # nothing of it was written
    ids += broker.produce(NAME, records(3, prefix="y"))  # fills nothing: no room needed
    # Room comes while a produce waits: it goes through.
    threading.Timer(0.05, stalled.set).start()
    broker.settings.seal_wait_ms = 10_000
    ids += broker.produce(NAME, records(30, prefix="z"))
    ml.fault_hook = None
    ml.wait_sealed(timeout=30)
    assert [e.position for e in read_everything(broker)] == ids
    assert broker.resources.backlog.stats().pending == 0


def test_sealed_ledgers_are_read_through_a_bounded_set_of_open_files(settings: Settings, db) -> None:
    settings.max_entries_per_ledger = 5
    settings.max_open_ledger_files = 4
    broker = Broker(settings=settings, db=db)
    broker.start()
    try:
        broker.create_topic(NAME)
        ids = []
        for _ in range(12):
            ids += broker.produce(NAME, records(10))
        broker.topic(NAME).ledger.wait_sealed()
        before = open_fds()
        for _ in range(3):
            assert [e.position for e in read_everything(broker, page=3)] == ids
        st = broker.resources.files.stats()
        assert st.open <= 4 and st.evictions >= 20
        assert open_fds() <= before + 4  # 24 sealed ledgers read three times
    finally:
        broker.stop()
    assert len(broker.resources.files) == 0


def test_a_failed_sealing_is_retried_in_the_background(tight: Settings, broker: Broker) -> None:
    broker.create_topic(NAME)
    ml = broker.topic(NAME).ledger
    failures = []

    def fail_twice(point: str) -> None:
        if point == "sealed" and len(failures) < 2:
            failures.append(point)
            raise OSError(24, "Too many open files")

    ml.fault_hook = fail_twice
    ids = broker.produce(NAME, records(10))
    deadline = time.monotonic() + 20
    while ml.ledgers()[0].state != "CLOSED" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ml.ledgers()[0].state == "CLOSED" and len(failures) == 2 and ml.seal_failures == 0
    assert broker.resources.exhaustion.count == 2
    assert [e.position for e in read_everything(broker)] == ids


def test_a_consumer_holds_at_most_max_unacked_messages(settings: Settings, broker: Broker) -> None:
    from service.subscription_service import SubscriptionService

    settings.max_unacked_messages_per_consumer = 5
    subs = SubscriptionService(broker=broker)
    broker.create_topic(NAME)
    broker.produce(NAME, records(12))
    subs.create(NAME, "s", initial_position="earliest")
    c = subs.attach(NAME, "s")
    first = subs.receive(NAME, "s", c.consumer_id, max_messages=100)
    assert len(first) == 5
    assert len(subs.receive(NAME, "s", c.consumer_id, max_messages=100)) == 0  # blocked until acks
    subs.ack(NAME, "s", c.consumer_id, [first[-1].entry.position], cumulative=True)
    assert len(subs.receive(NAME, "s", c.consumer_id, max_messages=100)) == 5
