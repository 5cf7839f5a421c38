"""Exclusive and Failover subscriptions deliver the log's stored batches whole (``receive(whole=
True)``, what Pulsar consumers get), one pending key per batch, and keep every guarantee of the
member-by-member path: acknowledged members never come back, redeliveries are counted, the
mark-delete position moves as acknowledgements allow."""

from __future__ import annotations

import pytest

from ledger.entry import BatchEntry, Entry, LedgerItem, Position, Record
from service.db import Database
from service.names import TopicName
from service.settings import Settings
from service.subscription_service import SubscriptionService
from service.topics import Broker
from tests.batches import batch

NAME = TopicName("t", "ns", "batched")


@pytest.fixture
def subs(broker: Broker) -> SubscriptionService:
    broker.settings.max_entries_per_ledger = 12
    broker.create_topic(NAME)
    svc = SubscriptionService(broker=broker)
    svc.start()
    return svc


def produce_batches(broker: Broker, *sizes: int) -> list[list[Position]]:
    """Batches of ``sizes`` members; each batch's member positions."""
    out = []
    for i, n in enumerate(sizes):
        stored, _ = batch(n, first_seq=100 * i, tag=f"b{i}")
        (first,) = broker.produce(NAME, [stored])
        out.append([Position(first.ledger_id, first.entry_id + j) for j in range(n)])
    return out


def members(items: list[LedgerItem]) -> list[Position]:
    out: list[Position] = []
    for item in items:
        if isinstance(item, BatchEntry):
            out += [Position(item.ledger_id, item.entry_id + j) for j in range(item.batch.count)]
        else:
            out.append(item.position)
    return out


def receive(subs: SubscriptionService, cid: str, n: int = 1000) -> list[LedgerItem]:
    return list(subs.receive(NAME, "s", cid, max_messages=n, whole=True).entries)


def attach(subs: SubscriptionService) -> str:
    subs.create(NAME, "s", initial_position="earliest")
    return subs.attach(NAME, "s").consumer_id


def test_batches_are_delivered_whole_from_the_open_ledger(broker, subs) -> None:
    produced = produce_batches(broker, 4, 3)
    cid = attach(subs)
    items = receive(subs, cid)
    assert [type(i) for i in items] == [BatchEntry, BatchEntry]
    assert members(items) == produced[0] + produced[1]
    st = subs.get(NAME, "s")
    assert len(st.pending) == 2 and st.unacked() == 7
    # The same messages, as the member-by-member read gives them.
    stored = broker.topic(NAME).ledger.read(Position(produced[0][0].ledger_id, 0), 100)[0]
    assert [e.position for e in stored] == members(items)


def test_whole_and_member_reads_cover_every_ledger_in_order(broker, subs) -> None:
    produced = produce_batches(broker, 5, 5, 5, 5, 5)  # 12 entries a ledger: several roll over
    broker.produce(NAME, [Record(key="alone", value=b"x")])
    broker.topic(NAME).ledger.wait_sealed()
    cid = attach(subs)
    got: list[LedgerItem] = []
    while items := receive(subs, cid, 3):
        got += items
    want = [p for b in produced for p in b]
    assert members(got)[: len(want)] == want and len(members(got)) == len(want) + 1
    assert isinstance(got[-1], Entry) and got[-1].key == "alone"
    assert subs.get(NAME, "s").unacked() == len(want) + 1


def test_acking_a_whole_batch_moves_the_mark_delete_position_past_it(broker, subs) -> None:
    produced = produce_batches(broker, 4, 3)
    cid = attach(subs)
    items = receive(subs, cid)
    st = subs.get(NAME, "s")
    subs.ack(NAME, "s", cid, [], cumulative=False, batches=[(items[0].position, 4)])
    assert st.mark_delete == produced[0][-1] and st.acked == set() and st.unacked() == 3
    subs.ack(NAME, "s", cid, [], cumulative=False, batches=[(items[1].position, 3)])
    assert st.mark_delete == produced[1][-1] and st.unacked() == 0
    assert subs.backlog(st)[0] == 0


def test_a_batch_acked_before_an_older_one_waits_for_it(broker, subs) -> None:
    produced = produce_batches(broker, 4, 3)
    cid = attach(subs)
    items = receive(subs, cid)
    st = subs.get(NAME, "s")
    subs.ack(NAME, "s", cid, [], cumulative=False, batches=[(items[1].position, 3)])
    assert st.mark_delete == Position(-1, -1) and st.acked == set(produced[1]) and st.unacked() == 4
    subs.redeliver(NAME, "s", cid)
    again = receive(subs, cid)
    # Only the unacknowledged batch comes back, member by member, counted as a redelivery.
    assert members(again) == produced[0] and all(isinstance(i, Entry) for i in again)
    assert subs.receive(NAME, "s", cid, max_messages=1, whole=True).entries == []
    subs.ack(NAME, "s", cid, produced[0], cumulative=False)
    assert st.mark_delete == produced[1][-1] and st.acked == set()


def test_members_acked_one_by_one_consume_their_batch(broker, subs) -> None:
    produced = produce_batches(broker, 4)
    cid = attach(subs)
    receive(subs, cid)
    st = subs.get(NAME, "s")
    subs.ack(NAME, "s", cid, produced[0][1:3], cumulative=False)
    assert st.mark_delete == Position(-1, -1) and st.unacked() == 4  # the batch is still held
    subs.ack(NAME, "s", cid, [produced[0][0], produced[0][1], produced[0][3]], cumulative=False)
    assert st.mark_delete == produced[0][-1] and st.unacked() == 0 and not st.pending


def test_members_acked_again_count_once(broker, subs) -> None:
    # A client's batch-index ack names every member acknowledged so far, each time.
    produced = produce_batches(broker, 4)
    cid = attach(subs)
    receive(subs, cid)
    st = subs.get(NAME, "s")
    subs.ack(NAME, "s", cid, produced[0][:2], cumulative=False)
    subs.ack(NAME, "s", cid, produced[0][:2], cumulative=False)
    assert st.unacked() == 4 and st.mark_delete == Position(-1, -1)
    subs.redeliver(NAME, "s", cid)
    again = subs.receive(NAME, "s", cid, max_messages=100, whole=True)
    assert members(list(again.entries)) == produced[0][2:]
    subs.ack(NAME, "s", cid, produced[0], cumulative=False)
    assert st.mark_delete == produced[0][-1] and st.unacked() == 0


def test_a_cumulative_ack_inside_a_batch_keeps_the_rest_pending(broker, subs) -> None:
    produced = produce_batches(broker, 5, 2)
    cid = attach(subs)
    receive(subs, cid)
    st = subs.get(NAME, "s")
    subs.ack(NAME, "s", cid, [produced[0][2]], cumulative=True)
    assert st.mark_delete == produced[0][2] and st.unacked() == 4
    subs.redeliver(NAME, "s", cid)
    again = subs.receive(NAME, "s", cid, max_messages=100, whole=True)
    assert members(list(again.entries)) == produced[0][3:] + produced[1]
    assert again.redelivery_counts == [1] * 4


def test_redelivered_batches_come_as_members_then_new_ones_whole_again(broker, subs) -> None:
    produced = produce_batches(broker, 3)
    cid = attach(subs)
    receive(subs, cid)
    subs.redeliver(NAME, "s", cid)
    again = subs.receive(NAME, "s", cid, max_messages=100, whole=True)
    assert members(list(again.entries)) == produced[0] and again.redelivery_counts == [1, 1, 1]
    subs.ack(NAME, "s", cid, produced[0], cumulative=False)
    later = produce_batches(broker, 2)
    items = receive(subs, cid)
    assert [type(i) for i in items] == [BatchEntry] and members(items) == later[0]


def test_a_negative_ack_of_a_member_gives_back_its_batch(broker, subs) -> None:
    produced = produce_batches(broker, 3)
    subs.create(NAME, "s", initial_position="earliest")
    cid = subs.attach(NAME, "s", negative_ack_redelivery_delay_ms=0).consumer_id
    receive(subs, cid)
    subs.negative_ack(NAME, "s", cid, [produced[0][1]])
    again = subs.receive(NAME, "s", cid, max_messages=100, whole=True)
    assert members(list(again.entries)) == produced[0] and again.redelivery_counts == [1, 1, 1]


def test_the_unacked_bound_counts_deliveries_and_stats_count_members(broker, subs) -> None:
    broker.settings.max_unacked_messages_per_consumer = 2
    produce_batches(broker, 4, 4, 4)
    cid = attach(subs)
    first = receive(subs, cid, 5)
    assert len(first) == 2 and subs.get(NAME, "s").unacked() == 8  # one read: 5 asked, 2 batches
    assert receive(subs, cid) == []  # two deliveries held: nothing more until an ack
    stats = subs.stats(NAME)[0]
    assert stats.unacked == 8 and stats.consumers[0].unacked == 8
    subs.ack(NAME, "s", cid, [], cumulative=False, batches=[(first[0].position, 4)])
    assert [type(i) for i in receive(subs, cid)] == [BatchEntry]


def test_acks_of_whole_batches_survive_a_restart(broker, subs, settings: Settings, db: Database) -> None:
    produced = produce_batches(broker, 4, 3)
    cid = attach(subs)
    items = receive(subs, cid)
    subs.ack(NAME, "s", cid, [], cumulative=False, batches=[(items[0].position, 4)])
    broker.stop()
    again = Broker(settings=settings, db=db)
    again.start()
    try:
        svc = SubscriptionService(broker=again)
        svc.start()
        cid = svc.attach(NAME, "s").consumer_id
        got = list(svc.receive(NAME, "s", cid, max_messages=100, whole=True).entries)
        assert members(got) == produced[1]
    finally:
        again.stop()
