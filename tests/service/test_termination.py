"""Topic termination in the service: no write after it, the last id answered (the same again),
reads go on, and the state is the metadata's (a restart, another owner, keeps it)."""

from __future__ import annotations

import pytest

from ledger.entry import Position, Record
from service.db import Database
from service.errors import TopicTerminated
from service.names import TopicName
from service.settings import Settings
from service.topics import Broker

NAME = TopicName("t", "ns", "ended")


def test_an_empty_topic_terminates_at_entry_minus_one_and_refuses_writes(broker: Broker) -> None:
    broker.create_topic(NAME)
    last = broker.terminate(NAME)
    assert last.entry_id == -1 and last.ledger_id > 0
    with pytest.raises(TopicTerminated):
        broker.produce(NAME, [Record(key="k", value=b"v")])
    assert broker.terminate(NAME) == last  # again: the same id, as Pulsar answers


def test_terminate_answers_the_last_id_keeps_reads_and_survives_a_restart(
    settings: Settings, db: Database
) -> None:
    settings.max_entries_per_ledger = 2  # the last id in a later ledger than the first
    broker = Broker(settings=settings, db=db)
    broker.start()
    try:
        broker.create_topic(NAME)
        ids = broker.produce(NAME, [Record(key=f"k{i}", value=b"v") for i in range(5)])
        last = broker.terminate(NAME)
        assert last == ids[-1]
        with pytest.raises(TopicTerminated):
            broker.produce(NAME, [Record(key="late", value=b"v")])
        entries, _ = broker.read(NAME, "earliest", 100)
        assert [e.position for e in entries] == ids
    finally:
        broker.stop()
    again = Broker(settings=settings, db=db)
    again.start()
    try:
        assert again.topic(NAME).ledger.terminated == last
        with pytest.raises(TopicTerminated):
            again.produce(NAME, [Record(key="after-restart", value=b"v")])
        assert again.terminate(NAME) == last
        entries, _ = again.read(NAME, "earliest", 100)
        assert len(entries) == 5
    finally:
        again.stop()


def test_other_topics_still_take_writes(broker: Broker) -> None:
    other = TopicName("t", "ns", "still-open")
    broker.create_topic(NAME)
    broker.create_topic(other)
    broker.terminate(NAME)
    assert broker.produce(other, [Record(key="k", value=b"v")])[0] >= Position(0, 0)
