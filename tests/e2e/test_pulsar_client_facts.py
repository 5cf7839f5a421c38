"""What Pulsar's other clients expect of a broker beyond the Python client's common path (issue
51): a producer id asked for again on its connection, a producer's initial subscription (dead
letter topics), topic stats that list each producer and consumer with its client's facts, and an
encrypting producer's message without keys. Through the official ``pulsar-client`` where it has
the feature, else raw frames (``tests.e2e.raw_wire``), against a real server."""

from __future__ import annotations

import socket
import time
import uuid
from datetime import UTC, datetime

import httpx
import pulsar
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode, encode_payload
from tests.conftest import SUPERUSER, SecureServer, Server
from tests.e2e.conftest import QUIET
from tests.e2e.raw_wire import connect, raw, read_frame
from tests.e2e.test_pulsar_clients import fresh, receive_all, rest_messages

pytestmark = [pytest.mark.e2e]


def _stats(server: Server | SecureServer, topic: str, **headers: str) -> dict:
    kind, path = topic.split("://")
    r = httpx.get(f"{server.url}/admin/v2/{kind}/{path}/stats", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _producer(
    s: socket.socket, topic: str, producer_id: int, request_id: int, **fields: object
) -> pb.BaseCommand:
    s.sendall(
        encode(
            command(
                pb.BaseCommand.PRODUCER, topic=topic, producer_id=producer_id, request_id=request_id, **fields
            )
        )
    )
    return read_frame(s)


def _send(
    s: socket.socket, producer_id: int, sequence_id: int, md: pb.MessageMetadata, payload: bytes
) -> None:
    cmd = command(pb.BaseCommand.SEND, producer_id=producer_id, sequence_id=sequence_id)
    s.sendall(encode_payload(cmd, md.SerializeToString(), payload))


def _metadata(name: str, sequence_id: int, **fields: object) -> pb.MessageMetadata:
    md = pb.MessageMetadata(producer_name=name, sequence_id=sequence_id, publish_time=int(time.time() * 1000))
    for k, v in fields.items():
        setattr(md, k, v)
    return md


# ------------------------------------------------------------------ producers across reconnections


def test_a_producer_id_asked_again_on_its_connection_is_the_same_producer(shared_server: Server) -> None:
    topic = fresh("again")
    with raw(shared_server) as s:
        connect(s)
        first = _producer(s, topic, 7, 1, producer_name="p-again")
        assert first.type == pb.BaseCommand.PRODUCER_SUCCESS
        # The client asks again (its answer timed out, or it reconnected): the same producer.
        again = _producer(s, topic, 7, 2, producer_name="p-again")
        assert again.type == pb.BaseCommand.PRODUCER_SUCCESS, again
        assert again.producer_success.request_id == 2
        assert again.producer_success.producer_name == "p-again"
        _send(s, 7, 0, _metadata("p-again", 0), b"one")
        receipt = read_frame(s)
        assert receipt.type == pb.BaseCommand.SEND_RECEIPT and receipt.send_receipt.sequence_id == 0
        publishers = _stats(shared_server, topic)["publishers"]
        assert [(p["producerName"], p["producerId"]) for p in publishers] == [("p-again", 7)]
        # Closed, the id is free: a new producer, under the name it asks for now.
        s.sendall(encode(command(pb.BaseCommand.CLOSE_PRODUCER, producer_id=7, request_id=3)))
        assert read_frame(s).type == pb.BaseCommand.SUCCESS
        renewed = _producer(s, topic, 7, 4, producer_name="p-renewed")
        assert renewed.type == pb.BaseCommand.PRODUCER_SUCCESS
        assert renewed.producer_success.producer_name == "p-renewed"
        assert [p["producerName"] for p in _stats(shared_server, topic)["publishers"]] == ["p-renewed"]
    assert [m["value"] for m in rest_messages(shared_server, topic)] == ["b25l"]


def test_a_send_in_flight_when_the_broker_closed_its_producer_leaves_the_connection_open(
    shared_server: Server,
) -> None:
    """The broker closes a producer (here: its topic is terminated) while the client's send is
    on its way: that send is dropped, and the connection's other producers and consumers go on
    (Pulsar's recentlyClosedProducers); a SEND for an id never opened still closes it."""
    topic = fresh("closed-in-flight")
    other = fresh("closed-in-flight-other")
    with raw(shared_server) as s:
        connect(s)
        assert _producer(s, topic, 7, 1, producer_name="p-closed").type == pb.BaseCommand.PRODUCER_SUCCESS
        assert _producer(s, other, 8, 2, producer_name="p-other").type == pb.BaseCommand.PRODUCER_SUCCESS
        path = topic.removeprefix("persistent://")
        r = httpx.post(f"{shared_server.url}/admin/v2/persistent/{path}/terminate", timeout=30)
        assert r.status_code == 200, r.text
        closed = read_frame(s)
        assert closed.type == pb.BaseCommand.CLOSE_PRODUCER and closed.close_producer.producer_id == 7
        _send(s, 7, 0, _metadata("p-closed", 0), b"late")
        _send(s, 8, 0, _metadata("p-other", 0), b"on")
        receipt = read_frame(s)
        assert receipt.type == pb.BaseCommand.SEND_RECEIPT and receipt.send_receipt.producer_id == 8
        _send(s, 99, 0, _metadata("p-none", 0), b"never")
        s.settimeout(10)
        assert s.recv(1) == b""  # closed by the broker
    assert rest_messages(shared_server, topic) == []
    assert [m["value"] for m in rest_messages(shared_server, other)] == ["b24="]


def test_a_producer_still_waiting_for_its_topic_is_not_ready_when_asked_again(shared_server: Server) -> None:
    topic = fresh("waiting")
    with raw(shared_server) as holder, raw(shared_server) as s:
        connect(holder)
        connect(s)
        assert _producer(holder, topic, 1, 1, producer_access_mode=pb.Exclusive).type == (
            pb.BaseCommand.PRODUCER_SUCCESS
        )
        queued = _producer(s, topic, 1, 1, producer_access_mode=pb.WaitForExclusive)
        assert queued.type == pb.BaseCommand.PRODUCER_SUCCESS and not queued.producer_success.producer_ready
        # As Pulsar's broker: ServiceNotReady, and the client retries.
        again = _producer(s, topic, 1, 2, producer_access_mode=pb.WaitForExclusive)
        assert again.type == pb.BaseCommand.ERROR and again.error.error == pb.ServiceNotReady
        # The exclusive holder goes: the waiting producer gets the topic, and is then itself.
        holder.sendall(encode(command(pb.BaseCommand.CLOSE_PRODUCER, producer_id=1, request_id=2)))
        assert read_frame(holder).type == pb.BaseCommand.SUCCESS
        granted = read_frame(s)
        assert granted.type == pb.BaseCommand.PRODUCER_SUCCESS and granted.producer_success.producer_ready
        third = _producer(s, topic, 1, 3, producer_access_mode=pb.WaitForExclusive)
        assert third.type == pb.BaseCommand.PRODUCER_SUCCESS and third.producer_success.producer_ready
        (publisher,) = _stats(shared_server, topic)["publishers"]
        assert publisher["accessMode"] == "WaitForExclusive"


def test_a_non_persistent_producer_id_asked_again_is_the_same_producer(shared_server: Server) -> None:
    topic = f"non-persistent://public/default/again-{uuid.uuid4().hex[:8]}"
    with raw(shared_server) as s:
        connect(s)
        first = _producer(s, topic, 3, 1, producer_name="np-again")
        again = _producer(s, topic, 3, 2, producer_name="np-again")
        assert first.type == again.type == pb.BaseCommand.PRODUCER_SUCCESS
        assert again.producer_success.producer_name == "np-again"
        assert [p["producerName"] for p in _stats(shared_server, topic)["publishers"]] == ["np-again"]


# ------------------------------------------------------------------ initial subscriptions


def _dlq_messages(server: Server, topic: str) -> list[dict[str, object]]:
    r = httpx.get(
        f"{server.url}/topics/persistent/{topic.removeprefix('persistent://')}/messages",
        params={"startMessageId": "earliest", "maxMessages": 10},
    )
    return r.json()["messages"] if r.status_code == 200 else []


def test_a_dead_letter_topic_keeps_its_messages_for_its_initial_subscription(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh("dlq-source")
    dlq = fresh("dlq")
    consumer = client.subscribe(
        topic,
        "work",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=1, dead_letter_topic=dlq, initial_subscription_name="dlq-audit"
        ),
    )
    producer = client.create_producer(topic, batching_enabled=False)
    for v in (b"poison-1", b"poison-2"):
        producer.send(v)
    # Delivered twice each (the first time and once more), then moved to the dead letter topic.
    for _ in range(4):
        consumer.negative_acknowledge(consumer.receive(10_000))
    # Once both are in the dead letter topic (written asynchronously by the client), a consumer
    # that subscribes only now, at the latest position, finds them kept for it.
    deadline = time.monotonic() + 10
    while len(_dlq_messages(shared_server, dlq)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    late = client.subscribe(dlq, "dlq-audit")
    got = sorted(m.data() for m in receive_all(late, 2))
    assert got == [b"poison-1", b"poison-2"]


def test_a_producers_initial_subscription_starts_at_the_earliest_message(shared_server: Server) -> None:
    topic = fresh("initial")
    path = topic.removeprefix("persistent://")
    assert httpx.put(f"{shared_server.url}/admin/v2/persistent/{path}").status_code == 204
    r = httpx.post(
        f"{shared_server.url}/topics/persistent/{path}",
        json={"messages": [{"key": "before", "value": "YQ=="}]},
    )
    assert r.status_code == 200, r.text
    with raw(shared_server) as s:
        connect(s)
        ok = _producer(s, topic, 1, 1, initial_subscription_name="kept")
        assert ok.type == pb.BaseCommand.PRODUCER_SUCCESS
        # The topic's subscription existing already is no error; a reserved name is refused.
        assert (
            _producer(s, topic, 2, 2, initial_subscription_name="kept").type
            == pb.BaseCommand.PRODUCER_SUCCESS
        )
        refused = _producer(s, topic, 3, 3, initial_subscription_name="__compaction")
        assert refused.type == pb.BaseCommand.ERROR and refused.error.error == pb.NotAllowedError
        _send(s, 1, 0, _metadata(ok.producer_success.producer_name, 0), b"after")
        assert read_frame(s).type == pb.BaseCommand.SEND_RECEIPT
    stats = _stats(shared_server, topic)
    assert stats["subscriptions"]["kept"]["msgBacklog"] == 2


def test_an_initial_subscription_needs_the_right_to_consume(secure_server: SecureServer) -> None:
    admin = secure_server.headers(SUPERUSER)
    tenant = f"dlq{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=secure_server.url, headers=admin, timeout=30) as http:
        r = http.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": [], "allowedClusters": []})
        assert r.status_code in (200, 204)
        assert http.put(f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
        for role, actions in (("writer", ["produce"]), ("both", ["produce", "consume"])):
            r = http.post(f"/admin/v2/namespaces/{tenant}/ns/permissions/{role}", json=actions)
            assert r.status_code == 204, r.text
    topic = f"persistent://{tenant}/ns/dlq"

    def as_role(role: str) -> pulsar.Client:
        token = pulsar.AuthenticationToken(secure_server.token(role))
        return pulsar.Client(
            secure_server.server.pulsar_url, authentication=token, operation_timeout_seconds=5, logger=QUIET
        )

    writer = as_role("writer")
    try:
        # Pulsar's Python client sends it for a dead letter producer only: over raw frames here.
        with raw(secure_server.server) as s:
            token = secure_server.token("writer")
            s.sendall(
                encode(
                    command(
                        pb.BaseCommand.CONNECT,
                        client_version="raw",
                        protocol_version=21,
                        auth_method_name="token",
                        auth_data=token.encode(),
                    )
                )
            )
            assert read_frame(s).type == pb.BaseCommand.CONNECTED
            refused = _producer(s, topic, 1, 1, initial_subscription_name="audit")
            assert refused.type == pb.BaseCommand.ERROR and refused.error.error == pb.AuthorizationError
            assert _producer(s, topic, 2, 2).type == pb.BaseCommand.PRODUCER_SUCCESS
    finally:
        writer.close()
    with httpx.Client(base_url=secure_server.url, headers=admin, timeout=30) as http:
        subs = http.get(f"/admin/v2/persistent/{tenant}/ns/dlq/subscriptions").json()
        assert subs == []
    both = as_role("both")
    try:
        both.create_producer(topic)  # no initial subscription: nothing made
        with raw(secure_server.server) as s:
            s.sendall(
                encode(
                    command(
                        pb.BaseCommand.CONNECT,
                        client_version="raw",
                        protocol_version=21,
                        auth_method_name="token",
                        auth_data=secure_server.token("both").encode(),
                    )
                )
            )
            assert read_frame(s).type == pb.BaseCommand.CONNECTED
            assert _producer(s, topic, 1, 1, initial_subscription_name="audit").type == (
                pb.BaseCommand.PRODUCER_SUCCESS
            )
    finally:
        both.close()
    with httpx.Client(base_url=secure_server.url, headers=admin, timeout=30) as http:
        assert http.get(f"/admin/v2/persistent/{tenant}/ns/dlq/subscriptions").json() == ["audit"]


# ------------------------------------------------------------------ stats


def _iso(text: str) -> datetime:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_stats_list_each_producer_and_consumer_with_its_clients_facts(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh("facts")
    before = datetime.now(UTC)
    producer = client.create_producer(topic, producer_name="facts-p", properties={"app": "billing"})
    consumer = client.subscribe(
        topic,
        "facts-s",
        consumer_name="facts-c",
        properties={"team": "ops"},
        consumer_type=pulsar.ConsumerType.Shared,
    )
    producer.send(b"x")
    stats = _stats(shared_server, topic)
    (p,) = stats["publishers"]
    assert p["producerName"] == "facts-p" and p["accessMode"] == "Shared"
    assert p["metadata"] == {"app": "billing"}
    assert p["clientVersion"].startswith("Pulsar")  # what the C++ client under Python says
    assert p["address"].startswith("/127.0.0.1:")
    assert before <= _iso(p["connectedSince"]) <= datetime.now(UTC)
    assert isinstance(p["producerId"], int)
    (c,) = stats["subscriptions"]["facts-s"]["consumers"]
    assert c["consumerName"] == "facts-c" and c["metadata"] == {"team": "ops"}
    assert c["clientVersion"] == p["clientVersion"] and c["address"] == p["address"]
    assert before <= _iso(c["connectedSince"]) <= datetime.now(UTC)
    producer.close()
    consumer.close()
    after = _stats(shared_server, topic)
    assert after["publishers"] == [] and after["subscriptions"]["facts-s"]["consumers"] == []


def test_stats_of_a_rest_consumer_name_its_http_client(shared_server: Server) -> None:
    topic = fresh("rest-facts")
    path = topic.removeprefix("persistent://")
    assert httpx.put(f"{shared_server.url}/admin/v2/persistent/{path}").status_code == 204
    r = httpx.put(f"{shared_server.url}/admin/v2/persistent/{path}/subscription/rs")
    assert r.status_code == 204, r.text
    r = httpx.post(
        f"{shared_server.url}/topics/persistent/{path}/subscription/rs/consumers",
        json={"consumerName": "rest-c"},
        headers={"User-Agent": "my-app/1.2"},
    )
    assert r.status_code in (200, 201), r.text
    (c,) = _stats(shared_server, topic)["subscriptions"]["rs"]["consumers"]
    assert c["consumerName"] == "rest-c" and c["clientVersion"] == "my-app/1.2"
    assert c["address"].startswith("/127.0.0.1:") and c["metadata"] == {}
    _iso(c["connectedSince"])


def test_partitioned_stats_merge_the_partitions_producers_and_consumers(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh("facts-parts")
    path = topic.removeprefix("persistent://")
    assert httpx.put(f"{shared_server.url}/admin/v2/persistent/{path}/partitions", json=2).status_code == 204
    producer = client.create_producer(topic, producer_name="pp", properties={"k": "v"})
    consumer = client.subscribe(topic, "ps", consumer_name="pc")
    for i in range(4):
        producer.send(f"m{i}".encode(), partition_key=str(i))
    stats = httpx.get(f"{shared_server.url}/admin/v2/persistent/{path}/partitioned-stats").json()
    assert [p["producerName"] for p in stats["publishers"]] == ["pp"]
    assert stats["subscriptions"]["ps"]["msgBacklog"] == 4
    assert {c["consumerName"] for c in stats["subscriptions"]["ps"]["consumers"]} == {"pc"}
    assert len(stats["subscriptions"]["ps"]["consumers"]) == 2  # one on each partition
    for part in stats["partitions"].values():
        (p,) = part["publishers"]
        assert p["producerName"] == "pp" and p["metadata"] == {"k": "v"}
    producer.close()
    consumer.close()


def test_stats_of_a_topic_with_hundreds_of_consumers(shared_server: Server) -> None:
    topic = fresh("many")
    n = 300
    with raw(shared_server) as s:
        connect(s)
        for i in range(n):
            s.sendall(
                encode(
                    command(
                        pb.BaseCommand.SUBSCRIBE,
                        topic=topic,
                        subscription="crowd",
                        subType=pb.CommandSubscribe.Shared,
                        consumer_id=i,
                        request_id=i,
                        consumer_name=f"c{i}",
                        metadata=[pb.KeyValue(key="n", value=str(i))],
                    )
                )
            )
        answers = [read_frame(s) for _ in range(n)]
        assert all(a.type == pb.BaseCommand.SUCCESS for a in answers)
        stats = _stats(shared_server, topic)
        consumers = stats["subscriptions"]["crowd"]["consumers"]
        assert len(consumers) == n
        assert sorted(int(c["metadata"]["n"]) for c in consumers) == list(range(n))
        assert {c["address"] for c in consumers} == {consumers[0]["address"]}
        assert all(c["clientVersion"] == "raw" for c in consumers)
        # The listener still serves this connection; a consumer's own stats name it as the
        # topic's stats do.
        s.sendall(encode(command(pb.BaseCommand.CONSUMER_STATS, request_id=n, consumer_id=0)))
        answer = read_frame(s)
        assert answer.type == pb.BaseCommand.CONSUMER_STATS_RESPONSE
        assert answer.consumerStatsResponse.address == consumers[0]["address"]


# ------------------------------------------------------------------ encryption


def test_an_encrypting_producers_message_without_keys_is_refused(shared_server: Server) -> None:
    topic = fresh("no-keys")
    with raw(shared_server) as s:
        connect(s)
        ok = _producer(s, topic, 1, 1, encrypted=True)
        assert ok.type == pb.BaseCommand.PRODUCER_SUCCESS
        name = ok.producer_success.producer_name
        _send(s, 1, 0, _metadata(name, 0), b"plain")
        refused = read_frame(s)
        assert refused.type == pb.BaseCommand.SEND_ERROR and refused.send_error.error == pb.MetadataError
        # The same producer's encrypted message is stored; the listener serves on.
        md = _metadata(name, 1, encryption_algo="RSA", encryption_param=b"\x01" * 12)
        md.encryption_keys.add(key="k", value=b"\x02" * 32)
        _send(s, 1, 1, md, b"ciphertext")
        receipt = read_frame(s)
        assert receipt.type == pb.BaseCommand.SEND_RECEIPT and receipt.send_receipt.sequence_id == 1
    stored = rest_messages(shared_server, topic)
    assert len(stored) == 1
