"""Pulsar's deduplication state, built from what a topic stores: sealed ledgers' columns, the
open ledger's entries, and nothing from ledgers written before producers were kept."""

from __future__ import annotations

import pyarrow.parquet as pq

from ledger.entry import Record
from ledger.paths import sealed_path
from ledger.schema import FIRST_COLUMNS
from service import deduplication
from service.names import TopicName
from service.topics import Broker

NAME = TopicName.parse("persistent://public/default/dedup")


def sent(producer: str | None, sequence_id: int | None) -> Record:
    return Record(key="k", value=b"v", producer_name=producer, sequence_id=sequence_id)


def test_the_state_comes_from_sealed_and_open_ledgers_alike(broker: Broker) -> None:
    broker.settings.max_entries_per_ledger = 4
    broker.create_topic(NAME)
    # 10 messages over three ledgers: two sealed, one open; REST's (no producer) in between.
    records = [sent("a", i) for i in range(5)] + [sent(None, None), sent("b", 7), sent("a", 5), sent("b", 9)]
    records.append(sent("b", 8))  # out of order: the highest counts, not the last
    for r in records:
        broker.produce(NAME, [r])
    ledger = broker.topic(NAME).ledger
    ledger.wait_sealed()
    states = [info.state for info in ledger.ledgers()]
    assert states.count("CLOSED") >= 2 and states[-1] == "OPEN"
    state = deduplication.load(ledger)
    assert (state.last("a"), state.last("b"), state.last("c")) == (5, 9, -1)
    # The broker builds it once per topic and keeps it as producers write.
    kept = broker.producer_sequences(NAME)
    assert broker.producer_sequences(NAME) is kept and kept.last("a") == 5
    kept.stored("a", [6, 8, 7])
    assert kept.last("a") == 8


def test_a_sealed_ledger_from_before_producers_were_kept_counts_for_nothing(broker: Broker) -> None:
    broker.settings.max_entries_per_ledger = 2
    broker.create_topic(NAME)
    for i in range(2):
        broker.produce(NAME, [sent("a", i)])
    ledger = broker.topic(NAME).ledger
    ledger.wait_sealed()
    first = ledger.ledgers()[0]
    path = sealed_path(ledger.root, first.ledger_id)
    # Rewritten as a file of the earlier format would be: without the producer columns.
    pq.write_table(pq.read_table(path).select(list(FIRST_COLUMNS)), path)
    assert deduplication.load(ledger).last("a") == -1
