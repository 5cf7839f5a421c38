"""Partitioned topics at Pulsar's admin paths, and the official ``pulsar-client`` routing over
their partitions, against a real ``compactor serve``."""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pulsar
import pytest

from api.client import (
    AsyncClient,
    AsyncMultiTopicConsumer,
    Client,
    HashingScheme,
    MessageId,
    MultiTopicConsumer,
    OutgoingMessage,
    PartitionsRoutingMode,
    Timeout,
)
from api.client.routing import key_partition
from tests.conftest import Server
from tests.e2e.conftest import QUIET
from tests.e2e.partitioned import ADMIN, fresh, full, partitioned
from tests.server import ServerProcess

pytestmark = [pytest.mark.e2e]


def test_create_describe_grow_and_delete(http: httpx.Client) -> None:
    name = partitioned(http, 3)
    assert http.get(f"{ADMIN}/{name}/partitions").json() == {"partitions": 3}
    assert full(name) in http.get(f"{ADMIN}/partitioned").json()
    topics = http.get(ADMIN).json()
    assert {full(f"{name}-partition-{i}") for i in range(3)} <= set(topics)
    assert full(name) not in topics  # Pulsar lists the partitions, not the partitioned topic
    assert http.post(f"{ADMIN}/{name}/partitions", json=5).status_code == 204
    assert http.get(f"{ADMIN}/{name}/partitions").json() == {"partitions": 5}
    assert full(f"{name}-partition-4") in http.get(ADMIN).json()
    stats = http.get(f"{ADMIN}/{name}/partitioned-stats").json()
    assert stats["metadata"] == {"partitions": 5} and len(stats["partitions"]) == 5
    internal = http.get(f"{ADMIN}/{name}/partitioned-internalStats").json()
    assert set(internal["partitions"]) == {full(f"{name}-partition-{i}") for i in range(5)}
    assert http.delete(f"{ADMIN}/{name}/partitions").status_code == 204
    assert http.get(f"{ADMIN}/{name}/partitions").json() == {"partitions": 0}
    assert not [t for t in http.get(ADMIN).json() if t.startswith(full(name))]


def test_bad_partitioned_requests_change_nothing(http: httpx.Client) -> None:
    name = partitioned(http, 2)
    plain = fresh("plain")
    assert http.put(f"{ADMIN}/{plain}").status_code == 204
    before = (http.get(ADMIN).json(), http.get(f"{ADMIN}/partitioned").json())
    cases = [
        ("put", f"{ADMIN}/{name}/partitions", 4, 409),  # exists
        ("put", f"{ADMIN}/{plain}/partitions", 4, 409),  # a plain topic of that name
        ("put", f"{ADMIN}/{fresh()}/partitions", 0, 422),
        ("put", f"{ADMIN}/{fresh()}/partitions", -3, 422),
        ("put", f"{ADMIN}/{fresh()}/partitions", 100_000, 400),  # above the limit
        ("put", f"{ADMIN}/{fresh()}-partition-1/partitions", 2, 409),  # a partition's name
        ("post", f"{ADMIN}/{name}/partitions", 1, 409),  # never shrinks
        ("post", f"{ADMIN}/{name}/partitions", 2, 409),
        ("post", f"{ADMIN}/{fresh()}/partitions", 3, 404),
        ("put", f"{ADMIN}/{name}", None, 409),  # a plain topic named as the partitioned topic
        ("put", f"{ADMIN}/{name}-partition-7", None, 404),  # no such partition
        ("put", f"{ADMIN}/{fresh()}-partition-0", None, 409),  # a partition of nothing
        ("delete", f"{ADMIN}/{fresh()}/partitions", None, 404),
        ("get", f"{ADMIN}/{fresh()}/partitioned-stats", None, 404),
    ]
    for method, path, body, status in cases:
        r = http.request(method.upper(), path, json=body)
        assert r.status_code == status, (method, path, body, r.status_code, r.text)
        assert r.json()["reason"], r.text
    assert (http.get(ADMIN).json(), http.get(f"{ADMIN}/partitioned").json()) == before


@pytest.mark.parametrize(
    "mode",
    [
        pulsar.PartitionsRoutingMode.RoundRobinDistribution,
        pulsar.PartitionsRoutingMode.UseSinglePartition,
        pulsar.PartitionsRoutingMode.CustomPartition,
    ],
    ids=["round-robin", "single-partition", "custom"],
)
def test_the_client_routes_by_key_and_a_consumer_reads_every_partition(
    http: httpx.Client, client: pulsar.Client, mode: pulsar.PartitionsRoutingMode
) -> None:
    name = partitioned(http, 4)
    consumer = client.subscribe(full(name), "s", initial_position=pulsar.InitialPosition.Earliest)
    custom = {}
    if mode == pulsar.PartitionsRoutingMode.CustomPartition:  # keyed to 2, keyless to 3
        custom["message_router"] = lambda m, n: (len(m.partition_key()) if m.partition_key() else 3) % n
    producer = client.create_producer(full(name), message_routing_mode=mode, batching_enabled=False, **custom)
    sent = {}
    for i in range(80):
        key = f"k{i % 10}" if i % 5 else None  # keyless ones follow the routing mode
        producer.send(f"{i}".encode(), partition_key=key)
        sent[f"{i}".encode()] = key
    got = [consumer.receive(10_000) for _ in range(80)]
    assert sorted(m.data() for m in got) == sorted(sent)
    where: dict[str, set[str]] = {}
    for m in got:
        assert m.topic_name().startswith(full(name) + "-partition-")
        if m.partition_key():
            where.setdefault(m.partition_key(), set()).add(m.topic_name())
    assert all(len(topics) == 1 for topics in where.values()), where  # a key stays in one partition
    if mode == pulsar.PartitionsRoutingMode.RoundRobinDistribution:
        assert len({m.topic_name() for m in got}) > 1  # keys spread over the partitions
    if mode == pulsar.PartitionsRoutingMode.CustomPartition:  # the router chose, keyed or not
        assert all(
            m.topic_name().endswith("-partition-2" if m.partition_key() else "-partition-3") for m in got
        )


def test_compacting_a_partitioned_topic_compacts_every_partition(
    http: httpx.Client, client: pulsar.Client
) -> None:
    name = partitioned(http, 3)
    producer = client.create_producer(full(name), batching_enabled=True)
    latest: dict[str, bytes] = {}
    for i in range(60):
        key, value = f"k{i % 12}", f"v{i}".encode()
        if i in (50, 57):
            value = b""  # a delete (Pulsar's rule)
        producer.send_async(value, None, partition_key=key)
        if value:
            latest[key] = value
        else:
            latest.pop(key, None)
    producer.flush()
    assert http.put(f"{ADMIN}/{name}/compaction").status_code == 204
    deadline = time.monotonic() + 180
    while (body := http.get(f"{ADMIN}/{name}/compaction").json())["status"] == "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert body["status"] == "SUCCESS", body
    assert set(body["partitions"]) == {f"{name}-partition-{i}" for i in range(3)}
    consumer = client.subscribe(
        full(name),
        "compacted",
        is_read_compacted=True,
        initial_position=pulsar.InitialPosition.Earliest,
        batch_index_ack_enabled=True,
    )
    got = {}
    while True:
        try:
            m = consumer.receive(1_500)
        except pulsar.Timeout:
            break
        got[m.partition_key()] = m.data()
    assert got == latest
    # A TableView covers every partition: the latest value of each key.
    table = client.create_table_view(full(name))
    try:
        deadline = time.monotonic() + 10
        while len(table) < len(latest) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {k: table.get(k) for k in latest} == latest
    finally:
        table.close()


def test_a_reader_of_one_partition_and_a_pattern_consumer(http: httpx.Client, client: pulsar.Client) -> None:
    name = partitioned(http, 2)
    producer = client.create_producer(full(name), batching_enabled=False)
    for i in range(20):
        producer.send(f"{i}".encode(), partition_key=f"k{i}")
    reader = client.create_reader(full(f"{name}-partition-1"), pulsar.MessageId.earliest)
    one = []
    while reader.has_message_available():
        one.append(reader.read_next(5_000))
    assert one and all(m.topic_name() == full(f"{name}-partition-1") for m in one)
    pattern = client.subscribe(
        # The client names a partitioned topic by its base name (it folds the partitions the
        # namespace lists into it), so a pattern matches that.
        re.compile(f"persistent://public/default/{name}.*"),
        "pattern",
        initial_position=pulsar.InitialPosition.Earliest,
        pattern_auto_discovery_period=1,
    )
    got = sorted(int(pattern.receive(10_000).data()) for _ in range(20))
    assert got == list(range(20))


def test_growing_the_partition_count_while_producing(http: httpx.Client, client: pulsar.Client) -> None:
    name = partitioned(http, 2)
    # The client looks for new partitions every 60 s (its default; the Python client has no
    # setting for it): the producer that was producing before the growth uses them after.
    producer = client.create_producer(full(name), batching_enabled=False)
    for i in range(20):
        producer.send(f"a{i}".encode(), partition_key=f"k{i}")
    assert http.post(f"{ADMIN}/{name}/partitions", json=4).status_code == 204
    deadline = time.monotonic() + 90
    used: set[str] = set()
    n = 0
    consumer = client.subscribe(full(name), "s", initial_position=pulsar.InitialPosition.Earliest)
    while time.monotonic() < deadline and not {f"{name}-partition-2", f"{name}-partition-3"} & used:
        producer.send(f"b{n}".encode(), partition_key=f"k{n}")
        n += 1
        time.sleep(0.25)
        used = {t.rsplit("/", 1)[1] for t in _topics_with_messages(http, name, 4)}
    assert {f"{name}-partition-2", f"{name}-partition-3"} & used, "the producer never used the new partitions"
    assert len({consumer.receive(10_000).data() for _ in range(20 + n)}) == 20 + n


def _topics_with_messages(http: httpx.Client, name: str, n: int) -> list[str]:
    stats = http.get(f"{ADMIN}/{name}/partitioned-stats").json()["partitions"]
    return [t for t, s in stats.items() if s["msgInCounter"] > 0]


def test_rest_produce_routes_a_key_where_the_official_client_does(
    http: httpx.Client, client: pulsar.Client
) -> None:
    """The same key lands in the same partition whichever client sent it: REST produce uses the
    official client's default router (its hash of the key; keyless messages in turn)."""
    name = partitioned(http, 7)
    keys = [f"customer-{i}" for i in range(40)] + ["κλειδί", "x" * 23, "a"]
    producer = client.create_producer(full(name), batching_enabled=False)
    for key in keys:
        producer.send(b"wire", partition_key=key)
    consumer = client.subscribe(full(name), "s", initial_position=pulsar.InitialPosition.Earliest)
    by_client = {}
    for _ in keys:
        m = consumer.receive(10_000)
        by_client[m.partition_key()] = int(m.topic_name().rsplit("-", 1)[1])
    body = {"messages": [{"key": k, "value": "AA=="} for k in keys] + [{"value": "AA=="}] * 14}
    r = http.post(f"/topics/persistent/public/default/{name}", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert dict(zip(keys, out["partitions"], strict=False)) == by_client
    assert sorted(out["partitions"][len(keys) :]) == sorted(list(range(7)) * 2)  # keyless: in turn
    # Each id is its partition's: reading that partition by REST finds the message there.
    first = out["messageIds"][0]
    msgs = http.get(
        f"/topics/persistent/public/default/{name}-partition-{out['partitions'][0]}/messages",
        params={"maxMessages": 1000},
    ).json()["messages"]
    assert first in {m["messageId"] for m in msgs}


def test_a_consumer_waiting_on_a_hundred_partitions_holds_no_worker_thread(tmp_path) -> None:
    # 8 worker threads (the fewest allowed) and an idle consumer of 100 partitions: if each
    # waiting partition held a thread, the producer below would queue behind them past the
    # client's timeouts.
    server = ServerProcess(tmp_path / "data", env={"COMPACTOR_WORKER_THREADS": "8"})
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            name = partitioned(http, 100)
            c = pulsar.Client(server.pulsar_url, operation_timeout_seconds=15, logger=QUIET)
            try:
                consumer = c.subscribe(full(name), "s", initial_position=pulsar.InitialPosition.Earliest)
                time.sleep(2)  # every partition's consumer is waiting now
                assert http.get("/health").status_code == 200
                producer = c.create_producer(full(name), batching_enabled=False)
                for i in range(20):
                    producer.send(f"{i}".encode(), partition_key=f"k{i}")
                got = sorted(consumer.receive(10_000).data() for _ in range(20))
                assert got == sorted(f"{i}".encode() for i in range(20))
            finally:
                c.close()
    finally:
        server.stop()


# ------------------------------------------------------------------ the project's own client


def test_the_project_client_produces_to_partitions_and_consumes_them_all_in_key_order(
    http: httpx.Client, shared_server: Server
) -> None:
    name = partitioned(http, 3)
    with Client(shared_server.url) as c:
        producer = c.create_producer(full(name))
        sent: list[tuple[str | None, bytes]] = []
        for i in range(60):
            key = f"k{i % 7}" if i % 6 else None
            producer.send(f"{i}".encode(), key=key)
            sent.append((key, f"{i}".encode()))
        consumer = c.subscribe(full(name), "s", initial_position="earliest")
        assert isinstance(consumer, MultiTopicConsumer) and len(consumer.topics()) == 3
        got = [consumer.receive(10_000) for _ in range(60)]
        assert sorted(m.value() for m in got) == sorted(v for _, v in sent)  # type: ignore[type-var]
        where: dict[str, set[str]] = {}
        for m in got:
            if m.key() is not None:
                where.setdefault(m.key(), set()).add(m.topic)  # type: ignore[arg-type]
        assert all(len(t) == 1 for t in where.values())  # a key is in one partition
        for key in where:  # and its messages come in the order they were sent
            assert [m.value() for m in got if m.key() == key] == [v for k, v in sent if k == key]
        assert len({m.topic for m in got}) == 3
        # Acknowledged in each partition (bare ids too): nothing comes again.
        consumer.acknowledge_many([m.message_id() for m in got[:30]] + got[30:])  # type: ignore[operator]
        consumer.close()
        again = c.subscribe(full(name), "s", negative_ack_redelivery_delay_ms=0)
        with pytest.raises(Timeout):
            again.receive(500)
        # A negative ack redelivers from its own partition.
        producer.send(b"late", key="k1")
        late = again.receive(10_000)
        again.negative_acknowledge(late)
        assert again.receive(10_000).value() == b"late"
        # Seeking to the earliest message seeks every partition; unsubscribing removes the
        # subscription from each.
        again.seek(MessageId.earliest)
        assert len({again.receive(10_000).value() for _ in range(61)}) == 61
        again.unsubscribe()
        for i in range(3):
            assert "s" not in http.get(f"{ADMIN}/{name}-partition-{i}/subscriptions").json()


def test_the_project_client_reads_compacted_partitions_and_a_table_view_covers_them(
    http: httpx.Client, shared_server: Server
) -> None:
    name = partitioned(http, 4)
    latest: dict[str, bytes] = {}
    with Client(shared_server.url) as c:
        producer = c.create_producer(full(name))
        for i in range(80):
            key, value = f"k{i % 15}", f"v{i}".encode()
            deleted = i in (71, 77)
            producer.send(None if deleted else value, key=key)
            if deleted:
                latest.pop(key, None)
            else:
                latest[key] = value
        c.admin.topics.compact(full(name))
        assert c.admin.topics.wait_for_compaction(full(name), timeout=180).status == "SUCCESS"
        consumer = c.subscribe(full(name), "compacted", read_compacted=True, initial_position="earliest")
        got = {}
        while True:
            try:
                m = consumer.receive(1_000)
            except Timeout:
                break
            got[m.key()] = m.value()
        assert got == latest  # the latest value of each key, deleted keys gone, over every partition
        consumer.close()
        with c.create_table_view(full(name)) as table:
            assert {k: table.get(k) for k in latest} == latest and len(table) == len(latest)
            producer.send(b"new", key="k0")
            assert table.refresh() == 1 and table.get("k0") == b"new"
        # A reader of one partition reads that partition's messages only, in order.
        reader = c.create_reader(f"{full(name)}-partition-1", MessageId.earliest, read_compacted=True)
        one = [m for m in reader]
        reader.close()
        assert one and {m.topic for m in one} == {f"{full(name)}-partition-1"}
        assert [m.id for m in one] == sorted(m.id for m in one)
        assert {m.key(): m.value() for m in one}.items() <= {**latest, "k0": b"new"}.items()


def test_the_project_client_follows_a_growing_partition_count(
    http: httpx.Client, shared_server: Server
) -> None:
    name = partitioned(http, 2)
    with Client(shared_server.url) as c:
        consumer = c.subscribe(full(name), "s", partitions_update_interval_s=0.2)
        assert isinstance(consumer, MultiTopicConsumer) and len(consumer.topics()) == 2
        assert http.post(f"{ADMIN}/{name}/partitions", json=5).status_code == 204
        producer = c.create_producer(full(name))
        # Keys that land in every partition, the new ones included (the service routes them).
        for i in range(40):
            producer.send(f"{i}".encode(), key=f"grow-{i}")
        got = {consumer.receive(10_000).value() for _ in range(40)}
        assert got == {f"{i}".encode() for i in range(40)}
        assert len(consumer.topics()) == 5
        consumer.close()


def test_the_project_async_client_consumes_every_partition(http: httpx.Client, shared_server: Server) -> None:
    name = partitioned(http, 2)

    async def run() -> list[bytes]:
        async with AsyncClient(shared_server.url) as c:
            producer = await c.create_producer(full(name), hashing_scheme=HashingScheme.JavaStringHash)
            consumer = await c.subscribe(full(name), "s", subscription_type="Shared")
            assert isinstance(consumer, AsyncMultiTopicConsumer)
            for i in range(20):
                await producer.send(f"{i}".encode(), key=f"k{i}")
            got = [await consumer.receive(10_000) for _ in range(20)]
            assert all(_index(m.topic) == key_partition(m.key(), 2, "JavaStringHash") for m in got)  # type: ignore[arg-type]
            await consumer.acknowledge_many(got)
            await consumer.close()
            return [m.value() for m in got]  # type: ignore[misc]

    # On a thread of its own: a test before this one in the process may leave its thread's
    # event loop marked running, and asyncio.run refuses to start under it.
    with ThreadPoolExecutor(1) as thread:
        got = thread.submit(asyncio.run, run()).result()
    assert sorted(got) == sorted(f"{i}".encode() for i in range(20))


def _index(topic: str) -> int:
    return int(topic.rsplit("-", 1)[1])


@pytest.mark.parametrize("scheme", ["BoostHash", "JavaStringHash", "Murmur3_32Hash"])
def test_the_project_client_hashes_a_key_to_one_partition_by_each_scheme(
    http: httpx.Client, client: pulsar.Client, shared_server: Server, scheme: str
) -> None:
    """Under each hashing scheme a key lands in the partition Pulsar's clients choose (the
    hashes are checked against the clients' own test values in ``tests/service``); under the
    default, where the official Python client sends it."""
    name = partitioned(http, 7)
    keys = [f"customer-{i}" for i in range(30)] + ["κλειδί", "x" * 23, "a", "abc", "abcd", "ÿ-high-bytes"]
    if scheme == "BoostHash":  # the only scheme the official Python client offers
        wire = client.create_producer(full(name), batching_enabled=False)
        for key in keys:
            wire.send(b"wire", partition_key=key)
    with Client(shared_server.url) as c:
        ours = c.create_producer(full(name), hashing_scheme=scheme)
        ours.send_many([OutgoingMessage(b"rest", key=k) for k in keys])
        consumer = c.subscribe(full(name), "s", initial_position="earliest")
        got = [consumer.receive(10_000) for _ in range(len(keys) * (2 if scheme == "BoostHash" else 1))]
    by_rest = {m.key(): _index(m.topic) for m in got if m.value() == b"rest"}
    assert by_rest == {k: key_partition(k, 7, scheme) for k in keys}
    assert len(set(by_rest.values())) > 3  # spread over the partitions
    if scheme == "BoostHash":
        assert {m.key(): _index(m.topic) for m in got if m.value() == b"wire"} == by_rest


def test_the_project_client_routes_by_each_mode_and_refuses_bad_routing(
    http: httpx.Client, shared_server: Server
) -> None:
    name = partitioned(http, 4)
    with Client(shared_server.url) as c:
        single = c.create_producer(full(name), message_routing_mode=PartitionsRoutingMode.UseSinglePartition)
        single.send_many([b"s1", b"s2", b"s3", ("k1", b"sk")])
        custom = c.create_producer(
            full(name),
            message_routing_mode=PartitionsRoutingMode.CustomPartition,
            message_router=lambda m, n: n - 1 if m.key is None else 0,
        )
        ids = custom.send_many([b"c1", ("k2", b"ck"), b"c2"])
        assert ids[0] < ids[2]  # in the order sent, across the partitions written
        spread = c.create_producer(full(name), hashing_scheme=HashingScheme.Murmur3_32Hash)
        spread.send_many([b"r1", b"r2", b"r3", b"r4"])
        consumer = c.subscribe(full(name), "s", initial_position="earliest")
        got = {m.value(): _index(m.topic) for m in (consumer.receive(10_000) for _ in range(11))}
        assert len({got[v] for v in (b"s1", b"s2", b"s3")}) == 1  # keyless: one partition
        assert got[b"sk"] == key_partition("k1", 4)  # keyed: its hash, in every mode
        assert (got[b"c1"], got[b"c2"], got[b"ck"]) == (3, 3, 0)  # the router's choice
        assert sorted(got[v] for v in (b"r1", b"r2", b"r3", b"r4")) == [0, 1, 2, 3]  # in turn
        # Bad settings are refused when the producer is made; a bad choice before anything is sent.
        with pytest.raises(ValueError, match="routing mode"):
            c.create_producer(full(name), message_routing_mode="Sticky")
        with pytest.raises(ValueError, match="hashing scheme"):
            c.create_producer(full(name), hashing_scheme="Md5")
        with pytest.raises(ValueError, match="CustomPartition"):
            c.create_producer(full(name), message_router=lambda m, n: 0)
        wrong = c.create_producer(
            full(name),
            message_routing_mode=PartitionsRoutingMode.CustomPartition,
            message_router=lambda m, n: n if m.value == b"x" else 0,
        )
        with pytest.raises(ValueError, match="0..3"):
            wrong.send_many([b"fine", b"x"])
        with pytest.raises(Timeout):
            consumer.receive(300)  # nothing of the refused batch was stored


def test_the_project_client_subscribes_to_a_pattern_and_to_a_list_of_topics(
    http: httpx.Client, shared_server: Server
) -> None:
    prefix = fresh("pat")
    a, b, late, other = f"{prefix}-a", f"{prefix}-b", f"{prefix}-late", fresh("other")
    assert http.put(f"{ADMIN}/{a}/partitions", json=2).status_code == 204
    for t in (b, other):
        assert http.put(f"{ADMIN}/{t}").status_code == 204
    with Client(shared_server.url) as c:
        consumer = c.subscribe(
            re.compile(f"persistent://public/default/{prefix}-.*"),
            "s",
            initial_position="earliest",
            pattern_auto_discovery_period=0.2,
        )
        assert isinstance(consumer, MultiTopicConsumer)
        assert sorted(consumer.topics()) == [full(f"{a}-partition-0"), full(f"{a}-partition-1"), full(b)]
        for t in (a, b, other):
            c.create_producer(full(t)).send_many([(f"k{i}", f"{t}/{i}".encode()) for i in range(5)])
        got = [consumer.receive(10_000) for _ in range(10)]
        assert sorted(m.value() for m in got) == sorted(f"{t}/{i}".encode() for t in (a, b) for i in range(5))
        consumer.acknowledge_many(got)
        with pytest.raises(Timeout):
            consumer.receive(500)  # the topic the pattern does not match is not read
        # A topic created later that matches is found, and read from its earliest message.
        assert http.put(f"{ADMIN}/{late}").status_code == 204
        c.create_producer(full(late)).send(b"late", key="x")
        assert consumer.receive(10_000).value() == b"late"
        # A topic deleted is let go.
        assert http.delete(f"{ADMIN}/{b}").status_code == 204
        deadline = time.monotonic() + 10
        while full(b) in consumer.topics() and time.monotonic() < deadline:
            with pytest.raises(Timeout):
                consumer.receive(100)
        assert full(b) not in consumer.topics()
        consumer.close()
        # A list of topics: every partition of a partitioned one, and the plain ones.
        listed = c.subscribe([full(a), full(other)], "l", initial_position="earliest")
        assert isinstance(listed, MultiTopicConsumer) and listed.topic() == f"{full(a)},{full(other)}"
        assert len(listed.topics()) == 3
        values = sorted(listed.receive(10_000).value() for _ in range(10))  # type: ignore[type-var]
        assert values == sorted(f"{t}/{i}".encode() for t in (a, other) for i in range(5))
        listed.close()
        with pytest.raises(ValueError, match="tenant and namespace"):
            c.subscribe(re.compile("persistent://public/.*/x"), "s")
        # A pattern that matches nothing yet waits for its first topic.
        empty = c.subscribe(
            re.compile(f"persistent://public/default/{prefix}-none-.*"),
            "e",
            consumer_name="watcher",
            pattern_auto_discovery_period=0.2,
        )
        assert isinstance(empty, MultiTopicConsumer) and empty.topics() == []
        assert (empty.subscription_name(), empty.consumer_name()) == ("e", "watcher")
        with pytest.raises(Timeout):
            empty.receive(300)
        assert http.put(f"{ADMIN}/{prefix}-none-1").status_code == 204
        c.create_producer(full(f"{prefix}-none-1")).send(b"first")
        assert empty.receive(10_000).value() == b"first"
        empty.close()
