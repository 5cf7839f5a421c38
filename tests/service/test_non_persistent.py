"""Non-persistent topics' dispatch and lifetime (``service.non_persistent``), with sinks that
record what they are sent (the binary protocol's consumers are checked end to end in
tests/e2e/test_non_persistent.py)."""

from __future__ import annotations

import pytest

from service.errors import Conflict, NotAllowed, NotFound
from service.names import TopicName
from service.non_persistent import (
    Consumer,
    Message,
    NonPersistentTopics,
    Producer,
    Rate,
    Topic,
    full_name,
    is_non_persistent,
    parse,
)
from service.subscription_types import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED

NAME = TopicName("t", "n", "x")


class Sink:
    def __init__(self, permits: int = 1000, writable: bool = True) -> None:
        self.permits = permits
        self._writable = writable
        self.got: list[bytes] = []

    def writable(self) -> bool:
        return self._writable

    def send(self, message: Message) -> None:
        self.got.append(message.payload)
        self.permits -= message.count


def msg(payload: bytes, key: bytes | None = None, count: int = 1) -> Message:
    return Message(b"md", payload, count, key)


def attach(
    topics: NonPersistentTopics,
    topic: Topic,
    sub: str,
    kind: str,
    name: str,
    sink: Sink,
    priority: int = 0,
    durable: bool = True,
) -> Consumer:
    c = Consumer(name=name, priority_level=priority, sink=sink)
    topics.subscribe(topic, sub, c, subscription_type=kind, durable=durable, read_compacted=False)
    return c


def test_names() -> None:
    assert is_non_persistent("non-persistent://t/n/x") and not is_non_persistent("persistent://t/n/x")
    assert parse("non-persistent://t/n/x") == NAME and full_name(NAME) == "non-persistent://t/n/x"
    with pytest.raises(Exception, match="invalid"):
        parse("non-persistent://t/n/../x")


def test_each_subscription_gets_each_message_once_and_a_consumer_without_permits_drops() -> None:
    topics = NonPersistentTopics()
    topic = topics.open(NAME, partition=-1, create=True)
    producer = Producer(name="p", producer_id=1)
    topics.add_producer(topic, producer)
    a, b, starved = Sink(), Sink(), Sink(permits=1)
    attach(topics, topic, "a", EXCLUSIVE, "a", a)
    attach(topics, topic, "b", EXCLUSIVE, "b", b)
    attach(topics, topic, "starved", EXCLUSIVE, "s", starved)
    for i in range(3):
        topic.publish(producer, msg(b"m%d" % i))
    assert a.got == b.got == [b"m0", b"m1", b"m2"]
    assert starved.got == [b"m0"]
    assert topic.subscriptions["starved"].dropped.total == 2
    assert topic.subscriptions["a"].dropped.total == 0
    assert topic.msg_in.total == 3 and producer.msg_in.total == 3


def test_a_batch_spends_a_permit_per_member_and_is_dropped_whole() -> None:
    topics = NonPersistentTopics()
    topic = topics.open(NAME, partition=-1, create=True)
    producer = Producer(name="p", producer_id=1)
    topics.add_producer(topic, producer)
    sink = Sink(permits=5)
    attach(topics, topic, "s", EXCLUSIVE, "c", sink)
    topic.publish(producer, msg(b"batch", count=5))
    topic.publish(producer, msg(b"next", count=3))
    assert sink.got == [b"batch"] and sink.permits == 0
    assert topic.subscriptions["s"].dropped.total == 3


def test_shared_round_robin_among_the_best_priority_with_permits() -> None:
    topics = NonPersistentTopics()
    topic = topics.open(NAME, partition=-1, create=True)
    producer = Producer(name="p", producer_id=1)
    topics.add_producer(topic, producer)
    first, second, low, empty = Sink(), Sink(), Sink(), Sink(permits=0)
    attach(topics, topic, "s", SHARED, "1", first)
    attach(topics, topic, "s", SHARED, "2", second)
    attach(topics, topic, "s", SHARED, "low", low, priority=1)
    attach(topics, topic, "s", SHARED, "empty", empty)
    for i in range(6):
        topic.publish(producer, msg(b"%d" % i))
    assert len(first.got) == len(second.got) == 3 and sorted(first.got + second.got) == [
        b"%d" % i for i in range(6)
    ]
    assert low.got == [] and empty.got == []
    first.permits = second.permits = 0  # the best level has none: the next level takes them
    topic.publish(producer, msg(b"6"))
    assert low.got == [b"6"]


def test_failover_sends_to_the_first_by_priority_and_name_and_a_partition_by_its_index() -> None:
    topics = NonPersistentTopics()
    for partition, expected in ((-1, "a"), (1, "b")):
        topic = topics.open(TopicName("t", "n", f"x{partition}"), partition=partition, create=True)
        producer = Producer(name="p", producer_id=1)
        topics.add_producer(topic, producer)
        sinks = {name: Sink() for name in ("c", "a", "b")}
        for name, sink in sinks.items():
            attach(topics, topic, "fo", FAILOVER, name, sink)
        topic.publish(producer, msg(b"m"))
        assert {n for n, s in sinks.items() if s.got} == {expected}


def test_key_shared_keeps_a_key_on_one_consumer() -> None:
    topics = NonPersistentTopics()
    topic = topics.open(NAME, partition=-1, create=True)
    producer = Producer(name="p", producer_id=1)
    topics.add_producer(topic, producer)
    sinks = [Sink(), Sink()]
    for i, sink in enumerate(sinks):
        attach(topics, topic, "ks", KEY_SHARED, f"c{i}", sink)
    keys = [b"k%d" % i for i in range(30)]
    for k in keys * 2:
        topic.publish(producer, msg(k, key=k))
    assert all(sinks[0].got.count(k) + sinks[1].got.count(k) == 2 for k in keys)
    assert not set(sinks[0].got) & set(sinks[1].got) and sinks[0].got and sinks[1].got


def test_refusals_change_nothing() -> None:
    topics = NonPersistentTopics()
    with pytest.raises(NotFound):
        topics.open(NAME, partition=-1, create=False)
    topic = topics.open(NAME, partition=-1, create=True)
    with pytest.raises(NotAllowed, match="readCompacted only valid on persistent topics"):
        topics.subscribe(
            topic,
            "s",
            Consumer("c", 0, Sink()),
            subscription_type=EXCLUSIVE,
            durable=True,
            read_compacted=True,
        )
    assert topics.topics == {}  # loaded for that consumer alone, unloaded with its refusal
    topic = topics.open(NAME, partition=-1, create=True)
    only = attach(topics, topic, "s", EXCLUSIVE, "only", Sink())
    with pytest.raises(Conflict, match="Exclusive consumer is already connected"):
        attach(topics, topic, "s", EXCLUSIVE, "second", Sink())
    with pytest.raises(Conflict, match="different type"):
        attach(topics, topic, "s", SHARED, "other", Sink())
    assert topic.subscriptions["s"].consumers == [only]
    with pytest.raises(NotAllowed):
        NonPersistentTopics(enabled=False).open(NAME, partition=-1, create=True)


def test_a_topic_lives_while_used_and_a_readers_subscription_goes_with_it() -> None:
    topics = NonPersistentTopics()
    topic = topics.open(NAME, partition=-1, create=True)
    producer = Producer(name="p", producer_id=1)
    topics.add_producer(topic, producer)
    sink = Sink()
    reader = attach(topics, topic, "reader", EXCLUSIVE, "r", sink, durable=False)
    durable = attach(topics, topic, "durable", SHARED, "d", Sink())
    topic.publish(producer, msg(b"m"))
    topics.detach(topic, topic.subscriptions["reader"], reader)
    assert set(topic.subscriptions) == {"durable"}  # the reader's went with it
    assert topic.msg_out_before == 1  # its counters stay in the topic's
    assert topics.list("t", "n") == ["non-persistent://t/n/x"] and topics.list("t", "other") == []
    topics.remove_producer(topic, producer)
    assert NAME in topics.topics  # a consumer is attached
    with pytest.raises(Conflict):
        topics.unsubscribe(topic, topic.subscriptions["durable"], Consumer("stranger", 0, Sink()))
    topics.unsubscribe(topic, topic.subscriptions["durable"], durable)
    assert topics.topics == {}
    with pytest.raises(NotFound):
        topics.get(NAME)


def test_rate_counts_and_averages_over_its_window() -> None:
    r = Rate()
    r.add(30)
    r.add(30)
    assert r.total == 60 and r.per_second() == 1.0
