"""Pulsar's ``CompactionTest`` scenarios, through ``api.client`` against a real server.

Each test is named after the Pulsar test whose scenario it plays (see CONFORMANCE.md for the
mapping and for the scenarios that do not apply). Pulsar's producers here never batch: a
scenario Pulsar plays with and without batching is played here without. Pulsar's ``compact``
runs the compactor and waits for it; here it is the admin call and ``wait_for_compaction``.
Pulsar's ``receive()`` (which waits for ever) is ``receive(timeout_millis=RECEIVE_MS)``; its
``receive(2, SECONDS)`` returning null is an empty ``batch_receive`` after ``NONE_MS``.
"""

from __future__ import annotations

import random

import httpx
import pytest

from api.client import Client, ClientError, Consumer, Message, MessageId

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

RECEIVE_MS = 10_000  # Pulsar's blocking receive(): long enough never to be the reason a test fails
NONE_MS = 500  # how long "nothing more arrives" is watched for (Pulsar: 2 s)


def compact(client: Client, topic: str) -> None:
    client.admin.topics.compact(topic)
    status = client.admin.topics.wait_for_compaction(topic, timeout=240)
    assert status.status == "SUCCESS", status


def receive(consumer: Consumer) -> Message:
    return consumer.receive(timeout_millis=RECEIVE_MS)


def assert_no_message(consumer: Consumer) -> None:
    got = consumer.batch_receive(max_messages=1, timeout_millis=NONE_MS)
    assert got == [], [(m.key(), m.value()) for m in got]


def drain(consumer: Consumer) -> list[Message]:
    out: list[Message] = []
    while batch := consumer.batch_receive(max_messages=100, timeout_millis=NONE_MS):
        out.extend(batch)
    return out


def kv(m: Message) -> tuple[str | None, bytes | None]:
    return m.key(), m.value()


def send_random_keys(client: Client, topic: str, n: int = 20, keys: int = 10) -> list[tuple[str, bytes]]:
    """Pulsar's 20 messages on 10 random keys, ``my-message-<key>-<j>``, one send each."""
    rng = random.Random(0)
    producer = client.create_producer(topic)
    sent = []
    for j in range(n):
        key = f"key{rng.randrange(keys)}"
        data = f"my-message-{key}-{j}".encode()
        producer.send(data, key=key)
        sent.append((key, data))
    return sent


def send_three_versions_of_key0(client: Client, topic: str) -> None:
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(f"content{i}".encode(), key="key0")


# -- reading compacted and uncompacted ------------------------------------------------------


def test_compaction(client: Client, topic: str) -> None:
    """testCompaction: 20 messages on 10 keys; after compaction the compacted ledger has one
    entry per key, a readCompacted consumer gets each key's latest value, and a consumer of the
    same subscription with readCompacted=false gets the full backlog in order."""
    client.subscribe(topic, "sub1", read_compacted=True).close()
    sent = send_random_keys(client, topic)
    expected = dict(sent)

    compact(client, topic)

    compacted_ledger = client.admin.topics.internal_stats(topic)["compactedLedger"]
    assert compacted_ledger["entries"] == len(expected)
    assert compacted_ledger["ledgerId"] > -1
    assert compacted_ledger["offloaded"] is False

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        while expected:
            m = consumer.receive(timeout_millis=2000)
            assert expected.pop(m.key()) == m.value()

    with client.subscribe(topic, "sub1", read_compacted=False) as consumer:
        remaining = list(sent)
        while remaining:
            m = consumer.receive(timeout_millis=2000)
            assert kv(m) == remaining.pop(0)


def test_compaction_with_reader(client: Client, topic: str) -> None:
    """testCompactionWithReader: the same 20 messages; a readCompacted reader from earliest gets
    each key's latest value, a reader with readCompacted=false the full log in order."""
    sent = send_random_keys(client, topic)
    expected = dict(sent)

    compact(client, topic)

    with client.create_reader(topic, MessageId.earliest, read_compacted=True) as reader:
        while expected:
            m = reader.read_next(timeout_millis=2000)
            assert expected.pop(m.key()) == m.value()

    with client.create_reader(topic, MessageId.earliest, read_compacted=False) as reader:
        remaining = list(sent)
        while remaining:
            m = reader.read_next(timeout_millis=2000)
            assert kv(m) == remaining.pop(0)


def test_read_compacted_before_compaction(client: Client, topic: str) -> None:
    """testReadCompactedBeforeCompaction: before any compaction a readCompacted consumer reads
    every message; after it, a new consumer of the same subscription reads only the latest."""
    client.subscribe(topic, "sub1", read_compacted=True).close()
    send_three_versions_of_key0(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        for i in range(3):
            assert kv(receive(consumer)) == ("key0", f"content{i}".encode())

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        assert kv(receive(consumer)) == ("key0", b"content2")


def test_read_entries_after_compaction(client: Client, topic: str) -> None:
    """testReadEntriesAfterCompaction: a message produced after compaction is read after the
    compacted data (content2, then content3)."""
    client.subscribe(topic, "sub1", read_compacted=True).close()
    send_three_versions_of_key0(client, topic)

    compact(client, topic)

    client.create_producer(topic).send(b"content3", key="key0")

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        assert kv(receive(consumer)) == ("key0", b"content2")
        assert kv(receive(consumer)) == ("key0", b"content3")


def test_seek_earliest_after_compaction(client: Client, topic: str) -> None:
    """testSeekEarliestAfterCompaction: seek(earliest) on a readCompacted consumer gives the
    compacted value; on a readCompacted=false consumer of the same subscription, the full log."""
    send_three_versions_of_key0(client, topic)

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        consumer.seek(MessageId.earliest)
        assert kv(receive(consumer)) == ("key0", b"content2")

    with client.subscribe(topic, "sub1", read_compacted=False) as consumer:
        consumer.seek(MessageId.earliest)
        for i in range(3):
            assert kv(receive(consumer)) == ("key0", f"content{i}".encode())


def test_compact_empty_topic(client: Client, topic: str) -> None:
    """testCompactEmptyTopic: compacting an empty topic succeeds, and a message produced after
    it is read by a readCompacted consumer."""
    client.subscribe(topic, "sub1", read_compacted=True).close()

    compact(client, topic)

    client.create_producer(topic).send(b"content0", key="key0")

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        assert kv(receive(consumer)) == ("key0", b"content0")


def test_first_message_retained(client: Client, topic: str) -> None:
    """testFirstMessageRetained: the messages a compacted read returns keep the ids they had
    before compaction (key1 -> its only message, key2 -> its last)."""
    client.subscribe(topic, "sub1", read_compacted=True).close()
    producer = client.create_producer(topic)
    producer.send(b"my-message-1", key="key1")
    producer.send(b"my-message-2", key="key2")
    producer.send(b"my-message-3", key="key2")

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        before = [receive(consumer) for _ in range(3)]

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        m1 = receive(consumer)
        assert kv(m1) == ("key1", b"my-message-1")
        assert m1.message_id() == before[0].message_id()
        m2 = receive(consumer)
        assert kv(m2) == ("key2", b"my-message-3")
        assert m2.message_id() == before[2].message_id()


def test_batch_message_with_null_value(client: Client, topic: str) -> None:
    """testBatchMessageWithNullValue, its messages sent one by one: keys whose last message is a
    null value are gone; key2, key3 and key5 remain, in that order."""
    client.subscribe(topic, "sub1", read_compacted=True, receiver_queue_size=1).close()
    client.create_producer(topic).send_many(
        [
            ("key1", b"my-message-1"), ("key1", None), ("key2", b"my-message-3"),
            ("key3", b"my-message-4"), ("key3", b"my-message-5"), ("key3", b"my-message-6"),
            ("key4", b"my-message-7"), ("key4", None), ("key5", b"my-message-9"),
        ]
    )  # fmt: skip

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True, receiver_queue_size=1) as consumer:
        got = drain(consumer)
    assert [m.key() for m in got] == ["key2", "key3", "key5"]


def test_whole_batch_compacted_out(client: Client, topic: str) -> None:
    """testWholeBatchCompactedOut, its batch sent as single messages: four values of key1, and
    a compacted read gives only the last."""
    client.subscribe(topic, "sub1", read_compacted=True).close()
    producer = client.create_producer(topic)
    for i in range(1, 5):
        producer.send(f"my-message-{i}".encode(), key="key1")

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        assert kv(receive(consumer)) == ("key1", b"my-message-4")


@pytest.mark.parametrize("retain_null_key", [True, False], ids=["retainNullKey", "dropNullKey"])
def test_key_less_messages_pass_through(
    client: Client, topic: str, pulsar_server, retain_null_key: bool
) -> None:
    """testKeyLessMessagesPassThrough (its non-batching reading): keyless messages are kept in
    place by compaction with retainNullKey and dropped without it; keyed ones are compacted."""
    tenant, namespace, name = topic.removeprefix("persistent://").split("/")
    httpx.post(
        f"{pulsar_server.url}/admin/v2/persistent/{tenant}/{namespace}/{name}/compactionPolicy",
        json={"retainNullKey": retain_null_key},
        timeout=10,
    ).raise_for_status()
    client.subscribe(topic, "sub1", read_compacted=True).close()
    client.create_producer(topic).send_many(
        [
            (None, b"my-message-1"), (None, b"my-message-2"),
            ("key1", b"my-message-3"), ("key1", b"my-message-4"),
            ("key2", b"my-message-5"), ("key2", b"my-message-6"),
            (None, b"my-message-7"), (None, b"my-message-8"),
        ]
    )  # fmt: skip

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        got = [kv(m) for m in drain(consumer)]
    if retain_null_key:
        assert got == [
            (None, b"my-message-1"), (None, b"my-message-2"),
            ("key1", b"my-message-4"), ("key2", b"my-message-6"),
            (None, b"my-message-7"), (None, b"my-message-8"),
        ]  # fmt: skip
    else:
        assert got == [("key1", b"my-message-4"), ("key2", b"my-message-6")]


def test_compactor_reads_compacted(client: Client, topic: str) -> None:
    """testCompactorReadsCompacted (what is observable; which ledgers the compactor opens is
    BookKeeper's): key0, compaction, key1 ... a second compaction builds on the first and a
    compacted read gives key0, key1 and key2."""
    client.subscribe(topic, "sub1").close()
    producer = client.create_producer(topic)
    producer.send(b"my-message-0", key="key0")
    producer.send(b"my-message-1", key="key1")

    compact(client, topic)

    producer.send(b"my-message-2", key="key2")

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        assert kv(receive(consumer)) == ("key0", b"my-message-0")
        assert kv(receive(consumer)) == ("key1", b"my-message-1")
        assert kv(receive(consumer)) == ("key2", b"my-message-2")


# -- empty payloads are deletes -------------------------------------------------------------


def test_empty_payload_deletes(client: Client, topic: str) -> None:
    """testEmptyPayloadDeletes (its messages sent one by one): a keyed message with an empty
    payload deletes its key; key0 persists, key1..key3 are deleted, key4 is deleted and
    resurrected."""
    client.subscribe(topic, "sub1", read_compacted=True).close()
    client.create_producer(topic).send_many(
        [
            ("key0", b"my-message-0"),
            ("key1", b"my-message-1"), ("key1", b""),
            ("key2", b"my-message-2"), ("key3", b"my-message-3"), ("key2", b""),
            ("key3", b""), ("key4", b"my-message-3"), ("key4", b""),
            ("key4", b"my-message-4"),
        ]
    )  # fmt: skip

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        assert kv(receive(consumer)) == ("key0", b"my-message-0")
        assert kv(receive(consumer)) == ("key4", b"my-message-4")
        assert_no_message(consumer)


def test_compaction_with_last_deleted_key(client: Client, topic: str) -> None:
    """testCompactionWithLastDeletedKey (without batching): keys 1 and 2 end with an empty
    payload, so the compacted read starts with key 3."""
    producer = client.create_producer(topic)
    client.subscribe(topic, "sub1", read_compacted=True).close()
    for key, value in [("1", b"1"), ("2", b"2"), ("3", b"3"), ("1", b""), ("2", b"")]:
        producer.send(value, key=key)

    compact(client, topic)

    expected = {"3"}
    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        m = consumer.receive(timeout_millis=2000)
        assert m.key() in expected
        expected.remove(m.key())
        # Pulsar's test stops there; keys 1 and 2 must not follow (their deletes come after 3).
        assert_no_message(consumer)


def test_empty_compaction_ledger(client: Client, topic: str) -> None:
    """testEmptyCompactionLedger (without batching): every key ends with an empty payload, so
    a compacted read gets nothing."""
    producer = client.create_producer(topic)
    client.subscribe(topic, "sub1", read_compacted=True).close()
    for key, value in [("1", b"1"), ("2", b"2"), ("1", b""), ("2", b"")]:
        producer.send(value, key=key)

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        assert_no_message(consumer)


def test_all_empty_compaction_ledger(client: Client, topic: str) -> None:
    """testAllEmptyCompactionLedger (without batching): ten empty payloads of key 1, and a
    compacted read from earliest gets nothing."""
    client.create_producer(topic).send_many([("1", b"")] * 10)

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True, initial_position="earliest") as consumer:
        assert_no_message(consumer)


def _k1_then(client: Client, topic: str, rest: list[tuple[str, bytes]]) -> None:
    """k1 -> 0..5 (Pulsar's mix of single and batched sends, here all single), then ``rest``."""
    client.create_producer(topic).send_many([("k1", str(i).encode()) for i in range(6)] + rest)


def test_batch_and_non_batch_without_empty_payload(client: Client, topic: str) -> None:
    """testBatchAndNonBatchWithoutEmptyPayload (its non-batching reading): k1 -> 0..5,
    k2 -> 0..3; the compacted read is k1=5, k2=3 and nothing else."""
    _k1_then(client, topic, [("k2", str(i).encode()) for i in range(4)])

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True, initial_position="earliest") as consumer:
        assert kv(consumer.receive(timeout_millis=2000)) == ("k1", b"5")
        assert kv(consumer.receive(timeout_millis=2000)) == ("k2", b"3")
        assert_no_message(consumer)


def test_batch_and_non_batch_with_empty_payload(client: Client, topic: str) -> None:
    """testBatchAndNonBatchWithEmptyPayload (its non-batching reading): k2 ends with an empty
    payload, so the compacted read is k1=5, k3=0 and nothing else."""
    _k1_then(client, topic, [("k2", b"10"), ("k2", b"11"), ("k2", b"12"), ("k2", b""), ("k3", b"0")])

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True, initial_position="earliest") as consumer:
        m1 = receive(consumer)
        m2 = receive(consumer)
        assert (m1.key(), m2.key()) == ("k1", "k3")
        assert (m1.value(), m2.value()) == (b"5", b"0")
        assert_no_message(consumer)


def test_batch_and_non_batch_end_of_empty_payload(client: Client, topic: str) -> None:
    """testBatchAndNonBatchEndOfEmptyPayload (its non-batching reading): the topic ends with
    k2's empty payload; the compacted read is k1=5 and nothing else."""
    _k1_then(client, topic, [("k2", b"10"), ("k2", b"11"), ("k2", b"12"), ("k2", b"")])

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True, initial_position="earliest") as consumer:
        assert kv(receive(consumer)) == ("k1", b"5")
        assert_no_message(consumer)


def test_compact_multiple_times_without_empty_message(client: Client, topic: str) -> None:
    """testCompactMultipleTimesWithoutEmptyMessage (without batching): key 1 -> 0..9, compact,
    10..19, compact again; the compacted read is 19 alone."""
    producer = client.create_producer(topic)
    producer.send_many([("1", str(i).encode()) for i in range(10)])

    compact(client, topic)

    producer.send_many([("1", str(i + 10).encode()) for i in range(10)])

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True, initial_position="earliest") as consumer:
        assert kv(receive(consumer)) == ("1", b"19")
        assert_no_message(consumer)


def test_read_un_compacted(client: Client, topic: str) -> None:
    """testReadUnCompacted (without batching): a compacted read gives the compacted value then
    the messages after the horizon; after an empty payload and a compaction, nothing; then only
    the messages produced after that."""
    producer = client.create_producer(topic)
    producer.send_many([("1", str(i).encode()) for i in range(10)])

    compact(client, topic)

    producer.send_many([("1", str(i + 10).encode()) for i in range(10)])
    with client.subscribe(topic, "sub1", read_compacted=True, initial_position="earliest") as consumer:
        for i in range(11):
            m = receive(consumer)
            assert kv(m) == ("1", str(i + 9).encode())
            consumer.acknowledge(m)
        assert_no_message(consumer)

    producer.send(b"", key="1")

    compact(client, topic)

    with client.subscribe(topic, "sub2", read_compacted=True, initial_position="earliest") as consumer:
        assert_no_message(consumer)

    producer.send_many([("1", str(i + 20).encode()) for i in range(10)])
    with client.subscribe(topic, "sub3", read_compacted=True, initial_position="earliest") as consumer:
        for i in range(10):
            m = receive(consumer)
            assert kv(m) == ("1", str(i + 20).encode())
            consumer.acknowledge(m)
        assert_no_message(consumer)


# -- this project's addition: Pulsar's compaction stats --------------------------------------


def test_compaction_stats(client: Client, topic: str) -> None:
    """Not a CompactionTest scenario: the ``compaction`` block of Pulsar's topic stats
    (CompactionRecord) and the compacted ledger of its internal stats, after the 20 messages
    of testCompaction are compacted."""
    sent = send_random_keys(client, topic)

    compact(client, topic)

    stats = client.admin.topics.stats(topic)["compaction"]
    assert stats["lastCompactionRemovedEventCount"] == len(sent) - len(dict(sent))
    assert stats["lastCompactionSucceedTimestamp"] > 0
    assert stats["lastCompactionFailedTimestamp"] == 0
    assert stats["lastCompactionDurationTimeInMills"] >= 0
    compacted_ledger = client.admin.topics.internal_stats(topic)["compactedLedger"]
    assert compacted_ledger["offloaded"] is False
    assert compacted_ledger["underReplicated"] is False
    assert compacted_ledger["entries"] == len(dict(sent))
    assert compacted_ledger["size"] > 0


# -- acknowledgements, and the server restarting --------------------------------------------


def test_acknowledge_with_reconnection(client: Client, topic: str) -> None:
    """testAcknowledgeWithReconnection (without trimming the topic, which needs an unload): a
    readCompacted consumer acknowledges 5 of 10 compacted messages (backlog 5), reattaches,
    gets the other 5 (backlog 0), and after reattaching again a new message; the cursor then
    stands at the last entry."""
    producer = client.create_producer(topic)
    expected = [str(i).encode() for i in range(10)]
    producer.send_many([(str(i), str(i).encode()) for i in range(10)])

    compact(client, topic)

    def attach() -> Consumer:
        return client.subscribe(
            topic, "my-sub", read_compacted=True, initial_position="earliest",
            receiver_queue_size=1, ack_group_time_ms=0,
        )  # fmt: skip

    def backlog() -> int:
        return int(client.admin.topics.stats(topic)["subscriptions"]["my-sub"]["msgBacklog"])

    results = []
    consumer = attach()
    for _ in range(5):
        m = consumer.receive(timeout_millis=3000)
        results.append(m.value())
        consumer.acknowledge(m)
    assert backlog() == 5

    consumer.close()  # Pulsar unloads the topic, so that the consumer reconnects
    consumer = attach()
    for _ in range(5):
        m = consumer.receive(timeout_millis=3000)
        results.append(m.value())
        consumer.acknowledge(m)
    assert backlog() == 0
    assert results == expected
    assert_no_message(consumer)

    consumer.close()
    consumer = attach()
    producer.send(b"V", key="K")
    m = consumer.receive(timeout_millis=3000)
    assert m.value() == b"V"
    consumer.acknowledge(m)
    consumer.close()

    internal = client.admin.topics.internal_stats(topic)
    assert internal["lastConfirmedEntry"] == internal["cursors"]["my-sub"]["markDeletePosition"]


def test_broker_restart_after_compaction(client: Client, topic: str, pulsar_server) -> None:
    """testBrokerRestartAfterCompaction: the compacted value is read before the server stops,
    subscribing fails while it is down, and the compacted value is read again after it starts.
    (It restarts this parameter's shared server: it is the last test of the module.)"""
    client.subscribe(topic, "sub1", read_compacted=True).close()
    send_three_versions_of_key0(client, topic)

    compact(client, topic)

    with client.subscribe(topic, "sub1", read_compacted=True) as consumer:
        assert kv(receive(consumer)) == ("key0", b"content2")

    pulsar_server.stop()
    try:
        with pytest.raises(ClientError), Client(pulsar_server.url) as down:
            down.subscribe(topic, "sub1", read_compacted=True)
    finally:
        pulsar_server.start()

    with Client(pulsar_server.url) as after, after.subscribe(topic, "sub1", read_compacted=True) as consumer:
        assert kv(consumer.receive(timeout_millis=RECEIVE_MS)) == ("key0", b"content2")
