"""A message id names its partition, as Pulsar's broker names it: the official ``pulsar-client``
(its C++ core takes a received message's partition from the id the broker sends) reads the
partition of each message of a partitioned topic from ``message_id().partition()``, and a
topic that is not a partition keeps -1. Against a real ``compactor serve``."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pulsar
import pytest

from tests.e2e.partitioned import ADMIN, full, partitioned

pytestmark = [pytest.mark.e2e]

TM = 10_000


def send_all(producer: pulsar.Producer, values: list[bytes], batched: bool) -> dict[bytes, pulsar.MessageId]:
    """Each value's receipt id; batched, the sends go out together, so a partition's share is
    one batch."""
    if not batched:
        return {v: producer.send(v) for v in values}
    ids: dict[bytes, pulsar.MessageId] = {}
    done = threading.Event()

    def receipt(value: bytes) -> object:
        def callback(result: pulsar.Result, mid: pulsar.MessageId) -> None:
            assert result == pulsar.Result.Ok, result
            ids[value] = mid
            if len(ids) == len(values):
                done.set()

        return callback

    for v in values:
        producer.send_async(v, receipt(v))
    producer.flush()
    assert done.wait(TM / 1000)
    return ids


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_a_custom_routers_partition_is_the_one_a_consumer_reads_from_each_id(
    http: httpx.Client, client: pulsar.Client, batched: bool
) -> None:
    """pulsar-client-python's ``test_message_router``: the partition the router chose is the
    one the consumer reports, and a send's receipt names it too."""
    name = partitioned(http, 5, "pid")

    def router(msg: pulsar.Message, num_partitions: int) -> int:
        return (10 if msg.value().startswith(b"hello-") else 11) % num_partitions

    producer = client.create_producer(full(name), message_router=router, batching_enabled=batched)
    receipts = send_all(producer, [b"hello-0", b"hello-1", b"world-0", b"world-1"], batched)
    assert {v: mid.partition() for v, mid in receipts.items()} == {
        b"hello-0": 0,
        b"hello-1": 0,
        b"world-0": 1,
        b"world-1": 1,
    }
    consumer = client.subscribe(full(name), "sub", initial_position=pulsar.InitialPosition.Earliest)
    by_partition: dict[int, list[bytes]] = {}
    for _ in range(4):
        m = consumer.receive(TM)
        partition = m.message_id().partition()
        by_partition.setdefault(partition, []).append(m.value())
        assert m.topic_name() == full(f"{name}-partition-{partition}")
        assert m.message_id() == receipts[m.value()]  # the receipt's id, partition and all
    assert by_partition == {0: [b"hello-0", b"hello-1"], 1: [b"world-0", b"world-1"]}


def test_acks_and_negative_acks_of_ids_naming_their_partition(
    http: httpx.Client, client: pulsar.Client
) -> None:
    """A consumer of a partitioned topic acknowledges, and asks for the redelivery of, ids that
    name their partition: a negatively acknowledged message comes again under its id, and
    every partition's backlog empties once all are acknowledged."""
    name = partitioned(http, 3, "pid")
    producer = client.create_producer(
        full(name),
        batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )
    for i in range(9):
        producer.send(f"m{i}".encode())
    consumer = client.subscribe(
        full(name),
        "s",
        initial_position=pulsar.InitialPosition.Earliest,
        negative_ack_redelivery_delay_ms=100,
    )
    got = [consumer.receive(TM) for _ in range(9)]
    assert {m.message_id().partition() for m in got} == {0, 1, 2}
    for m in got:
        assert m.topic_name() == full(f"{name}-partition-{m.message_id().partition()}")
    refused = got[4]
    for m in got:
        if m is refused:
            consumer.negative_acknowledge(m)
        else:
            consumer.acknowledge(m)
    again = consumer.receive(TM)
    assert (again.value(), again.message_id(), again.redelivery_count()) == (
        refused.value(),
        refused.message_id(),
        1,
    )
    consumer.acknowledge(again)
    deadline = time.monotonic() + 10
    while True:
        stats = http.get(f"{ADMIN}/{name}/partitioned-stats").json()["partitions"]
        backlogs = {t: s["subscriptions"]["s"]["msgBacklog"] for t, s in stats.items()}
        if set(backlogs.values()) == {0} or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert backlogs == {full(f"{name}-partition-{i}"): 0 for i in range(3)}


def test_a_reader_of_a_partition_reads_seeks_and_ends_with_its_partition_in_every_id(
    http: httpx.Client, client: pulsar.Client
) -> None:
    name = partitioned(http, 3, "pid")
    producer = client.create_producer(full(name), message_router=lambda m, n: 2, batching_enabled=False)
    ids = [producer.send(f"v{i}".encode()) for i in range(5)]
    assert {mid.partition() for mid in ids} == {2}
    reader = client.create_reader(full(f"{name}-partition-2"), pulsar.MessageId.earliest)
    read = []
    while reader.has_message_available():  # ends: the last id names the partition the reads do
        read.append(reader.read_next(TM))
    assert [m.message_id() for m in read] == ids
    assert all(m.message_id().partition() == 2 for m in read)
    reader.seek(ids[1])
    assert reader.read_next(TM).message_id() == ids[2]  # after the id (the reader is not inclusive)
    assert [reader.read_next(TM).value() for _ in range(2)] == [b"v3", b"v4"]
    assert not reader.has_message_available()
    # The last message id of a partition names it, as the ids of its messages do.
    consumer = client.subscribe(
        full(f"{name}-partition-2"), "direct", initial_position=pulsar.InitialPosition.Earliest
    )
    assert consumer.get_last_message_id() == ids[-1]
    assert consumer.receive(TM).message_id() == ids[0]


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_a_plain_topics_ids_name_no_partition(client: pulsar.Client, batched: bool) -> None:
    topic = full(f"plain-{uuid.uuid4().hex[:10]}")
    producer = client.create_producer(topic, batching_enabled=batched)
    values = [f"v{i}".encode() for i in range(4)]
    receipts = send_all(producer, values, batched)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(TM) for _ in values]
    assert {m.value(): m.message_id() for m in got} == receipts
    assert {m.message_id().partition() for m in got} == {-1}
    assert consumer.get_last_message_id().partition() == -1
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    read = []
    while reader.has_message_available():
        read.append(reader.read_next(TM))
    assert [m.value() for m in read] == values
    assert {m.message_id().partition() for m in read} == {-1}
