"""Topic termination and backlog quotas through the official ``pulsar-client`` (and a raw
connection where the Python client has no API for it) against a real ``compactor serve``:

- a terminated topic refuses producers (TopicTerminated: the producer connected is closed and
  its sends fail, a new one is refused), keeps serving consumers and readers, still compacts,
  and a consumer that consumed everything hears REACHED_END_OF_TOPIC;
- backlog quotas: ``producer_exception`` refuses producers, ``producer_request_hold`` holds a
  producer's sends until the consumers catch up (then they are stored), and
  ``consumer_backlog_eviction`` moves a slow subscription forward without refusing anyone.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pulsar
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from tests.conftest import Server
from tests.e2e.raw_wire import raw, read_frame
from tests.e2e.test_pulsar_clients import QUIET, fresh, rest_messages

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(
        tmp_path_factory.mktemp("quotas") / "data",
        env={"COMPACTOR_BACKLOG_QUOTA_CHECK_INTERVAL_IN_SECONDS": "0.2"},
    )
    s.start()
    yield s
    s.stop()


@pytest.fixture
def client(server: Server) -> Iterator[pulsar.Client]:
    c = pulsar.Client(server.pulsar_url, operation_timeout_seconds=15, logger=QUIET)
    yield c
    c.close()


def admin(server: Server, method: str, topic: str, action: str, **kw: object) -> httpx.Response:
    path = topic.removeprefix("persistent://") + (f"/{action}" if action else "")
    return httpx.request(method, f"{server.url}/admin/v2/persistent/{path}", timeout=30, **kw)  # type: ignore[arg-type]


def rest_produce(server: Server, topic: str, n: int, size: int = 100) -> httpx.Response:
    path = topic.removeprefix("persistent://")
    value = base64.b64encode(b"x" * size).decode()
    body = {"messages": [{"key": f"k{i}", "value": value} for i in range(n)]}
    return httpx.post(f"{server.url}/topics/persistent/{path}", json=body, timeout=30)


def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)


# ------------------------------------------------------------------ termination


def test_a_terminated_topic_refuses_producers_and_serves_consumers_and_readers(
    server: Server, client: pulsar.Client
) -> None:
    topic = fresh("ended")
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    sent = [producer.send(f"m{i}".encode()) for i in range(3)]
    r = admin(server, "POST", topic, "terminate")
    assert r.status_code == 200, r.text
    assert (r.json()["ledgerId"], r.json()["entryId"]) == (sent[-1].ledger_id(), sent[-1].entry_id())
    # The producer connected is closed and refused as it connects again: its sends fail.
    with pytest.raises(pulsar.TopicTerminated):
        for _ in range(50):  # until the client has heard of it
            producer.send(b"late")
            time.sleep(0.1)
    with pytest.raises(pulsar.TopicTerminated):
        client.create_producer(topic)
    # Consumers and readers read all that was there.
    got = [consumer.receive(10_000) for _ in range(3)]
    assert [m.data() for m in got] == [b"m0", b"m1", b"m2"]
    for m in got:
        consumer.acknowledge(m)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [reader.read_next(10_000).data() for _ in range(3)] == [b"m0", b"m1", b"m2"]
    assert not reader.has_message_available()
    # The Python client knows no REACHED_END_OF_TOPIC (see delivery.py): it stays connected.
    time.sleep(1.5)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(500)
    stats = admin(server, "GET", topic, "stats").json()
    assert len(stats["subscriptions"]["sub"]["consumers"]) == 1
    assert [m["value"] for m in rest_messages(server, topic)] == [
        base64.b64encode(f"m{i}".encode()).decode() for i in range(3)
    ]


def test_a_consumer_that_consumed_everything_hears_reached_end_of_topic(
    server: Server, client: pulsar.Client
) -> None:
    topic = fresh("end")
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"only")
    assert admin(server, "POST", topic, "terminate").status_code == 200
    with raw(server) as s:
        # A client that knows the command (Java's, as Pulsar-Java-... names itself).
        s.sendall(
            encode(command(pb.BaseCommand.CONNECT, client_version="Pulsar-Java-v4.0.7", protocol_version=21))
        )
        assert read_frame(s).type == pb.BaseCommand.CONNECTED
        sub = command(
            pb.BaseCommand.SUBSCRIBE, topic=topic, subscription="s", subType=0, consumer_id=1, request_id=1
        )
        sub.subscribe.initialPosition = pb.CommandSubscribe.Earliest
        s.sendall(encode(sub))
        assert read_frame(s).type == pb.BaseCommand.SUCCESS
        s.sendall(encode(command(pb.BaseCommand.FLOW, consumer_id=1, messagePermits=10)))
        message = read_frame(s)
        assert message.type == pb.BaseCommand.MESSAGE
        # Not before it is acknowledged (its backlog is not empty yet).
        s.settimeout(1.5)
        with pytest.raises(TimeoutError):
            read_frame(s)
        s.settimeout(10)
        ack = command(pb.BaseCommand.ACK, consumer_id=1, ack_type=pb.CommandAck.Individual)
        ack.ack.message_id.add().CopyFrom(message.message.message_id)
        s.sendall(encode(ack))
        end = read_frame(s)
        assert end.type == pb.BaseCommand.REACHED_END_OF_TOPIC
        assert end.reachedEndOfTopic.consumer_id == 1


def test_a_terminated_topic_still_compacts(server: Server, client: pulsar.Client) -> None:
    topic = fresh("ended-compacts")
    producer = client.create_producer(topic, batching_enabled=False)
    for value in (b"1", b"2", b"3"):
        producer.send(value, partition_key="k")
    assert admin(server, "POST", topic, "terminate").status_code == 200
    assert admin(server, "PUT", topic, "compaction").status_code == 204
    until(lambda: admin(server, "GET", topic, "compaction").json()["status"] in ("SUCCESS", "ERROR"), 180)
    assert admin(server, "GET", topic, "compaction").json()["status"] == "SUCCESS"
    compacted = rest_messages(server, topic, readCompacted="true")
    assert [m["value"] for m in compacted] == [base64.b64encode(b"3").decode()]
    assert admin(server, "GET", topic, "internalStats").json()["state"] == "Terminated"


# ------------------------------------------------------------------ backlog quotas


def _slow_subscription(server: Server, topic: str) -> None:
    assert admin(server, "PUT", topic, "").status_code in (204, 409)
    r = admin(server, "PUT", topic, "subscription/slow", params={"initialPosition": "earliest"})
    assert r.status_code == 204, r.text


def _quota(
    server: Server, topic: str, policy: str, *, size: int = -1, seconds: int = -1, kind: str = ""
) -> None:
    body = {"limitSize": size, "limitTime": seconds, "policy": policy}
    params = {"backlogQuotaType": kind} if kind else {}
    assert admin(server, "POST", topic, "backlogQuota", json=body, params=params).status_code == 204


def test_producer_exception_refuses_producers_while_over_the_quota(
    server: Server, client: pulsar.Client
) -> None:
    topic = fresh("refuse")
    _slow_subscription(server, topic)
    assert rest_produce(server, topic, 5, size=200).status_code == 200
    _quota(server, topic, "producer_exception", size=500)
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        client.create_producer(topic)
    # The subscription catches up: producers are welcome again.
    assert (
        admin(
            server, "POST", topic, "subscription/slow/resetcursor", json={"messageId": "latest"}
        ).status_code
        == 204
    )
    producer = client.create_producer(topic)
    producer.send(b"welcome")


def test_producer_exception_by_message_age(server: Server, client: pulsar.Client) -> None:
    topic = fresh("old")
    _slow_subscription(server, topic)
    assert rest_produce(server, topic, 1).status_code == 200
    _quota(server, topic, "producer_exception", seconds=4, kind="message_age")
    client.create_producer(topic).close()  # young enough yet
    time.sleep(4.5)
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        client.create_producer(topic)


def test_producer_request_hold_holds_sends_until_consumers_catch_up(
    server: Server, client: pulsar.Client
) -> None:
    topic = fresh("hold")
    _slow_subscription(server, topic)
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(5):
        producer.send(b"x" * 200)
    _quota(server, topic, "producer_request_hold", size=500)
    # The check finds the topic over its quota: REST producers get 503, the producer is closed.
    until(lambda: rest_produce(server, topic, 1).status_code == 503)
    done = threading.Event()
    results: list[object] = []

    def sent(result: object, msg_id: object) -> None:
        results.append(result)
        done.set()

    producer.send_async(b"held", sent)
    assert not done.wait(2.0), results  # held: neither stored nor failed
    assert b"held" not in [base64.b64decode(str(m["value"])) for m in rest_messages(server, topic)]
    assert (
        admin(
            server, "POST", topic, "subscription/slow/resetcursor", json={"messageId": "latest"}
        ).status_code
        == 204
    )
    assert done.wait(30.0)
    assert results == [pulsar.Result.Ok]
    assert base64.b64decode(str(rest_messages(server, topic)[-1]["value"])) == b"held"


def test_consumer_backlog_eviction_moves_the_slow_subscription_and_refuses_no_one(
    server: Server, client: pulsar.Client
) -> None:
    topic = fresh("evict")
    _slow_subscription(server, topic)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"{i:03d}".encode() + b"x" * 100)
    _quota(server, topic, "consumer_backlog_eviction", size=1000)

    def backlog() -> int:
        return int(admin(server, "GET", topic, "stats").json()["subscriptions"]["slow"]["backlogSize"])

    until(lambda: backlog() <= 1000)
    assert backlog() > 0
    producer.send(b"still welcome")
    consumer = client.subscribe(topic, "slow")
    first = consumer.receive(10_000).data()
    assert first[:3] != b"000" and first != b"still welcome"  # the oldest went, the newest stay
