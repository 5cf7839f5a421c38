"""Admin REST as Pulsar's admin clients send it (issue 51), against a real ``compactor serve``:
partitioned topics created with properties, a namespace's topics (also of a namespace that does
not exist, over REST and the binary protocol), a message by its id, and lookups that create the
topic they look up. The Go and Java admin clients themselves: ``test_go_java_admin.py``."""

from __future__ import annotations

import base64
import json
import re
import struct
import uuid
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from tests.conftest import Server
from tests.e2e.conftest import QUIET
from tests.e2e.partitioned import ADMIN, fresh, full
from tests.e2e.raw_wire import connect, raw, read_frame
from tests.e2e.test_pulsar_encryption import KEY_NAME, encrypting, keys

__all__ = ["keys"]  # the fixture, used here by name

pytestmark = [pytest.mark.e2e]

METADATA_TYPE = "application/vnd.partitioned-topic-metadata+json"


def _missing_namespace() -> str:
    return f"public/missing-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------ partitioned topics


def test_a_partitioned_topic_keeps_the_properties_it_is_created_with(http: httpx.Client) -> None:
    name = fresh("props")
    body = json.dumps({"partitions": 2, "properties": {"owner": "ops", "tier": "gold"}, "deleted": False})
    # Java's admin client with properties (and Go's pulsaradmin always): Pulsar's media type.
    r = http.put(f"{ADMIN}/{name}/partitions", content=body, headers={"Content-Type": METADATA_TYPE})
    assert r.status_code == 204, r.text
    assert http.get(f"{ADMIN}/{name}/partitions").json() == {
        "partitions": 2,
        "properties": {"owner": "ops", "tier": "gold"},
    }
    assert http.get(f"{ADMIN}/{name}-partition-1/partitions").json() == {"partitions": 0}
    # Grown, it keeps them; its partitions are topics of the namespace.
    assert http.post(f"{ADMIN}/{name}/partitions", json=3).status_code == 204
    assert http.get(f"{ADMIN}/{name}/partitions").json()["properties"] == {"owner": "ops", "tier": "gold"}
    topics = http.get("/admin/v2/namespaces/public/default/topics").json()
    assert {f"{full(name)}-partition-{i}" for i in range(3)} <= set(topics)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("3", "application/json"),  # Java's admin client without properties: a bare number
        ('{"properties": null, "partitions": 3}', METADATA_TYPE),  # Go's pulsaradmin without any
        ('{"partitions": 3}', "application/json"),
    ],
)
def test_a_partitioned_topic_is_created_from_each_form_the_clients_send(
    http: httpx.Client, body: str, content_type: str
) -> None:
    name = fresh("forms")
    r = http.put(f"{ADMIN}/{name}/partitions", content=body, headers={"Content-Type": content_type})
    assert r.status_code == 204, r.text
    assert http.get(f"{ADMIN}/{name}/partitions").json() == {"partitions": 3}
    assert full(name) in http.get(f"{ADMIN}/partitioned").json()


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ('{"partitions": 0}', "metadata.partitions"),
        ("{}", "metadata.partitions"),
        ('{"partitions": "x"}', "metadata.partitions"),
        ('{"partitions": 2, "properties": {"a": 1}}', "metadata.properties.a"),
        ('{"partitions": 2, "properties": [1]}', "metadata.properties"),
        ("2.5", "count"),
        ("[2]", "count"),
        ("null", "count"),
        ("0", "count"),
    ],
)
def test_a_bad_create_body_is_refused_with_its_reason_and_creates_nothing(
    http: httpx.Client, body: str, where: str
) -> None:
    name = fresh("bad")
    r = http.put(f"{ADMIN}/{name}/partitions", content=body, headers={"Content-Type": METADATA_TYPE})
    assert r.status_code == 422, r.text
    assert r.json()["reason"].startswith(where), r.json()
    assert http.get(f"{ADMIN}/{name}/partitions").json() == {"partitions": 0}
    assert full(name) not in http.get(f"{ADMIN}/partitioned").json()


def test_the_non_persistent_partitioned_list_the_admin_clients_ask_is_empty(http: httpx.Client) -> None:
    assert http.get("/admin/v2/non-persistent/public/default/partitioned").json() == []
    r = http.get(f"/admin/v2/non-persistent/{_missing_namespace()}/partitioned")
    assert r.status_code == 404 and "does not exist" in r.json()["reason"]


# ------------------------------------------------------------------ a namespace's topics


def test_a_namespace_that_does_not_exist_has_no_topics_over_rest(http: httpx.Client) -> None:
    missing = _missing_namespace()
    for mode in ("PERSISTENT", "NON_PERSISTENT", "ALL"):
        r = http.get(
            f"/admin/v2/namespaces/{missing}/topics", params={"mode": mode, "includeSystemTopic": "true"}
        )
        assert (r.status_code, r.json()) == (200, []), mode
    # So do the admin clients' lists of its topics (Pulsar's 4.0.7 answers 404 to those).
    assert http.get(f"/admin/v2/persistent/{missing}").json() == []
    assert http.get(f"/admin/v2/persistent/{missing}/partitioned").status_code == 404
    assert http.get(f"/admin/v2/namespaces/{missing}/topics", params={"mode": "SOME"}).status_code == 422


def _topics_of_namespace(server: Server, namespace: str, mode: int) -> pb.BaseCommand:
    with raw(server) as s:
        connect(s)
        s.sendall(
            encode(
                command(pb.BaseCommand.GET_TOPICS_OF_NAMESPACE, request_id=7, namespace=namespace, mode=mode)
            )
        )
        return read_frame(s)


def test_a_namespace_that_does_not_exist_has_no_topics_over_the_wire(shared_server: Server) -> None:
    missing = _missing_namespace()
    modes = pb.CommandGetTopicsOfNamespace
    for mode in (modes.PERSISTENT, modes.NON_PERSISTENT, modes.ALL):
        answer = _topics_of_namespace(shared_server, missing, mode)
        assert answer.type == pb.BaseCommand.GET_TOPICS_OF_NAMESPACE_RESPONSE, answer
        assert list(answer.getTopicsOfNamespaceResponse.topics) == []
    # A name that is no namespace is still refused.
    answer = _topics_of_namespace(shared_server, "not a namespace", modes.PERSISTENT)
    assert answer.type == pb.BaseCommand.ERROR and answer.error.error == pb.NotAllowedError


def test_a_pattern_consumer_subscribes_before_its_namespace_has_topics(
    client: pulsar.Client, http: httpx.Client
) -> None:
    missing = _missing_namespace()
    consumer = client.subscribe(
        re.compile(f"persistent://{missing}/.*"), "s", pattern_auto_discovery_period=1
    )
    consumer.close()
    # And one of a namespace with topics still finds them.
    name = fresh("pattern")
    assert http.put(f"{ADMIN}/{name}").status_code == 204
    producer = client.create_producer(full(name))
    consumer = client.subscribe(
        re.compile(f"persistent://public/default/{name}"),
        "s",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer.send(b"found")
    assert consumer.receive(timeout_millis=10_000).data() == b"found"
    consumer.close()
    producer.close()


# ------------------------------------------------------------------ a message by its id


def _entry(http: httpx.Client, topic: str, ledger: int, entry: int) -> httpx.Response:
    return http.get(f"{ADMIN}/{topic}/ledger/{ledger}/entry/{entry}")


def _members(payload: bytes, n: int) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    """A batch payload's members, as Pulsar's admin clients split it."""
    out, at = [], 0
    for _ in range(n):
        (size,) = struct.unpack_from(">I", payload, at)
        single = pb.SingleMessageMetadata.FromString(payload[at + 4 : at + 4 + size])
        at += 4 + size
        out.append((single, payload[at : at + single.payload_size]))
        at += single.payload_size
    assert at == len(payload)
    return out


def test_a_message_sent_alone_is_read_by_its_id_with_pulsars_headers(
    client: pulsar.Client, http: httpx.Client
) -> None:
    name = fresh("byid")
    producer = client.create_producer(full(name), batching_enabled=False, producer_name="byid-producer")
    sent = producer.send(
        b"alone", properties={"color": "Red", "Mixed-Case": "v"}, partition_key="k1", event_timestamp=1234
    )
    producer.close()
    r = _entry(http, name, sent.ledger_id(), sent.entry_id())
    assert r.status_code == 200, r.text
    assert r.content == b"alone"
    raw_names = {k.decode() for k, _ in r.headers.raw}
    # The exact names (Java's admin client finds X-Pulsar-PROPERTY by its case).
    assert {"X-Pulsar-Message-ID", "X-Pulsar-PROPERTY", "X-Pulsar-publish-time"} <= raw_names
    assert not any(n.startswith("x-compactor") for n in raw_names)  # the marker stays inside
    assert r.headers["X-Pulsar-Message-ID"] == f"{sent.ledger_id()}:{sent.entry_id()}"
    assert json.loads(r.headers["X-Pulsar-PROPERTY"]) == {"color": "Red", "Mixed-Case": "v"}
    assert r.headers["X-Pulsar-event-time"] == "1970-01-01T00:00:01.234Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,3})?Z", r.headers["X-Pulsar-publish-time"])
    assert r.headers["X-Pulsar-partition-key"] == "k1"
    assert r.headers["X-Pulsar-producer-name"] == "byid-producer"
    assert r.headers["X-Pulsar-sequence-id"] == "0"
    assert r.headers["X-Pulsar-Is-Encrypted"] == "false"
    assert "X-Pulsar-num-batch-message" not in r.headers


def test_a_batch_is_read_by_its_id_whole_as_pulsar_answers_it(
    client: pulsar.Client, http: httpx.Client
) -> None:
    name = fresh("byidbatch")
    producer = client.create_producer(
        full(name),
        batching_enabled=True,
        batching_max_messages=3,
        batching_max_publish_delay_ms=60_000,
        compression_type=pulsar.CompressionType.LZ4,
    )
    ids = []
    for i in range(3):
        producer.send_async(
            f"member{i}".encode() * 10,
            lambda _, m: ids.append(m),
            properties={"i": str(i)},
            partition_key=f"b{i}",
        )
    producer.flush()
    producer.close()
    first = min(ids, key=lambda m: m.batch_index())
    assert {m.batch_index() for m in ids} == {0, 1, 2}
    r = _entry(http, name, first.ledger_id(), first.entry_id())
    assert r.status_code == 200, r.text
    assert r.headers["X-Pulsar-num-batch-message"] == "3"
    assert r.headers["X-Pulsar-batch-size"] == str(len(r.content))
    # The members uncompressed, each after its metadata, as the clients split them.
    members = _members(r.content, 3)
    assert [p for _, p in members] == [f"member{i}".encode() * 10 for i in range(3)]
    assert [s.partition_key for s, _ in members] == ["b0", "b1", "b2"]
    assert [{kv.key: kv.value for kv in s.properties} for s, _ in members] == [
        {"i": str(i)} for i in range(3)
    ]
    # A position the batch's later members take names no entry of its own.
    later = _entry(http, name, first.ledger_id(), first.entry_id() + 1)
    assert later.status_code == 404 and "not found" in later.json()["reason"]


@pytest.mark.parametrize("batch", [0, 2])
def test_an_encrypted_message_is_read_by_its_id_as_its_ciphertext_with_its_context(
    client: pulsar.Client, http: httpx.Client, keys: pulsar.CryptoKeyReader, batch: int
) -> None:
    name = fresh("byidcrypt")
    producer = encrypting(client, full(name), keys, batch=batch)
    ids: list[pulsar.MessageId] = []
    for i in range(max(batch, 1)):
        producer.send_async(f"secret{i}".encode() * 8, lambda _, m: ids.append(m))
    producer.flush()
    producer.close()
    first = min(ids, key=lambda m: m.batch_index())
    r = _entry(http, name, first.ledger_id(), first.entry_id())
    assert r.status_code == 200, r.text
    assert r.headers["X-Pulsar-Is-Encrypted"] == "true"
    assert b"secret" not in r.content  # the ciphertext, never decrypted here
    assert r.headers["X-Pulsar-compression"] == "LZ4" and int(r.headers["X-Pulsar-uncompressed-size"]) > 0
    assert r.headers["X-Pulsar-encryption-algo"] is not None
    assert base64.b64decode(r.headers["X-Pulsar-Base64-encryption-param"])
    (encoded,) = [v for k, v in r.headers.raw if k == b"X-Pulsar-Base64-encryption-keys"]
    key = pb.EncryptionKeys.FromString(base64.b64decode(encoded))
    assert key.key == KEY_NAME and key.value
    if batch:
        assert r.headers["X-Pulsar-num-batch-message"] == str(batch)
    # A consumer with the key reads the same message.
    consumer = client.subscribe(
        full(name), "s", crypto_key_reader=keys, initial_position=pulsar.InitialPosition.Earliest
    )
    assert consumer.receive(timeout_millis=10_000).data() == b"secret0" * 8
    consumer.close()


def test_an_id_that_names_no_message_is_not_found_with_a_reason(
    client: pulsar.Client, http: httpx.Client
) -> None:
    name = fresh("byidmissing")
    producer = client.create_producer(full(name), batching_enabled=False)
    sent = producer.send(b"one")
    producer.close()
    for ledger, entry in ((sent.ledger_id(), sent.entry_id() + 1), (sent.ledger_id() + 1000, 0), (0, 0)):
        r = _entry(http, name, ledger, entry)
        assert r.status_code == 404, (ledger, entry, r.text)
        assert f"message id {ledger}:{entry} not found" in r.json()["reason"]
    assert _entry(http, fresh("nosuchtopic"), 1, 0).status_code == 404
    for bad in ("abc", "-1", str(2**63)):
        r = http.get(f"{ADMIN}/{name}/ledger/{bad}/entry/0")
        assert r.status_code == 422 and r.json()["reason"], (bad, r.text)


def test_a_partitioned_topic_name_is_no_topic_to_read_an_id_of(http: httpx.Client) -> None:
    name = fresh("byidpart")
    assert http.put(f"{ADMIN}/{name}/partitions", json=2).status_code == 204
    r = _entry(http, name, 1, 0)
    assert r.status_code == 405 and "partition" in r.json()["reason"]


# ------------------------------------------------------------------ lookups that create


def _lookup_frame(server: Server, topic: str) -> pb.CommandLookupTopicResponse:
    with raw(server) as s:
        connect(s)
        s.sendall(encode(command(pb.BaseCommand.LOOKUP, request_id=3, topic=topic, authoritative=False)))
        answer = read_frame(s)
    assert answer.type == pb.BaseCommand.LOOKUP_RESPONSE, answer
    return answer.lookupTopicResponse


def test_an_http_lookup_creates_the_topic_it_looks_up(http: httpx.Client, shared_server: Server) -> None:
    name = fresh("lookup")
    r = http.get(f"/lookup/v2/topic/persistent/public/default/{name}")
    assert r.status_code == 200 and r.json()["brokerUrl"] == shared_server.pulsar_url, r.text
    assert full(name) in http.get(ADMIN).json()
    assert http.get(f"{ADMIN}/{name}/stats").status_code == 200
    # Looked up again: the same answer, the topic as it was.
    assert http.get(f"/lookup/v2/topic/persistent/public/default/{name}").json() == r.json()


def test_a_binary_lookup_creates_the_topic_it_looks_up(http: httpx.Client, shared_server: Server) -> None:
    name = fresh("wirelookup")
    answer = _lookup_frame(shared_server, full(name))
    assert answer.response == pb.CommandLookupTopicResponse.Connect, answer
    assert full(name) in http.get(ADMIN).json()


def test_a_lookup_in_a_namespace_that_does_not_exist_is_not_found(
    http: httpx.Client, shared_server: Server
) -> None:
    missing = _missing_namespace()
    r = http.get(f"/lookup/v2/topic/persistent/{missing}/t")
    assert r.status_code == 404 and "does not exist" in r.json()["reason"]
    answer = _lookup_frame(shared_server, f"persistent://{missing}/t")
    assert answer.response == pb.CommandLookupTopicResponse.Failed
    assert answer.error == pb.TopicNotFound and "does not exist" in answer.message
    r = http.get(f"/lookup/v2/topic/non-persistent/{missing}/t")
    assert r.status_code == 404


def test_a_lookup_of_a_partitioned_topic_creates_no_topic_of_its_name(http: httpx.Client) -> None:
    name = fresh("lookuppart")
    assert http.put(f"{ADMIN}/{name}/partitions", json=2).status_code == 204
    assert http.get(f"/lookup/v2/topic/persistent/public/default/{name}").status_code == 200
    assert full(name) not in http.get(ADMIN).json()
    assert http.get(f"{ADMIN}/{name}/partitions").json() == {"partitions": 2}
    # A partition that is not one of its partitions is not found, and not made.
    assert http.get(f"/lookup/v2/topic/persistent/public/default/{name}-partition-5").status_code == 404


def test_with_auto_creation_off_a_lookup_of_a_new_topic_is_not_found(
    server_factory: type[Server], tmp_path: Path
) -> None:
    server = server_factory(tmp_path / "data", env={"COMPACTOR_ALLOW_AUTO_TOPIC_CREATION": "false"})
    server.start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.get("/lookup/v2/topic/persistent/public/default/new")
        assert r.status_code == 404 and "not found" in r.json()["reason"], r.text
        answer = _lookup_frame(server, "persistent://public/default/new")
        assert answer.response == pb.CommandLookupTopicResponse.Failed and answer.error == pb.TopicNotFound
        assert http.get(ADMIN).json() == []
        # A topic that exists is looked up as before.
        assert http.put(f"{ADMIN}/there").status_code == 204
        assert http.get("/lookup/v2/topic/persistent/public/default/there").status_code == 200
    c = pulsar.Client(server.pulsar_url, operation_timeout_seconds=10, logger=QUIET)
    try:
        with pytest.raises(pulsar.TopicNotFound):
            c.create_producer("persistent://public/default/new")
    finally:
        c.close()


def test_the_openapi_document_describes_the_new_routes(http: httpx.Client) -> None:
    doc = http.get("/openapi.json").json()
    create = doc["paths"]["/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions"]["put"]
    assert {"application/json", METADATA_TYPE} <= set(create["requestBody"]["content"])
    assert "422" in create["responses"] and "409" in create["responses"]
    by_id = doc["paths"][
        "/admin/v2/persistent/{tenant}/{namespace}/{topic}/ledger/{ledger_id}/entry/{entry_id}"
    ]["get"]
    assert "application/octet-stream" in by_id["responses"]["200"]["content"]
    assert {"404", "405", "422"} <= set(by_id["responses"])
