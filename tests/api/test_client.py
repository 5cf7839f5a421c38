"""The sync client against a real ``compactor serve``: producers, readers, consumers, table
views, admin, compaction and the error tree. One server for the module; each test its topics."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from api.client import (
    AlreadyClosed,
    BadRequest,
    Client,
    ClientError,
    CompactionStatus,
    Conflict,
    ConsumerBusy,
    Message,
    MessageId,
    NotFound,
    OutgoingMessage,
    ServerError,
    Timeout,
    TooLarge,
    TransportError,
)
from tests.conftest import SHARED_MAX_MESSAGE_SIZE, Server
from tests.server import free_port

pytestmark = pytest.mark.e2e

MAX_MESSAGE_SIZE = SHARED_MAX_MESSAGE_SIZE


@pytest.fixture
def srv(shared_server: Server) -> Server:
    return shared_server


@pytest.fixture
def client(srv: Server) -> Iterator[Client]:
    with Client(srv.url, timeout=20) as c:
        yield c


def new_topic(client: Client, name: str) -> str:
    topic = f"persistent://public/default/{name}"
    client.admin.topics.create(topic)
    return topic


class CountingTransport(httpx.HTTPTransport):
    """The real HTTP transport, remembering what went over it."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return super().handle_request(request)


def test_message_id_is_an_ordered_serialisable_value() -> None:
    a, b = MessageId(3, 9), MessageId.parse("4:0")
    assert a < b and str(a) == "3:9" and MessageId.parse(str(a)) == a
    assert MessageId.earliest < MessageId(0, 0) < b < MessageId.latest
    assert (str(MessageId.earliest), str(MessageId.latest)) == ("earliest", "latest")
    assert MessageId.parse("earliest") is MessageId.earliest
    for mid in (a, MessageId.earliest, MessageId.latest):
        assert MessageId.deserialize(mid.serialize()) == mid
    assert len({MessageId(1, 2), MessageId(1, 2)}) == 1
    # A Pulsar batch's member: written as its batch's entry and its index, the same message
    # (and position) as the entry it is stored at.
    member = MessageId.parse("1:2:3")
    assert (member, member.batch_index, str(member)) == (MessageId(1, 5), 3, "1:2:3")
    assert MessageId(1, 4) < member < MessageId(1, 6)
    assert MessageId.deserialize(member.serialize()) == member
    for bad in ("1", "1:x", "-1:0", ":", "1:2:3:4", "1:2:", ""):
        with pytest.raises(ValueError):
            MessageId.parse(bad)
    with pytest.raises(ValueError):
        MessageId(1, 2, batch_index=3)  # a batch cannot start before entry 0
    with pytest.raises(ValueError):
        MessageId.deserialize(b"\x00" * 3)
    with pytest.raises(AttributeError):
        a.ledger_id = 5  # type: ignore[misc]


def test_producer_ids_in_order_and_reader_pages_through(srv: Server) -> None:
    transport = CountingTransport()
    with Client(srv.url, transport=transport) as client:
        topic = new_topic(client, "paging")
        producer = client.create_producer(topic)
        first = producer.send("v0", key="k0", properties={"p": "1"}, event_timestamp=1234)
        n = 2500
        items: list[object] = []
        for i in range(1, n):
            form = i % 4
            if form == 0:
                items.append(OutgoingMessage(f"v{i}".encode(), key=f"k{i}"))
            elif form == 1:
                items.append((f"k{i}", f"v{i}"))
            elif form == 2:
                items.append({"key": f"k{i}", "value": f"v{i}".encode(), "properties": {"i": str(i)}})
            else:
                items.append(f"v{i}")  # no key
        transport.requests.clear()
        rest = producer.send_many(items)  # type: ignore[arg-type]
        ids = [first, *rest]
        assert len(ids) == n and ids == sorted(ids) and len(set(ids)) == n
        posts = [json.loads(r.content) for r in transport.requests if r.method == "POST"]
        assert [len(p["messages"]) for p in posts] == [1000, 1000, n - 2001]

        # Every message, in order, across 25 pages of 100.
        transport.requests.clear()
        reader = client.create_reader(topic, MessageId.earliest, receiver_queue_size=100)
        got = list(reader)
        assert [m.message_id() for m in got] == ids
        assert len([r for r in transport.requests if r.method == "GET"]) >= n // 100
        m0 = got[0]
        assert (m0.key(), m0.value(), m0.data(), m0.properties()) == ("k0", b"v0", b"v0", {"p": "1"})
        assert m0.event_timestamp() == 1234 and m0.publish_timestamp() > 0 and m0.redelivery_count() == 0
        assert m0.topic_name() == topic and m0.id == first and m0.partition_key == "k0"
        assert got[2].properties() == {"i": "2"} and got[3].key() is None and got[3].value() == b"v3"
        assert not reader.has_message_available()
        with pytest.raises(Timeout):
            reader.read_next(timeout_millis=100)

        # From an id in the middle: exclusive by default (as Pulsar), inclusive on request.
        mid = ids[1234]
        assert client.create_reader(topic, mid).read_next().message_id() == ids[1235]
        inclusive = client.create_reader(topic, str(mid), start_message_id_inclusive=True)
        assert [m.message_id() for m in inclusive] == ids[1234:]
        stored = MessageId.deserialize(ids[2497].serialize())
        assert [m.message_id() for m in client.create_reader(topic, stored)] == ids[2498:]

        # seek, and a reader that waits for a message produced while it waits.
        reader.seek(ids[10])
        assert reader.read_next(timeout_millis=1000).message_id() == ids[11]
        latest = client.create_reader(topic, MessageId.latest)
        assert not latest.has_message_available()
        timer = threading.Timer(0.3, lambda: producer.send(b"late", key="late"))
        timer.start()
        late = latest.read_next(timeout_millis=10_000)
        timer.join()
        assert (late.key(), late.value()) == ("late", b"late") and late.message_id() > ids[-1]
        assert reader.has_message_available()  # the old reader sees it too, after the rest
        producer.close()
        reader.close()
        with pytest.raises(AlreadyClosed):
            producer.send(b"x")
        with pytest.raises(AlreadyClosed):
            reader.read_next()


def test_table_view_is_the_latest_value_of_every_key(client: Client) -> None:
    topic = new_topic(client, "table")
    producer = client.create_producer(topic)
    model: dict[str, bytes] = {}

    def send(pairs: list[tuple[str | None, bytes | None]]) -> None:
        producer.send_many(pairs)  # type: ignore[arg-type]
        for k, v in pairs:
            if k is None:
                continue  # keyless: not in the table
            if not v:  # null or empty: a delete, as in Pulsar
                model.pop(k, None)
            else:
                model[k] = v

    send([("a", b"1"), ("b", b"1"), ("c", b"1"), ("a", b"2"), (None, b"keyless"), ("b", None), ("d", None)])
    send([("x", b"1"), ("x", b""), (None, b"")])
    view = client.create_table_view(topic, poll_interval=0.05)
    assert view.to_dict() == model == {"a": b"2", "c": b"1"}
    assert len(view) == 2 and "a" in view and "b" not in view and view.get("b") is None
    assert view["a"] == b"2" and sorted(view.keys()) == ["a", "c"] and sorted(view) == ["a", "c"]
    assert sorted(view.items()) == [("a", b"2"), ("c", b"1")] and sorted(view.values()) == [b"1", b"2"]
    with pytest.raises(KeyError):
        view["b"]
    seen: list[tuple[str, bytes]] = []
    view.for_each(lambda k, v: seen.append((k, v)))
    assert sorted(seen) == sorted(model.items())

    updates: list[tuple[str, bytes | None]] = []
    view.listen(lambda k, v: updates.append((k, v)))
    send([("c", None), ("e", b"5"), ("a", b"3"), ("e", b"")])
    assert view.refresh() == 4
    assert view.to_dict() == model and updates == [("c", None), ("e", b"5"), ("a", b"3"), ("e", None)]
    assert view.refresh() == 0

    # Following in the background.
    view.start()
    send([("f", b"6"), ("e", None), ("a", b"4")])
    deadline = time.monotonic() + 10
    while view.to_dict() != model and time.monotonic() < deadline:
        time.sleep(0.02)
    assert view.to_dict() == model and view.last_error is None
    view.close()
    send([("g", b"7")])
    time.sleep(0.2)
    assert "g" not in view  # closed: no longer following


def test_acknowledgements_are_grouped_then_sent_before_a_wait_and_on_close(
    srv: Server, client: Client
) -> None:
    topic = new_topic(client, "grouped")
    ids = client.create_producer(topic).send_many([(f"k{i}", b"v") for i in range(6)])

    def backlog() -> int:
        return client.admin.topics.stats(topic)["subscriptions"]["s"]["msgBacklog"]

    consumer = client.subscribe(topic, "s", initial_position="earliest", ack_group_time_ms=60_000)
    got = consumer.batch_receive(4, timeout_millis=2000)
    assert [m.message_id() for m in got] == ids[:4]
    consumer.acknowledge_cumulative(got[1])
    consumer.acknowledge(got[3])
    consumer.acknowledge(MessageId(999, 0))  # never delivered: refused alone when sent
    assert backlog() == 6  # held: the group time has not passed
    more = consumer.batch_receive(10, timeout_millis=2000)  # messages are there: no wait
    assert [m.message_id() for m in more] == ids[4:] and backlog() == 6
    assert consumer.batch_receive(10, timeout_millis=300) == []  # a real wait sends them first
    assert backlog() == 3  # 0 and 1 cumulatively, 3 alone; 999:0 was dropped, not the others
    consumer.acknowledge_many(more)
    consumer.close()
    assert backlog() == 1  # only 2 is left

    # Once the group time has passed, the next call of the consumer sends what is held.
    consumer = client.subscribe(topic, "s", ack_group_time_ms=50)
    (again,) = consumer.batch_receive(10, timeout_millis=2000)
    assert again.message_id() == ids[2] and again.redelivery_count() == 1
    consumer.acknowledge(again)
    time.sleep(0.1)
    consumer.batch_receive(10, timeout_millis=0)
    assert backlog() == 0
    consumer.close()

    with pytest.raises(ValueError):
        client.subscribe(topic, "s", ack_group_time_ms=-1)


def test_consumer_receive_ack_redeliver_and_seek(srv: Server, client: Client) -> None:
    topic = new_topic(client, "consume")
    producer = client.create_producer(topic)
    ids = producer.send_many([(f"k{i}", f"v{i}") for i in range(5)])
    time.sleep(0.05)  # the second half is published strictly later: seek by time finds it
    ids += producer.send_many([(f"k{i}", f"v{i}") for i in range(5, 10)])

    # Each acknowledgement is sent as it is made (no grouping): the checks below see it at once.
    consumer = client.subscribe(
        topic,
        "s1",
        initial_position="earliest",
        receiver_queue_size=4,
        consumer_name="c1",
        ack_group_time_ms=0,
    )
    assert consumer.subscription_name() == "s1" and consumer.topic() == topic and not consumer.read_compacted
    got = [consumer.receive(timeout_millis=2000) for _ in range(10)]
    assert [m.message_id() for m in got] == ids
    assert [m.value() for m in got] == [f"v{i}".encode() for i in range(10)]
    assert all(m.redelivery_count() == 0 for m in got)
    with pytest.raises(Timeout):
        consumer.receive(timeout_millis=200)
    assert consumer.batch_receive(10, timeout_millis=0) == []

    # Exclusive: a second consumer of the subscription is refused.
    with pytest.raises(ConsumerBusy) as busy:
        client.subscribe(topic, "s1")
    assert isinstance(busy.value, Conflict) and busy.value.status == 409 and busy.value.reason

    # Acks: 0 and 2 one by one, then everything up to 4 at once; the rest is redelivered.
    consumer.acknowledge(got[0])
    consumer.acknowledge(ids[2])
    consumer.acknowledge_cumulative(got[4])
    consumer.redeliver_unacknowledged_messages()
    again = consumer.batch_receive(10, timeout_millis=2000)
    while len(again) < 5:
        again += consumer.batch_receive(10, timeout_millis=2000)
    assert [m.message_id() for m in again] == ids[5:]
    assert all(m.redelivery_count() >= 1 for m in again)
    consumer.acknowledge_many(again)
    sub = client.admin.topics.stats(topic)["subscriptions"]["s1"]
    assert sub["msgBacklog"] == 0 and sub["unackedMessages"] == 0
    assert [c["readCompacted"] for c in sub["consumers"]] == [False]
    assert [c["consumerName"] for c in sub["consumers"]] == ["c1"]

    # An id never delivered cannot be acknowledged.
    with pytest.raises(BadRequest) as bad:
        consumer.acknowledge(MessageId(999, 0))
    assert bad.value.status == 400

    # Seek: to an id (that message comes next), to a publish time, to either end.
    consumer.seek(ids[3])
    assert consumer.receive(2000).message_id() == ids[3]
    consumer.seek(got[5].publish_timestamp())
    assert consumer.receive(2000).message_id() == ids[5]
    consumer.seek(MessageId.earliest)
    assert consumer.receive(2000).message_id() == ids[0]
    consumer.seek(MessageId.latest)
    with pytest.raises(Timeout):
        consumer.receive(200)

    # A consumer the server forgot (expired) attaches again on its next call.
    old_id = consumer.consumer_id
    sub_path = f"{srv.url}/topics/persistent/public/default/consume/subscription/s1"
    assert httpx.delete(f"{sub_path}/consumers/{old_id}").status_code == 204
    consumer.seek(ids[8])
    assert consumer.consumer_id != old_id
    assert consumer.receive(2000).message_id() == ids[8]

    # Closing lets another consumer attach; unsubscribe deletes the subscription.
    consumer.close()
    with pytest.raises(AlreadyClosed):
        consumer.receive(0)
    consumer2 = client.subscribe(topic, "s1")
    assert consumer2.receive(2000).message_id() == ids[8]  # unacked: delivered again
    assert "s1" in client.admin.topics.subscriptions(topic)
    consumer2.unsubscribe()
    assert "s1" not in client.admin.topics.subscriptions(topic)

    # With an ack timeout, what is not acknowledged comes back by itself.
    timed = client.subscribe(topic, "s-timeout", initial_position="earliest", ack_timeout_ms=300)
    first = timed.batch_receive(10, timeout_millis=2000)
    assert first and first[0].message_id() == ids[0]
    back = timed.receive(timeout_millis=5000)
    assert back.message_id() == ids[0] and back.redelivery_count() >= 1
    timed.close()


def test_admin_subscriptions_and_reset_cursor(client: Client) -> None:
    topic = new_topic(client, "subs")
    ids = client.create_producer(topic).send_many([("k", str(i)) for i in range(6)])
    admin = client.admin.topics
    admin.create_subscription(topic, "from-start", initial_position=MessageId.earliest)
    admin.create_subscription(topic, "compacted")
    assert sorted(admin.subscriptions(topic)) == ["compacted", "from-start"]
    with pytest.raises(Conflict):
        admin.create_subscription(topic, "from-start")
    with pytest.raises(Conflict):
        admin.create_subscription(topic, "__compaction")
    stats = admin.stats(topic)
    assert stats["subscriptions"]["from-start"]["msgBacklog"] == 6
    assert stats["subscriptions"]["compacted"]["consumers"] == []
    assert stats["msgInCounter"] == 6 and stats["storageSize"] > 0

    # subscribe() attaches to the existing subscription; readCompacted is each consumer's.
    c = client.subscribe(topic, "compacted", read_compacted=True)
    assert c.read_compacted is True
    consumers = admin.stats(topic)["subscriptions"]["compacted"]["consumers"]
    assert [x["readCompacted"] for x in consumers] == [True]
    c.close()
    c = client.subscribe(topic, "compacted", read_compacted=False)
    assert c.read_compacted is False
    consumers = admin.stats(topic)["subscriptions"]["compacted"]["consumers"]
    assert [x["readCompacted"] for x in consumers] == [False]
    c.close()

    admin.reset_cursor(topic, "from-start", ids[4])
    consumer = client.subscribe(topic, "from-start")
    assert consumer.receive(2000).message_id() == ids[4]
    consumer.close()
    admin.reset_cursor(topic, "from-start", 0)  # a publish time before everything
    consumer = client.subscribe(topic, "from-start")
    assert consumer.receive(2000).message_id() == ids[0]
    consumer.close()

    admin.delete_subscription(topic, "from-start")
    assert admin.subscriptions(topic) == ["compacted"]
    with pytest.raises(NotFound):
        admin.delete_subscription(topic, "from-start")
    with pytest.raises(ValueError):
        client.subscribe(topic, "__compaction")


def test_compaction_thresholds_topic_and_namespace(client: Client) -> None:
    topic = new_topic(client, "thresholds")
    admin = client.admin
    assert admin.topics.get_compaction_threshold(topic) is None
    admin.topics.set_compaction_threshold(topic, 10 * 1024 * 1024)
    assert admin.topics.get_compaction_threshold(topic) == 10 * 1024 * 1024
    admin.topics.set_compaction_threshold(topic, 0)
    assert admin.topics.get_compaction_threshold(topic) == 0
    admin.topics.remove_compaction_threshold(topic)
    assert admin.topics.get_compaction_threshold(topic) is None
    with pytest.raises(BadRequest):
        admin.topics.set_compaction_threshold(topic, -1)
    with pytest.raises(TypeError):
        admin.topics.set_compaction_threshold(topic, "100")  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        admin.topics.get_compaction_threshold("public/default/no-such-topic")

    ns = "thresholds/ns1"
    assert admin.namespaces.get_compaction_threshold(ns) is None
    admin.namespaces.set_compaction_threshold(ns, 1 << 30)
    assert admin.namespaces.get_compaction_threshold(ns) == 1 << 30
    admin.namespaces.remove_compaction_threshold(ns)
    assert admin.namespaces.get_compaction_threshold(ns) is None
    with pytest.raises(ValueError):
        admin.namespaces.get_compaction_threshold("just-a-tenant")


def test_errors_map_to_the_exception_tree(srv: Server, client: Client) -> None:
    with pytest.raises(NotFound) as nf:
        client.create_producer("public/default/missing")
    assert nf.value.status == 404 and "missing" in nf.value.reason
    for call in (
        lambda: client.admin.topics.internal_stats("public/default/missing"),
        lambda: client.admin.topics.compaction_status("public/default/missing"),
        lambda: client.admin.topics.compact("public/default/missing"),
        lambda: client.create_reader("public/default/missing", MessageId.earliest),
        lambda: client.subscribe("public/default/missing", "s"),
    ):
        with pytest.raises(NotFound):
            call()

    topic = new_topic(client, "errors")
    with pytest.raises(Conflict) as conflict:
        client.admin.topics.create(topic)
    assert conflict.value.status == 409 and "exists" in conflict.value.reason
    assert not isinstance(conflict.value, ConsumerBusy)

    with pytest.raises(BadRequest) as bad:
        client.admin.topics.create("public/default/bad name")
    assert bad.value.status == 400 and isinstance(bad.value, ServerError | ClientError)
    with pytest.raises(BadRequest):  # names are checked by the server
        client.create_producer("public/default/semi;colon")
    with pytest.raises(ValueError):
        client.create_reader(topic, "x:y")
    for malformed in ("public/default", "public/default/..", "public/default/a/b", "other://t/n/x"):
        with pytest.raises(ValueError):
            client.admin.topics.create(malformed)

    producer = client.create_producer(topic)
    with pytest.raises(TooLarge) as big:
        producer.send(b"x" * (MAX_MESSAGE_SIZE + 1), key="big")
    assert big.value.status == 413
    assert client.create_reader(topic, MessageId.earliest).has_message_available() is False  # nothing stored

    with Client(f"http://127.0.0.1:{free_port()}", timeout=2) as dead, pytest.raises(TransportError) as down:
        dead.admin.topics.list("public/default")
    assert isinstance(down.value.__cause__, httpx.TransportError) and down.value.reason

    closed = Client(srv.url)
    closed.close()
    with pytest.raises(AlreadyClosed):
        closed.admin.topics.list("public/default")
    with pytest.raises(ValueError):
        Client("pulsar://localhost:6650")


@pytest.mark.spark
def test_compaction_then_read_compacted_subscription_and_table_view(client: Client) -> None:
    topic = new_topic(client, "compacted")
    producer = client.create_producer(topic)
    admin = client.admin.topics
    assert admin.compaction_status(topic) == CompactionStatus("NOT_RUN", None)
    ids = producer.send_many(
        [
            ("a", b"a1"),
            ("b", b"b1"),
            ("c", b"c1"),
            ("a", b"a2"),
            (None, b"keyless"),
            ("c", None),
            ("b", b"b2"),
        ]
    )
    subscriber = client.subscribe(topic, "compacted", read_compacted=True, initial_position="earliest")
    subscriber.close()  # the subscription stays, at the earliest message

    admin.compact(topic)
    progress: list[tuple[str, float]] = []
    status = admin.wait_for_compaction(
        topic, timeout=120, on_progress=lambda s, e: progress.append((s.status, e))
    )
    assert status == CompactionStatus(CompactionStatus.SUCCESS, None) and not status.running
    assert progress[-1][0] == "SUCCESS" and [e for _, e in progress] == sorted(e for _, e in progress)
    assert admin.compaction_status(topic).status == "SUCCESS"

    internal = admin.internal_stats(topic)
    ledger = internal["compactedLedger"]
    assert ledger["ledgerId"] != -1 and ledger["entries"] == 2
    assert ledger["offloaded"] is False and ledger["underReplicated"] is False
    record = admin.stats(topic)["compaction"]
    assert record["lastCompactionRemovedEventCount"] == 5  # 7 read, 2 kept
    assert record["lastCompactionSucceedTimestamp"] > 0 and record["lastCompactionFailedTimestamp"] == 0
    assert record["lastCompactionDurationTimeInMills"] >= 0
    assert internal["horizon"] == str(ids[-1])
    cursor = internal["cursors"]["__compaction"]
    assert int(cursor["properties"]["CompactedTopicLedger"]) == ledger["ledgerId"]

    # A compacted read: the latest of every key, in id order; the full log is still there.
    compacted = client.create_reader(topic, MessageId.earliest, read_compacted=True)
    assert [(m.key(), m.value(), m.message_id()) for m in compacted] == [
        ("a", b"a2", ids[3]),
        ("b", b"b2", ids[6]),
    ]
    assert [m.message_id() for m in client.create_reader(topic, MessageId.earliest)] == ids

    consumer = client.subscribe(topic, "compacted", read_compacted=True)
    assert consumer.read_compacted
    first = [consumer.receive(5000) for _ in range(2)]
    assert [(m.key(), m.value()) for m in first] == [("a", b"a2"), ("b", b"b2")]
    new = producer.send_many([("d", b"d1"), ("a", b"a3")])
    after = [consumer.receive(5000) for _ in range(2)]
    assert [m.message_id() for m in after] == new
    with pytest.raises(Timeout):
        consumer.receive(200)
    consumer.acknowledge_cumulative(after[-1])
    consumer.close()  # sends the held acknowledgement
    assert admin.stats(topic)["subscriptions"]["compacted"]["msgBacklog"] == 0

    view = client.create_table_view(topic)
    assert view.to_dict() == {"a": b"a3", "b": b"b2", "d": b"d1"}
    producer.send(None, key="a")
    view.refresh()
    assert view.to_dict() == {"b": b"b2", "d": b"d1"}
    view.close()

    admin.delete(topic)
    assert topic not in admin.list("public/default")


def test_message_attributes_and_accessors_agree() -> None:
    m = Message(MessageId(1, 2), "k", None, {"p": "v"}, 10, None, 2, "persistent://t/n/x")
    assert (m.message_id(), m.key(), m.value(), m.properties(), m.redelivery_count()) == (
        MessageId(1, 2),
        "k",
        None,
        {"p": "v"},
        2,
    )
    assert (
        m.publish_timestamp() == 10 and m.event_timestamp() is None and m.topic_name() == "persistent://t/n/x"
    )
