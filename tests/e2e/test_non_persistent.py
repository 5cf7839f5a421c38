"""Non-persistent topics (``non-persistent://``) and pattern consumers' ``RegexSubscriptionMode``,
with the official Python client against the shared server (README: docs/concepts.md,
"Non-persistent topics").

A consumer's FLOW goes out before its ``subscribe`` returns, on the connection the client's
producers share: a message sent after a consumer is made finds its permits there.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode, encode_payload
from tests.conftest import SUPERUSER, SecureServer, Server
from tests.e2e.conftest import QUIET
from tests.e2e.raw_wire import connect, raw, read_frame

pytestmark = pytest.mark.e2e

MODES = pulsar.RegexSubscriptionMode


@pytest.fixture
def ns(shared_server: Server) -> str:
    """A namespace of its own: its topic list is the test's alone."""
    name = f"np/n{uuid.uuid4().hex[:8]}"
    shared_server.create_namespaces(name)
    return name


def nothing_more(consumer: pulsar.Consumer, wait_ms: int = 300) -> bool:
    try:
        consumer.receive(wait_ms)
    except pulsar.Timeout:
        return True
    return False


def stats(http: httpx.Client, topic: str) -> dict:  # type: ignore[type-arg]
    r = http.get(f"/admin/v2/non-persistent/{topic.removeprefix('non-persistent://')}/stats")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_a_message_reaches_the_consumers_connected_now_and_no_later_one(
    client: pulsar.Client, http: httpx.Client, ns: str
) -> None:
    topic = f"non-persistent://{ns}/t"
    before = client.subscribe(topic, "before")
    producer = client.create_producer(topic, batching_enabled=False)
    receipt = producer.send(b"first")
    # Pulsar's receipt for a message stored nowhere.
    assert (receipt.ledger_id(), receipt.entry_id()) == (0, 0)
    assert before.receive(5000).data() == b"first"

    after = client.subscribe(topic, "after")
    producer.send(b"second")
    assert after.receive(5000).data() == b"second"  # not "first": it was sent before
    assert before.receive(5000).data() == b"second"
    assert nothing_more(after) and nothing_more(before)

    # Stored nowhere: no ledger, no persistent topic of the name, nothing in the data dir.
    persistent = http.get(f"/admin/v2/persistent/{ns}").json()
    assert persistent == []
    assert http.get(f"/admin/v2/persistent/{ns}/t/stats").status_code == 404
    internal = http.get(f"/admin/v2/non-persistent/{ns}/t/internalStats").json()
    assert internal["ledgers"] == [] and internal["entriesAddedCounter"] == 2
    assert set(internal["cursors"]) == {"before", "after"}


def test_a_reader_reads_what_is_sent_while_it_is_open(
    client: pulsar.Client, http: httpx.Client, ns: str
) -> None:
    topic = f"non-persistent://{ns}/read"
    keep = client.subscribe(topic, "keep")  # keeps the topic loaded once the reader goes
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"before the reader")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)  # there is no earliest
    producer.send(b"while it reads")
    assert reader.read_next(5000).data() == b"while it reads"
    cursors = http.get(f"/admin/v2/non-persistent/{ns}/read/internalStats").json()["cursors"]
    assert len(cursors) == 2
    reader.close()  # its non-durable subscription goes with it
    cursors = http.get(f"/admin/v2/non-persistent/{ns}/read/internalStats").json()["cursors"]
    assert list(cursors) == ["keep"]
    keep.close()


def test_nothing_is_written_to_the_data_dir(client: pulsar.Client, shared_server: Server, ns: str) -> None:
    name = f"unstored-{uuid.uuid4().hex[:8]}"
    consumer = client.subscribe(f"non-persistent://{ns}/{name}", "s")
    client.create_producer(f"non-persistent://{ns}/{name}").send(b"x" * 1000)
    assert consumer.receive(5000).data() == b"x" * 1000
    assert not [p for p in shared_server.data_dir.rglob("*") if name in str(p)]


def test_shared_splits_and_failover_sends_to_the_active_consumer_only(client: pulsar.Client, ns: str) -> None:
    topic = f"non-persistent://{ns}/split"
    shared = [client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared) for _ in range(2)]
    failover = {
        name: client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name=name)
        for name in ("b-second", "a-first")
    }
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [f"m{i}".encode() for i in range(10)]
    for m in sent:
        producer.send(m)
    got = [[c.receive(5000).data() for _ in range(5)] for c in shared]
    assert all(got) and sorted(got[0] + got[1]) == sorted(sent)  # round robin: five each
    assert [failover["a-first"].receive(5000).data() for _ in sent] == sent
    assert nothing_more(failover["b-second"]) and nothing_more(shared[0]) and nothing_more(shared[1])


class Order(pulsar.schema.Record):
    item = pulsar.schema.String()
    amount = pulsar.schema.Integer()


def test_producers_and_consumers_with_schemas(client: pulsar.Client, ns: str) -> None:
    """Schemas are taken as given (none kept): typed clients work, and a bytes consumer too."""
    topic = f"non-persistent://{ns}/typed"
    typed = client.subscribe(topic, "typed", schema=pulsar.schema.JsonSchema(Order))
    raw_bytes = client.subscribe(topic, "bytes")
    client.create_producer(topic, schema=pulsar.schema.JsonSchema(Order)).send(Order(item="tea", amount=2))
    got = typed.receive(5000).value()
    assert (got.item, got.amount) == ("tea", 2)
    assert b'"tea"' in raw_bytes.receive(5000).data()


def test_key_shared_gives_each_key_to_one_consumer(client: pulsar.Client, ns: str) -> None:
    topic = f"non-persistent://{ns}/keys"
    consumers = [client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared) for _ in range(2)]
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"k{i}" for i in range(20)]
    for k in keys:
        producer.send(k.encode(), partition_key=k)
    owners: dict[str, int] = {}
    for i, c in enumerate(consumers):
        while True:
            try:
                m = c.receive(500)
            except pulsar.Timeout:
                break
            assert owners.setdefault(m.partition_key(), i) == i
    assert sorted(owners) == sorted(keys)
    assert set(owners.values()) == {0, 1}  # 20 keys over two hash ranges: both have some


def test_a_consumer_without_permits_drops_and_stats_count_it(
    client: pulsar.Client, http: httpx.Client, ns: str
) -> None:
    topic = f"non-persistent://{ns}/drops"
    # One permit: the first message fills the client's queue; nothing is received, so no more.
    slow = client.subscribe(topic, "slow", receiver_queue_size=1, consumer_name="slow-one")
    producer = client.create_producer(topic, batching_enabled=False, producer_name="np-producer")
    for i in range(5):
        producer.send(f"m{i}".encode())
    st = stats(http, topic)
    assert st["msgInCounter"] == 5 and st["bytesInCounter"] > 0 and st["storageSize"] == 0
    assert [p["producerName"] for p in st["publishers"]] == ["np-producer"]
    sub = st["subscriptions"]["slow"]
    assert sub["msgDropCount"] == 4 and sub["msgDropRate"] > 0
    assert sub["msgOutCounter"] == 1 and sub["type"] == "Exclusive" and sub["msgBacklog"] == 0
    assert [(c["consumerName"], c["availablePermits"]) for c in sub["consumers"]] == [("slow-one", 0)]
    assert slow.receive(5000).data() == b"m0"

    # Gone with its last producer and consumer, as Pulsar unloads it.
    slow.close()
    producer.close()
    r = http.get(f"/admin/v2/non-persistent/{ns}/drops/stats")
    assert r.status_code == 404 and "not found" in r.json()["reason"]


def test_seek_and_acks_change_nothing_and_last_message_id_is_refused(client: pulsar.Client, ns: str) -> None:
    topic = f"non-persistent://{ns}/seek"
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"one")
    m = consumer.receive(5000)
    consumer.acknowledge(m)
    consumer.negative_acknowledge(m)
    consumer.seek(pulsar.MessageId.earliest)  # Pulsar answers it and changes nothing
    with pytest.raises(pulsar.PulsarException):
        consumer.get_last_message_id()
    producer.send(b"two")  # the connection serves on
    assert consumer.receive(5000).data() == b"two"
    assert nothing_more(consumer)


def test_regex_subscription_modes(client: pulsar.Client, http: httpx.Client, ns: str) -> None:
    durable, passing = f"persistent://{ns}/p-durable", f"non-persistent://{ns}/p-passing"
    assert http.put(f"/admin/v2/persistent/{ns}/p-durable").status_code == 204
    to_passing = client.create_producer(passing, batching_enabled=False)  # loads it
    listing = {
        mode: http.get(f"/admin/v2/namespaces/{ns}/topics", params={"mode": mode}).json()
        for mode in ("PERSISTENT", "NON_PERSISTENT", "ALL")
    }
    assert listing == {"PERSISTENT": [durable], "NON_PERSISTENT": [passing], "ALL": [durable, passing]}
    assert http.get(f"/admin/v2/non-persistent/{ns}").json() == [passing]

    pattern = re.compile(f"persistent://{ns}/p-.*")
    consumers = {
        mode: client.subscribe(pattern, f"re-{mode.name}", regex_subscription_mode=mode)
        for mode in (MODES.PersistentOnly, MODES.NonPersistentOnly, MODES.AllTopics)
    }
    client.create_producer(durable, batching_enabled=False).send(b"durable")
    to_passing.send(b"passing")
    expected = {
        MODES.PersistentOnly: [b"durable"],
        MODES.NonPersistentOnly: [b"passing"],
        MODES.AllTopics: [b"durable", b"passing"],
    }
    for mode, consumer in consumers.items():
        got = sorted(consumer.receive(5000).data() for _ in expected[mode])
        assert got == expected[mode], mode
        assert nothing_more(consumer)


def test_read_compacted_is_refused_on_the_wire(shared_server: Server, ns: str) -> None:
    """The official clients refuse it before asking; one that asks gets Pulsar's NotAllowed."""
    s = raw(shared_server)
    try:
        connect(s)
        subscribe = command(
            pb.BaseCommand.SUBSCRIBE,
            topic=f"non-persistent://{ns}/t",
            subscription="s",
            subType=pb.CommandSubscribe.Exclusive,
            consumer_id=1,
            request_id=1,
            read_compacted=True,
        )
        s.sendall(encode(subscribe))
        answer = read_frame(s)
        assert answer.type == pb.BaseCommand.ERROR and answer.error.error == pb.NotAllowedError
        assert answer.error.message == "readCompacted only valid on persistent topics"
        s.sendall(encode(command(pb.BaseCommand.PING)))
        assert read_frame(s).type == pb.BaseCommand.PONG  # the connection serves on
    finally:
        s.close()


def test_a_bad_send_is_refused_and_the_next_one_served(shared_server: Server, ns: str) -> None:
    s = raw(shared_server)
    try:
        connect(s)
        producer = command(
            pb.BaseCommand.PRODUCER, topic=f"non-persistent://{ns}/t", producer_id=1, request_id=1
        )
        s.sendall(encode(producer))
        assert read_frame(s).type == pb.BaseCommand.PRODUCER_SUCCESS
        for sequence_id, members in ((0, 10**6), (1, None)):
            md = pb.MessageMetadata(producer_name="raw", sequence_id=sequence_id, publish_time=1)
            if members is not None:
                md.num_messages_in_batch = members  # more than any batch may claim
            send = command(pb.BaseCommand.SEND, producer_id=1, sequence_id=sequence_id)
            s.sendall(encode_payload(send, md.SerializeToString(), b"payload"))
            answer = read_frame(s)
            if members is not None:
                assert answer.type == pb.BaseCommand.SEND_ERROR
                assert answer.send_error.error == pb.NotAllowedError
            else:
                assert answer.type == pb.BaseCommand.SEND_RECEIPT
                got = answer.send_receipt.message_id
                assert (got.ledgerId, got.entryId) == (0, 0)
        # No schema is kept for these topics: asked for one, the answer is a topic without.
        s.sendall(encode(command(pb.BaseCommand.GET_SCHEMA, request_id=2, topic=f"non-persistent://{ns}/t")))
        answer = read_frame(s)
        assert answer.getSchemaResponse.error_code == pb.TopicNotFound
        schema = pb.Schema(name="s", schema_data=b"", type=pb.Schema.String)
        ask = command(
            pb.BaseCommand.GET_OR_CREATE_SCHEMA, request_id=3, topic=f"non-persistent://{ns}/t", schema=schema
        )
        s.sendall(encode(ask))
        answer = read_frame(s)
        assert answer.type == pb.BaseCommand.GET_OR_CREATE_SCHEMA_RESPONSE
        assert not answer.getOrCreateSchemaResponse.HasField("error_code")
    finally:
        s.close()


def test_the_binary_protocol_lists_each_mode(shared_server: Server, client: pulsar.Client, ns: str) -> None:
    client.create_producer(f"persistent://{ns}/durable").close()
    keep = client.subscribe(f"non-persistent://{ns}/passing", "keep")
    modes = pb.CommandGetTopicsOfNamespace
    s = raw(shared_server)
    try:
        connect(s)
        got = {}
        for request_id, mode in enumerate((modes.PERSISTENT, modes.NON_PERSISTENT, modes.ALL)):
            ask = command(
                pb.BaseCommand.GET_TOPICS_OF_NAMESPACE, request_id=request_id, namespace=ns, mode=mode
            )
            s.sendall(encode(ask))
            answer = read_frame(s)
            assert answer.type == pb.BaseCommand.GET_TOPICS_OF_NAMESPACE_RESPONSE
            got[mode] = sorted(answer.getTopicsOfNamespaceResponse.topics)
    finally:
        s.close()
    keep.close()
    durable, passing = f"persistent://{ns}/durable", f"non-persistent://{ns}/passing"
    assert got == {
        modes.PERSISTENT: [durable],
        modes.NON_PERSISTENT: [passing],
        modes.ALL: sorted([durable, passing]),
    }


def test_a_client_given_the_http_url_finds_a_non_persistent_topic(
    shared_server: Server, http: httpx.Client, ns: str
) -> None:
    r = http.get(f"/lookup/v2/topic/non-persistent/{ns}/t")
    assert r.status_code == 200 and r.json()["brokerUrl"] == shared_server.pulsar_url
    assert http.get(f"/admin/v2/non-persistent/{ns}/t/partitions").json() == {"partitions": 0}
    c = pulsar.Client(shared_server.url, operation_timeout_seconds=15, logger=QUIET)
    try:
        consumer = c.subscribe(f"non-persistent://{ns}/t", "s")
        c.create_producer(f"non-persistent://{ns}/t").send(b"over http lookup")
        assert consumer.receive(5000).data() == b"over http lookup"
    finally:
        c.close()


def test_bad_requests_get_pulsars_errors_and_change_nothing(
    client: pulsar.Client, http: httpx.Client, ns: str
) -> None:
    missing = f"non-persistent://np/no-such-{uuid.uuid4().hex[:6]}/t"
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer(missing)
    with pytest.raises(pulsar.TopicNotFound):
        client.subscribe(missing, "s")
    topic = f"non-persistent://{ns}/t"
    with pytest.raises(pulsar.PulsarException):  # the client refuses it itself, as Pulsar's broker
        client.subscribe(topic, "compacted", is_read_compacted=True)
    first = client.subscribe(topic, "only")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "only")  # Exclusive
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "only", consumer_type=pulsar.ConsumerType.Shared)
    assert http.get(f"/admin/v2/non-persistent/{ns}").json() == [topic]
    assert list(stats(http, topic)["subscriptions"]) == ["only"]

    for method, path in (
        ("PUT", f"/admin/v2/non-persistent/{ns}/t/compaction"),
        ("GET", f"/admin/v2/non-persistent/{ns}/t/compaction"),
        ("DELETE", f"/admin/v2/non-persistent/{ns}/t"),
        ("POST", f"/topics/non-persistent/{ns}/t"),
        ("PUT", f"/admin/v2/non-persistent/{ns}/t/stats"),
    ):
        r = http.request(method, path)
        assert r.status_code == 405 and "non-persistent" in r.json()["reason"], (method, path, r.text)
        assert "allow" in r.headers  # RFC 9110: a 405 says what the path allows (here nothing)
    assert http.get(f"/admin/v2/non-persistent/{ns}/..%2Fx/stats").status_code in (400, 404)
    assert http.get(f"/admin/v2/non-persistent/{ns}/never-used/stats").status_code == 404
    assert http.get("/admin/v2/non-persistent/np/no-such-namespace").status_code == 404

    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"still served")
    assert first.receive(5000).data() == b"still served"


def test_non_persistent_topics_can_be_turned_off(server_factory: type[Server], tmp_path: Path) -> None:
    server = server_factory(tmp_path / "data", env={"COMPACTOR_ENABLE_NON_PERSISTENT_TOPICS": "false"})
    server.start()
    c = pulsar.Client(server.pulsar_url, operation_timeout_seconds=15, logger=QUIET)
    try:
        with pytest.raises(pulsar.NotAllowedError):
            c.create_producer("non-persistent://public/default/t")
        c.create_producer("persistent://public/default/t").send(b"persistent topics serve on")
    finally:
        c.close()


# ------------------------------------------------------------------ with security on


def test_the_same_permissions_hold_on_the_wire_and_over_rest(secure_server: SecureServer) -> None:
    s = secure_server
    tenant = f"np{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=s.url, headers=s.headers(SUPERUSER), timeout=30) as http:
        assert http.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": ["owner"]}).status_code == 204
        assert http.put(f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
        r = http.post(f"/admin/v2/namespaces/{tenant}/ns/permissions/reader", json=["consume"])
        assert r.status_code == 204, r.text
    topic = f"non-persistent://{tenant}/ns/t"

    def client(role: str) -> pulsar.Client:
        token = pulsar.AuthenticationToken(s.token(role))
        return pulsar.Client(
            s.server.pulsar_url, authentication=token, operation_timeout_seconds=15, logger=QUIET
        )

    reader, owner = client("reader"), client("owner")
    try:
        with pytest.raises(pulsar.AuthorizationError):
            reader.create_producer(topic)  # consume only
        consumer = reader.subscribe(topic, "s")
        owner.create_producer(topic).send(b"for the reader")
        assert consumer.receive(5000).data() == b"for the reader"

        base = f"/admin/v2/non-persistent/{tenant}/ns"
        for method, path, allowed in (
            ("GET", base, 200),
            ("GET", f"{base}/t/stats", 200),
            ("GET", f"{base}/t/internalStats", 200),
            ("GET", f"{base}/t/partitions", 200),
            ("GET", f"{base}/t/compaction", 405),
        ):
            assert httpx.request(method, s.url + path).status_code == 401, path
            assert httpx.request(method, s.url + path, headers=s.headers("stranger")).status_code == 403, path
            r = httpx.request(method, s.url + path, headers=s.headers("reader"))
            assert r.status_code == allowed, (path, r.text)
        compact = f"{s.url}{base}/t/compaction"
        assert httpx.put(compact).status_code == 401
        assert httpx.put(compact, headers=s.headers("reader")).status_code == 403  # a tenant admin's
        r = httpx.put(compact, headers=s.headers("owner"))
        assert r.status_code == 405 and "not allowed on a non-persistent topic" in r.json()["reason"]
    finally:
        reader.close()
        owner.close()
