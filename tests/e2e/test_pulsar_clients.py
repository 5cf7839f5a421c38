"""The official ``pulsar-client`` (the C++ core inside), unchanged, against a real ``compactor
serve``: Pulsar's binary protocol is judged by the client every Pulsar application uses."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pulsar
import pytest
from pulsar import asyncio as pulsar_asyncio

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode, encode_payload
from service.failover import active_index
from tests.conftest import SUPERUSER, SecureServer, Server
from tests.e2e.raw_wire import connect, raw, read_frame

pytestmark = [pytest.mark.e2e]

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def fresh(prefix: str = "t") -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


def rest_messages(server: Server, topic: str, **params: object) -> list[dict[str, object]]:
    path = topic.removeprefix("persistent://")
    r = httpx.get(f"{server.url}/topics/persistent/{path}/messages", params={"maxMessages": 1000, **params})
    assert r.status_code == 200, r.text
    return r.json()["messages"]


def wire_id(m: pulsar.Message) -> str:
    mid = m.message_id()
    return f"{mid.ledger_id()}:{mid.entry_id()}"


def receive_all(consumer: pulsar.Consumer, n: int, timeout_ms: int = 10_000) -> list[pulsar.Message]:
    return [consumer.receive(timeout_ms) for _ in range(n)]


def test_health_says_where_the_binary_protocol_listens(shared_server: Server) -> None:
    body = httpx.get(f"{shared_server.url}/health").json()
    assert body["brokerServiceUrl"] == shared_server.pulsar_url


def test_what_a_producer_sends_a_consumer_and_rest_read_alike(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh()
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [
        producer.send(
            f"v{i}".encode(), partition_key=f"k{i % 3}", properties={"n": str(i)}, event_timestamp=1000 + i
        )
        for i in range(6)
    ]
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    got = receive_all(consumer, 6)
    assert [m.message_id() for m in got] == sent
    assert [m.data() for m in got] == [f"v{i}".encode() for i in range(6)]
    assert [m.partition_key() for m in got] == [f"k{i % 3}" for i in range(6)]
    assert [m.properties() for m in got] == [{"n": str(i)} for i in range(6)]
    assert [m.event_timestamp() for m in got] == [1000 + i for i in range(6)]
    # The same messages, under the same ids, over REST.
    rest = rest_messages(shared_server, topic)
    assert [r["messageId"] for r in rest] == [wire_id(m) for m in got]
    assert [base64.b64decode(str(r["value"])) for r in rest] == [m.data() for m in got]
    assert [r["key"] for r in rest] == [m.partition_key() for m in got]
    assert [r["publishTime"] for r in rest] == [m.publish_timestamp() for m in got]


def test_a_message_produced_over_rest_is_consumed_over_the_wire(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh()
    path = topic.removeprefix("persistent://")
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    r = httpx.post(
        f"{shared_server.url}/topics/persistent/{path}",
        json={
            "messages": [
                {"key": "a", "value": base64.b64encode(b"over rest").decode(), "properties": {"x": "1"}}
            ]
        },
    )
    assert r.status_code == 200, r.text
    m = consumer.receive(10_000)
    assert (m.data(), m.partition_key(), m.properties()) == (b"over rest", "a", {"x": "1"})
    assert wire_id(m) == r.json()["messageIds"][0]


def test_acknowledged_messages_are_not_delivered_again_after_a_reconnect(client: pulsar.Client) -> None:
    topic = fresh()
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(5):
        producer.send(str(i).encode())
    got = receive_all(consumer, 5)
    for m in got[:3]:
        consumer.acknowledge(m)
    consumer.close()
    again = client.subscribe(topic, "s")
    assert [m.data() for m in receive_all(again, 2)] == [b"3", b"4"]
    with pytest.raises(pulsar.Timeout):
        again.receive(500)


def test_cumulative_acks_and_redelivery_of_the_unacknowledged(client: pulsar.Client) -> None:
    topic = fresh()
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(6):
        producer.send(str(i).encode())
    got = receive_all(consumer, 6)
    consumer.acknowledge_cumulative(got[2])
    consumer.redeliver_unacknowledged_messages()
    again = receive_all(consumer, 3)
    assert [m.data() for m in again] == [b"3", b"4", b"5"]
    assert [m.redelivery_count() for m in again] == [1, 1, 1]


def test_a_second_exclusive_consumer_is_refused(client: pulsar.Client) -> None:
    topic = fresh()
    client.subscribe(topic, "s")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "s")


def test_a_shared_subscription_splits_messages_and_redelivers_negative_acks(client: pulsar.Client) -> None:
    topic = fresh()
    producer = client.create_producer(topic, batching_enabled=False)
    shared = pulsar.ConsumerType.Shared
    a = client.subscribe(
        topic, "s", consumer_type=shared, receiver_queue_size=5, negative_ack_redelivery_delay_ms=100
    )
    b = client.subscribe(topic, "s", consumer_type=shared, receiver_queue_size=5)
    for i in range(20):
        producer.send(str(i).encode())
    seen: dict[bytes, int] = {}
    nacked = False
    deadline = time.monotonic() + 30
    while len(seen) < 20 and time.monotonic() < deadline:
        for c in (a, b):
            try:
                m = c.receive(200)
            except pulsar.Timeout:
                continue
            if c is a and not nacked:
                nacked = True
                c.negative_acknowledge(m)
                first = m.data()
                continue
            seen[m.data()] = m.redelivery_count()
            c.acknowledge(m)
    assert sorted(seen) == sorted(str(i).encode() for i in range(20))
    assert seen[first] == 1  # delivered again after the negative ack, and counted


def test_key_shared_keeps_each_key_on_one_consumer_in_order(client: pulsar.Client) -> None:
    topic = fresh("ks")
    producer = client.create_producer(topic, batching_enabled=False)
    key_shared = pulsar.ConsumerType.KeyShared
    consumers = [
        client.subscribe(topic, "s", consumer_type=key_shared, receiver_queue_size=10) for _ in range(2)
    ]
    for i in range(60):
        producer.send(str(i).encode(), partition_key=f"key-{i % 6}")
    owner: dict[str, int] = {}
    order: dict[str, list[int]] = {}
    received = 0
    deadline = time.monotonic() + 30
    while received < 60 and time.monotonic() < deadline:
        for n, c in enumerate(consumers):
            try:
                m = c.receive(100)
            except pulsar.Timeout:
                continue
            received += 1
            assert owner.setdefault(m.partition_key(), n) == n  # a key never moves while both live
            order.setdefault(m.partition_key(), []).append(int(m.data()))
            c.acknowledge(m)
    assert received == 60
    assert all(seq == sorted(seq) for seq in order.values())
    assert len(set(owner.values())) == 2  # six keys over two consumers: both got some


def test_failover_delivers_to_one_consumer_and_moves_on_when_it_goes(client: pulsar.Client) -> None:
    # A topic whose hash ring (Pulsar's choice among consumers of one level) makes "a" active.
    topic = next(t for t in (fresh("fo") for _ in range(100)) if active_index(t, -1, [0, 0], ["a", "b"]) == 0)
    producer = client.create_producer(topic, batching_enabled=False)
    failover = pulsar.ConsumerType.Failover
    first = client.subscribe(topic, "s", consumer_type=failover, consumer_name="a")
    second = client.subscribe(topic, "s", consumer_type=failover, consumer_name="b")
    for i in range(3):
        producer.send(str(i).encode())
    got = receive_all(first, 3)
    with pytest.raises(pulsar.Timeout):
        second.receive(300)
    first.acknowledge(got[0])
    first.close()
    # The unacknowledged messages go to the next consumer.
    assert [m.data() for m in receive_all(second, 2)] == [b"1", b"2"]


def test_dead_letters_after_too_many_redeliveries(client: pulsar.Client) -> None:
    topic = fresh("dlq")
    dead = f"{topic}-dead"
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2, dead_letter_topic=dead),
    )
    dead_consumer = client.subscribe(dead, "inspect", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"poison", partition_key="p")
    counts = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            m = consumer.receive(500)
        except pulsar.Timeout:
            break
        counts.append(m.redelivery_count())
        consumer.negative_acknowledge(m)
    assert counts == [0, 1, 2]
    letter = dead_consumer.receive(10_000)
    assert (letter.data(), letter.partition_key()) == (b"poison", "p")


def test_a_topic_is_created_on_first_use_in_a_namespace_that_exists(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh("auto")
    client.create_producer(topic).close()
    listed = httpx.get(f"{shared_server.url}/admin/v2/persistent/public/default").json()
    assert topic in listed
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(f"persistent://public/no-such-namespace-{uuid.uuid4().hex[:6]}/t")
    with pytest.raises(pulsar.PulsarException):
        client.create_producer("persistent://public/default/bad name")
    assert httpx.get(f"{shared_server.url}/admin/v2/persistent/public/default").json().count(topic) == 1


@pytest.mark.spark
def test_read_compacted_consumer_after_a_rest_compaction(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh("compacted")
    producer = client.create_producer(topic, batching_enabled=False)
    latest: dict[str, tuple[pulsar.MessageId, bytes]] = {}
    for i in range(30):
        key = f"k{i % 7}"
        # Empty: a delete (Pulsar's rule); the last two messages delete their keys.
        value = b"" if i in (20, 28, 29) else f"v{i}".encode()
        mid = producer.send(value, partition_key=key)
        if value:
            latest[key] = (mid, value)
        else:
            latest.pop(key, None)
    assert shared_server.compact(topic) == "SUCCESS"
    consumer = client.subscribe(
        topic, "compacted", is_read_compacted=True, initial_position=pulsar.InitialPosition.Earliest
    )
    got = receive_all(consumer, len(latest))
    assert {m.partition_key(): (m.message_id(), m.data()) for m in got} == latest
    assert [m.message_id() for m in got] == sorted(m.message_id() for m in got)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(500)
    # A reader of the compacted view: the same messages, and has_message_available ends with
    # them although the log's last messages (deletes) are past them (Pulsar's rule).
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert read_available(reader) == [v for _, v in sorted(latest.values())]
    # The full log is still there for a consumer that does not read compacted.
    full = client.subscribe(topic, "full", initial_position=pulsar.InitialPosition.Earliest)
    assert len(receive_all(full, 30)) == 30


@pytest.mark.spark
def test_read_compacted_after_a_threshold_compaction(server_factory: type[Server], tmp_path: Path) -> None:
    """No REST call: the scheduler compacts what the wire produced, and a readCompacted reader
    of the real client gets the latest message of every key, under its original id."""
    env = {"COMPACTOR_COMPACTION_MONITOR_INTERVAL_SECONDS": "0.3"}
    srv = server_factory(tmp_path / "data", env=env)
    srv.start()
    c = pulsar.Client(srv.pulsar_url, logger=QUIET)
    try:
        topic = fresh("threshold")
        producer = c.create_producer(topic, batching_enabled=False)
        latest = {}
        for i in range(40):
            latest[f"k{i % 8}"] = (
                producer.send(f"v{i}".encode(), partition_key=f"k{i % 8}"),
                f"v{i}".encode(),
            )
        admin = f"{srv.url}/admin/v2/persistent/{topic.removeprefix('persistent://')}"
        # The topic's threshold, set once everything is written: one round covers it all.
        assert httpx.post(f"{admin}/compactionThreshold", json=100).status_code == 204
        deadline = time.monotonic() + 180
        while not any(r["status"] == "SUCCESS" for r in httpx.get(f"{admin}/compactionRuns").json()):
            assert time.monotonic() < deadline, "the scheduler did not compact the topic"
            time.sleep(0.2)
        assert httpx.get(f"{admin}/compactionRuns").json()[0]["trigger"] == "threshold"
        reader = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        got = []
        while reader.has_message_available():
            m = reader.read_next(10_000)
            got.append((m.partition_key(), m.message_id(), m.data()))
        assert {k: (mid, v) for k, mid, v in got} == latest
        assert len(got) == 8
    finally:
        c.close()


def test_the_asyncio_client_produces_and_consumes(shared_server: Server) -> None:
    topic = fresh("aio")

    async def main() -> list[bytes]:
        client = pulsar_asyncio.Client(shared_server.pulsar_url, logger=QUIET)
        try:
            producer = await client.create_producer(topic, batching_enabled=False)
            consumer = await client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            for i in range(5):
                await producer.send(f"a{i}".encode())
            out = []
            for _ in range(5):
                m = await consumer.receive()
                await consumer.acknowledge(m)
                out.append(m.data())
            return out
        finally:
            await client.close()

    # In a thread of its own: the session's browser fixture runs an event loop in this one.
    out: list[list[bytes]] = []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(asyncio.wait_for(main(), 60))))
    thread.start()
    thread.join(90)
    assert out == [[f"a{i}".encode() for i in range(5)]]


def _produced(client: pulsar.Client, topic: str, n: int) -> list[pulsar.MessageId]:
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode(), partition_key=f"k{i}") for i in range(n)]
    producer.close()
    return ids


def read_available(reader: pulsar.Reader) -> list[bytes]:
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(10_000).data())
    return out


def test_readers_start_where_they_are_told(client: pulsar.Client, shared_server: Server) -> None:
    topic = fresh("reader")
    ids = _produced(client, topic, 6)
    everything = [f"m{i}".encode() for i in range(6)]
    assert read_available(client.create_reader(topic, pulsar.MessageId.earliest)) == everything
    # From a message: after it, or with it when inclusive (Pulsar's startMessageIdInclusive).
    assert read_available(client.create_reader(topic, ids[2])) == everything[3:]
    assert (
        read_available(client.create_reader(topic, ids[2], start_message_id_inclusive=True)) == everything[2:]
    )
    latest = client.create_reader(topic, pulsar.MessageId.latest)
    assert not latest.has_message_available()
    client.create_producer(topic, batching_enabled=False).send(b"new")
    assert latest.read_next(10_000).data() == b"new"
    # A reader keeps no subscription: nothing of it is stored.
    path = topic.removeprefix("persistent://")
    assert httpx.get(f"{shared_server.url}/admin/v2/persistent/{path}/subscriptions").json() == []


def test_a_reader_seeks_by_message_id_and_by_publish_time(client: pulsar.Client) -> None:
    topic = fresh("rseek")
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"a{i}".encode()) for i in range(3)]
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    ids += [producer.send(f"b{i}".encode()) for i in range(3)]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [reader.read_next(10_000).data() for _ in range(6)] == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
    reader.seek(ids[1])
    assert reader.read_next(10_000).data() == b"a2"  # after the id (the reader is not inclusive)
    reader.seek(cut)
    assert [reader.read_next(10_000).data() for _ in range(3)] == [b"b0", b"b1", b"b2"]
    assert not reader.has_message_available()


def test_a_consumer_seeks_its_subscription(client: pulsar.Client, shared_server: Server) -> None:
    topic = fresh("cseek")
    ids = _produced(client, topic, 5)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    for m in receive_all(consumer, 5):
        consumer.acknowledge(m)
    consumer.seek(pulsar.MessageId.earliest)
    again = receive_all(consumer, 5)
    assert [m.message_id() for m in again] == ids
    # By a message's own publish time: from the first message published at that millisecond
    # on (that message, and any sent in the same millisecond before it), as Pulsar 4.0.7
    # answers the same seek (tried there: consumer and reader alike).
    at = again[2].publish_timestamp()
    expected = [m.message_id() for m in again if m.publish_timestamp() >= at]
    consumer.seek(at)
    assert [m.message_id() for m in receive_all(consumer, len(expected))] == expected
    consumer.acknowledge_cumulative(again[-1])
    consumer.seek(ids[3])
    assert consumer.receive(10_000).message_id() in (ids[3], ids[4])
    # The subscription's position is the one REST sees.
    path = topic.removeprefix("persistent://")
    stats = httpx.get(f"{shared_server.url}/admin/v2/persistent/{path}/stats").json()
    assert stats["subscriptions"]["s"]["msgBacklog"] >= 1


def test_the_last_message_id(client: pulsar.Client) -> None:
    topic = fresh("last")
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    ids = _produced(client, topic, 3)
    assert consumer.get_last_message_id() == ids[-1]


def test_producer_access_modes(client: pulsar.Client) -> None:
    topic = fresh("access")
    modes = pulsar.ProducerAccessMode
    exclusive = client.create_producer(topic, access_mode=modes.Exclusive)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=modes.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)  # Shared, while an exclusive producer holds the topic
    # WaitForExclusive: queued until the exclusive producer goes, then granted.
    waiting: dict[str, object] = {}

    def wait_for_it() -> None:
        waiting["producer"] = client.create_producer(topic, access_mode=modes.WaitForExclusive)

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    time.sleep(1.0)
    assert "producer" not in waiting
    exclusive.send(b"first")
    exclusive.close()
    thread.join(30)
    granted = waiting["producer"]
    assert isinstance(granted, pulsar.Producer)
    granted.send(b"second")
    # ExclusiveWithFencing takes the topic from whoever has it.
    fencing = client.create_producer(topic, access_mode=modes.ExclusiveWithFencing)
    fencing.send(b"third")
    with pytest.raises(pulsar.PulsarException):
        granted.send(
            b"fenced",
        )
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert read_available(reader) == [b"first", b"second", b"third"]


def test_a_producer_name_is_unique_on_a_topic(client: pulsar.Client) -> None:
    topic = fresh()
    client.create_producer(topic, producer_name="only-one")
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic, producer_name="only-one")


def test_metrics_count_the_protocol_connections_producers_and_consumers(server: Server) -> None:
    def gauges() -> dict[str, float]:
        text = httpx.get(f"{server.url}/metrics").text
        names = ("pulsar_active_connections", "compactor_pulsar_producers", "compactor_pulsar_consumers")
        return {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.split(" ")[0] in names
        }

    assert gauges() == {
        "pulsar_active_connections": 0,
        "compactor_pulsar_producers": 0,
        "compactor_pulsar_consumers": 0,
    }
    c = pulsar.Client(server.pulsar_url, logger=QUIET)
    try:
        topic = fresh()
        c.create_producer(topic)
        c.subscribe(topic, "a")
        c.create_reader(topic, pulsar.MessageId.earliest)
        assert gauges() == {
            "pulsar_active_connections": 1,
            "compactor_pulsar_producers": 1,
            "compactor_pulsar_consumers": 2,
        }
        # The subscription's stats show its consumer, as for a REST consumer.
        stats = httpx.get(
            f"{server.url}/admin/v2/persistent/{topic.removeprefix('persistent://')}/stats"
        ).json()
        assert len(stats["subscriptions"]["a"]["consumers"]) == 1
    finally:
        c.close()
    deadline = time.monotonic() + 10
    while gauges()["pulsar_active_connections"] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert gauges()["compactor_pulsar_consumers"] == 0


def test_a_consumer_whose_subscription_is_deleted_is_closed_and_comes_back(
    client: pulsar.Client, shared_server: Server
) -> None:
    """The broker closes a consumer whose subscription goes away under it (CLOSE_CONSUMER), and
    the client subscribes again: it never silently stops receiving."""
    topic = fresh("gone")
    path = topic.removeprefix("persistent://")
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"before")
    assert consumer.receive(10_000).data() == b"before"
    r = httpx.delete(f"{shared_server.url}/admin/v2/persistent/{path}/subscription/s")
    assert r.status_code in (200, 204), r.text
    producer.send(b"after")
    # Subscribed again from the earliest message: both come (the acknowledgement went with
    # the deleted subscription).
    got = []
    deadline = time.monotonic() + 30
    while b"after" not in got and time.monotonic() < deadline:
        with contextlib.suppress(pulsar.Timeout):
            got.append(consumer.receive(1000).data())
    assert b"after" in got


def test_unsubscribe_deletes_the_subscription(client: pulsar.Client, shared_server: Server) -> None:
    topic = fresh()
    path = topic.removeprefix("persistent://")
    consumer = client.subscribe(topic, "gone")
    subs = f"{shared_server.url}/admin/v2/persistent/{path}/subscriptions"
    assert "gone" in httpx.get(subs).json()
    consumer.unsubscribe()
    assert "gone" not in httpx.get(subs).json()


def test_a_pattern_consumer_finds_the_namespace_topics(client: pulsar.Client) -> None:
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    topics = [f"persistent://public/default/{prefix}-{i}" for i in range(3)]
    for t in topics:
        client.create_producer(t).close()
    consumer = client.subscribe(
        re.compile(f"persistent://public/default/{prefix}-.*"),
        "s",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    for i, t in enumerate(topics):
        client.create_producer(t, batching_enabled=False).send(f"from {i}".encode())
    got = sorted(m.data() for m in receive_all(consumer, 3))
    assert got == [f"from {i}".encode() for i in range(3)]


def _first_python_snippet(path: Path, after: str) -> str:
    """The first ```python block of ``path`` after the line ``after``."""
    text = path.read_text()
    section = text[text.index(after) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```\n", start)]


DOCS_ROOT = Path(__file__).resolve().parents[2]


def test_the_guide_snippet_runs_as_written(shared_server: Server) -> None:
    """The guide's Pulsar clients page (docs/pulsar-clients.md), its Python client snippet."""
    snippet = _first_python_snippet(DOCS_ROOT / "docs" / "pulsar-clients.md", "## The Python client")
    assert "pulsar://127.0.0.1:6650" in snippet
    code = snippet.replace("pulsar://127.0.0.1:6650", shared_server.pulsar_url)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "order-1 b'42 EUR'" in out.stdout


@pytest.mark.spark
def test_the_readme_tour_runs_as_written(shared_server: Server) -> None:
    """README.md's five-minute tour with pulsar-client: produce, compact over REST, read compacted."""
    snippet = _first_python_snippet(DOCS_ROOT / "README.md", "## A five-minute tour")
    assert "pulsar://127.0.0.1:6650" in snippet and "http://127.0.0.1:8080" in snippet
    topic = fresh("prices").removeprefix("persistent://")
    code = (
        snippet.replace("pulsar://127.0.0.1:6650", shared_server.pulsar_url)
        .replace("http://127.0.0.1:8080", shared_server.url)
        .replace("public/default/prices", topic)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    # What the snippet prints, without the C++ core's log lines (timestamped) on the same stdout.
    printed = [line for line in out.stdout.splitlines() if not re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert printed == ["apple b'1.25'"]


def test_a_string_schema_producer_and_consumer(client: pulsar.Client) -> None:
    topic = fresh("schema")
    string = pulsar.schema.StringSchema()
    consumer = client.subscribe(topic, "s", schema=string, initial_position=pulsar.InitialPosition.Earliest)
    client.create_producer(topic, schema=string, batching_enabled=False).send("text, not bytes")
    assert consumer.receive(10_000).value() == "text, not bytes"


def test_schema_and_consumer_stats_requests_get_their_answers(shared_server: Server) -> None:
    """Commands the client sends without the application asking (AutoConsume's schema lookup,
    consumer stats): each gets its own response type, never a dropped connection."""
    topic = fresh("raw")
    with raw(shared_server) as s:
        connect(s)
        s.sendall(encode(command(pb.BaseCommand.GET_SCHEMA, request_id=7, topic=topic)))
        reply = read_frame(s)
        assert reply.type == pb.BaseCommand.GET_SCHEMA_RESPONSE
        assert (
            reply.getSchemaResponse.request_id == 7 and reply.getSchemaResponse.error_code == pb.TopicNotFound
        )
        s.sendall(
            encode(
                command(
                    pb.BaseCommand.SUBSCRIBE,
                    topic=topic,
                    subscription="s",
                    subType=pb.CommandSubscribe.Exclusive,
                    consumer_id=1,
                    request_id=8,
                )
            )
        )
        assert read_frame(s).type == pb.BaseCommand.SUCCESS
        s.sendall(encode(command(pb.BaseCommand.FLOW, consumer_id=1, messagePermits=5)))
        s.sendall(encode(command(pb.BaseCommand.CONSUMER_STATS, request_id=9, consumer_id=1)))
        stats = read_frame(s)
        assert stats.type == pb.BaseCommand.CONSUMER_STATS_RESPONSE
        assert stats.consumerStatsResponse.availablePermits == 5


# ------------------------------------------------------------------ bad input on the wire


def _closed(s: socket.socket) -> bool:
    """Whether the server closes the connection (within the socket's timeout)."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x08\x00\x00\x00\x04\xde\xad\xbe\xef",  # not protobuf
        b"\xff\xff\xff\xff",  # a frame over the limit
        encode(command(pb.BaseCommand.PING)),  # a command before CONNECT
    ],
)
def test_garbage_closes_the_connection_and_the_listener_goes_on(
    shared_server: Server, client: pulsar.Client, garbage: bytes
) -> None:
    with raw(shared_server) as s:
        s.sendall(garbage)
        assert _closed(s)
    producer = client.create_producer(fresh(), batching_enabled=False)
    assert producer.send(b"still serving") is not None


def test_a_send_with_a_wrong_checksum_is_not_stored(shared_server: Server, client: pulsar.Client) -> None:
    topic = fresh("crc")
    client.create_producer(topic).close()  # the topic exists, empty
    with raw(shared_server) as s:
        connect(s)
        s.sendall(encode(command(pb.BaseCommand.PRODUCER, topic=topic, producer_id=1, request_id=1)))
        time.sleep(0.5)
        md = pb.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1)
        frame = bytearray(
            encode_payload(
                command(pb.BaseCommand.SEND, producer_id=1, sequence_id=0), md.SerializeToString(), b"damaged"
            )
        )
        frame[-1] ^= 0x01
        s.sendall(bytes(frame))
        assert _closed(s)
    assert rest_messages(shared_server, topic) == []


def test_a_half_sent_frame_and_a_dropped_connection_leave_nothing(
    shared_server: Server, client: pulsar.Client
) -> None:
    topic = fresh("half")
    client.create_producer(topic).close()
    with raw(shared_server) as s:
        connect(s)
        s.sendall(encode(command(pb.BaseCommand.PRODUCER, topic=topic, producer_id=1, request_id=1)))
        md = pb.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1)
        frame = encode_payload(
            command(pb.BaseCommand.SEND, producer_id=1, sequence_id=0), md.SerializeToString(), b"x" * 100
        )
        s.sendall(frame[: len(frame) // 2])
    time.sleep(0.3)
    assert rest_messages(shared_server, topic) == []
    assert client.create_producer(topic, batching_enabled=False).send(b"after") is not None


# ------------------------------------------------------------------ security


def test_tokens_and_permissions_as_over_rest(secure_server: SecureServer) -> None:
    url = secure_server.server.pulsar_url
    admin = {"Authorization": f"Bearer {secure_server.token(SUPERUSER)}"}
    tenant = f"wire{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=secure_server.url, headers=admin, timeout=30) as http:
        assert http.put(
            f"/admin/v2/tenants/{tenant}", json={"adminRoles": [], "allowedClusters": []}
        ).status_code in (
            200,
            204,
        )
        assert http.put(f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
        r = http.post(f"/admin/v2/namespaces/{tenant}/ns/permissions/writer", json=["produce"])
        assert r.status_code == 204, r.text
    topic = f"persistent://{tenant}/ns/t"

    anonymous = pulsar.Client(url, operation_timeout_seconds=5, logger=QUIET)
    try:
        with pytest.raises(pulsar.PulsarException):  # no token: the connection is refused
            anonymous.create_producer(topic)
    finally:
        anonymous.close()

    def as_role(role: str) -> pulsar.Client:
        return pulsar.Client(
            url, authentication=pulsar.AuthenticationToken(secure_server.token(role)), logger=QUIET
        )

    reader = as_role("reader")
    try:
        with pytest.raises(pulsar.PulsarException):  # no grant on the namespace
            reader.create_producer(topic)
    finally:
        reader.close()
    writer = as_role("writer")
    try:
        assert writer.create_producer(topic, batching_enabled=False).send(b"granted") is not None
        with pytest.raises(pulsar.PulsarException):  # produce only: no consume grant
            writer.subscribe(topic, "s")
    finally:
        writer.close()


def test_delayed_delivery_holds_a_message_for_a_shared_subscription(client: pulsar.Client) -> None:
    topic = fresh("delayed")
    shared = client.subscribe(
        topic,
        "shared",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    exclusive = client.subscribe(topic, "exclusive", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    sent_at = time.monotonic()
    producer.send(b"later", deliver_after=datetime.timedelta(seconds=2))
    producer.send(b"now")
    # A Shared subscription gets it once its time has come, after what was sent after it.
    assert shared.receive(5000).data() == b"now"
    later = shared.receive(10_000)
    assert later.data() == b"later" and time.monotonic() - sent_at >= 1.9
    shared.acknowledge(later)
    # Pulsar's rule: an Exclusive subscription is not delayed.
    assert [m.data() for m in receive_all(exclusive, 2)] == [b"later", b"now"]
