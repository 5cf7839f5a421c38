"""Schemas and ordering keys with the official ``pulsar-client`` against a real ``compactor
serve``: the topic keeps each schema a producer declares as a version, every message carries
the version it was written with, and Key_Shared routes by a message's ordering key. (Which new
versions a topic admits: tests/e2e/test_pulsar_schema_compat.py.)"""

from __future__ import annotations

import json
import uuid

import httpx
import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String, StringSchema

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from tests.conftest import Server
from tests.e2e.raw_wire import connect, raw, read_frame

pytestmark = [pytest.mark.e2e]


class Order(Record):
    id = String()
    amount = Integer()


class Payment(Record):
    order = String()
    cents = Integer()
    currency = String()


def fresh(prefix: str = "schema") -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


def schemas_of(server: Server, topic: str) -> str:
    return f"{server.url}/admin/v2/schemas/{topic.removeprefix('persistent://')}"


def version(n: int) -> bytes:
    return n.to_bytes(8, "big")


def any_schema_goes(server: Server, topic: str) -> None:
    """Let the topic take any new schema (Pulsar's ALWAYS_COMPATIBLE): these tests are about
    versions, and the service's default (FULL) refuses unrelated records."""
    path = topic.removeprefix("persistent://")
    r = httpx.post(
        f"{server.url}/admin/v2/persistent/{path}/schemaCompatibilityStrategy", json="ALWAYS_COMPATIBLE"
    )
    assert r.status_code == 204, r.text


def test_a_json_producer_declares_version_0_and_its_messages_carry_it(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh()
    producer = client.create_producer(topic, schema=JsonSchema(Order), batching_enabled=False)
    consumer = client.subscribe(
        topic, "s", schema=JsonSchema(Order), initial_position=pulsar.InitialPosition.Earliest
    )
    producer.send(Order(id="o-1", amount=42), partition_key="o-1")
    got = consumer.receive(10_000)
    assert (got.value().id, got.value().amount) == ("o-1", 42)
    assert got.schema_version() == version(0).decode("latin-1") or got.schema_version() == version(0)
    body = httpx.get(f"{schemas_of(shared_server, topic)}/schema").json()
    assert body["version"] == 0 and body["type"] == "JSON"
    assert json.loads(body["data"]) == json.loads(JsonSchema(Order).schema_info().schema())
    # The same schema again (a producer restarting) is the same version, not a new one.
    client.create_producer(topic, schema=JsonSchema(Order)).close()
    assert len(httpx.get(f"{schemas_of(shared_server, topic)}/schemas").json()["getSchemaResponses"]) == 1


def test_a_new_schema_is_the_next_version_and_each_message_keeps_its_own(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh()
    first = client.create_producer(topic, schema=AvroSchema(Order), batching_enabled=False)
    first.send(Order(id="o-1", amount=1), partition_key="k")
    any_schema_goes(shared_server, topic)
    second = client.create_producer(topic, schema=AvroSchema(Payment), batching_enabled=True)
    second.send(Payment(order="o-1", cents=100, currency="EUR"), partition_key="k")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    versions = [reader.read_next(10_000).schema_version() for _ in range(2)]
    assert [_as_bytes(v) for v in versions] == [version(0), version(1)]
    listed = httpx.get(f"{schemas_of(shared_server, topic)}/schemas").json()["getSchemaResponses"]
    assert [(s["version"], s["type"]) for s in listed] == [(0, "AVRO"), (1, "AVRO")]
    assert json.loads(listed[1]["data"])["name"] == "Payment"
    # Each version as the client asks for it (GET_SCHEMA, what a consumer of another version or
    # an AUTO_CONSUME consumer sends), and an unknown one refused as Pulsar does.
    with raw(shared_server) as s:
        connect(s)
        for request_id, (asked, name) in enumerate([(0, "Order"), (1, "Payment")], start=1):
            s.sendall(
                encode(
                    command(
                        pb.BaseCommand.GET_SCHEMA,
                        request_id=request_id,
                        topic=topic,
                        schema_version=version(asked),
                    )
                )
            )
            reply = read_frame(s).getSchemaResponse
            assert reply.request_id == request_id and not reply.HasField("error_code")
            assert reply.schema_version == version(asked)
            assert reply.schema.type == pb.Schema.Avro
            assert json.loads(reply.schema.schema_data)["name"] == name
        s.sendall(
            encode(command(pb.BaseCommand.GET_SCHEMA, request_id=9, topic=topic, schema_version=version(7)))
        )
        reply = read_frame(s).getSchemaResponse
        assert reply.request_id == 9 and reply.error_code == pb.TopicNotFound


def test_schema_versions_survive_compaction(client: pulsar.Client, shared_server: Server) -> None:
    topic = fresh("schema-compacted")
    producer = client.create_producer(topic, schema=StringSchema(), batching_enabled=True)
    for i in range(10):
        producer.send_async(f"v{i}", None, partition_key=f"k{i % 3}", ordering_key=f"o{i % 2}")
    producer.flush()
    assert shared_server.compact(topic) == "SUCCESS"
    consumer = client.subscribe(
        topic,
        "compacted",
        schema=StringSchema(),
        is_read_compacted=True,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    got = [consumer.receive(10_000) for _ in range(3)]
    assert {m.partition_key(): m.value() for m in got} == {"k0": "v9", "k1": "v7", "k2": "v8"}
    assert {_as_bytes(m.schema_version()) for m in got} == {version(0)}
    assert {m.partition_key(): m.ordering_key() for m in got} == {"k0": "o1", "k1": "o1", "k2": "o0"}


def test_a_consumer_schema_is_the_first_version_of_a_topic_without_one(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh()
    client.subscribe(topic, "s", schema=JsonSchema(Order)).close()
    assert httpx.get(f"{schemas_of(shared_server, topic)}/schema").json()["version"] == 0
    # A consumer of another schema later does not add a version (only producers do).
    any_schema_goes(shared_server, topic)
    client.subscribe(topic, "t", schema=JsonSchema(Payment)).close()
    assert len(httpx.get(f"{schemas_of(shared_server, topic)}/schemas").json()["getSchemaResponses"]) == 1


def test_key_shared_routes_by_the_ordering_key(client: pulsar.Client) -> None:
    """Pulsar's rule: where a message has an ordering key, Key_Shared keeps that key's messages
    on one consumer and in order, whatever their partition keys."""
    topic = fresh("ordering")
    consumers = [
        client.subscribe(
            topic,
            "ks",
            consumer_type=pulsar.ConsumerType.KeyShared,
            initial_position=pulsar.InitialPosition.Earliest,
            consumer_name=f"c{i}",
        )
        for i in range(2)
    ]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(60):
        producer.send(f"{i}".encode(), partition_key=f"p{i}", ordering_key=f"o{i % 3}")
    seen: dict[str, list[tuple[str, int]]] = {}
    received = 0
    while received < 60:
        for c in consumers:
            try:
                m = c.receive(200)
            except pulsar.Timeout:
                continue
            received += 1
            c.acknowledge(m)
            seen.setdefault(m.ordering_key(), []).append((c.consumer_name(), int(m.data())))
    assert set(seen) == {"o0", "o1", "o2"}
    for key, deliveries in seen.items():
        assert len({name for name, _ in deliveries}) == 1, (key, deliveries)
        numbers = [n for _, n in deliveries]
        assert numbers == sorted(numbers)
    # Routed by the partition keys (60 distinct) instead, both consumers would see every
    # ordering key; the partition key is still each message's own.


def test_schemas_over_rest(shared_server: Server) -> None:
    topic = fresh("rest")
    url = schemas_of(shared_server, topic)
    with httpx.Client(timeout=30) as http:
        r = http.get(f"{url}/schema")
        assert r.status_code == 404 and "has no schema" in r.json()["reason"]
        definition = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
        r = http.post(f"{url}/schema", json={"type": "AVRO", "schema": definition, "properties": {"p": "q"}})
        assert r.status_code == 200 and r.json() == {"version": 0}
        # Uploading before the topic exists is allowed (the namespace must exist).
        assert http.get(f"{shared_server.url}/admin/v2/persistent/public/default").status_code == 200
        got = http.get(f"{url}/schema/0").json()
        assert (got["type"], got["data"], got["properties"]) == ("AVRO", definition, {"p": "q"})
        assert http.post(
            f"{url}/schema", json={"type": "AVRO", "schema": definition, "properties": {"p": "q"}}
        ).json() == {"version": 0}
        # A field added with a default: the next version under the default strategy (FULL).
        evolved = json.dumps(
            {
                "type": "record",
                "name": "R",
                "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": "int", "default": 0}],
            }
        )
        assert http.post(f"{url}/schema", json={"type": "AVRO", "schema": evolved}).json() == {"version": 1}
        assert http.get(f"{url}/schema").json()["version"] == 1
        # Bad input: 4xx with a reason, nothing added.
        # (JSON may escape a lone surrogate, which no schema text can hold.)
        for bad in (
            '{"type": "NOPE", "schema": ""}',
            '{"schema": "x"}',
            '{"type": "JSON", "schema": "\\ud800"}',
        ):
            r = http.post(f"{url}/schema", content=bad, headers={"content-type": "application/json"})
            assert r.status_code in (400, 422) and r.json()["reason"], (bad, r.text)
        assert http.get(f"{url}/schema/5").status_code == 404
        assert http.get(f"{url}/schema/-1").status_code == 422
        missing = f"{shared_server.url}/admin/v2/schemas/public/no-such-ns/t/schema"
        assert http.post(missing, json={"type": "STRING", "schema": ""}).status_code == 404
        assert len(http.get(f"{url}/schemas").json()["getSchemaResponses"]) == 2
        assert http.delete(f"{url}/schema").json() == {"version": 1}
        assert http.get(f"{url}/schema").status_code == 404


def test_deleting_a_topic_deletes_its_schema(client: pulsar.Client, shared_server: Server) -> None:
    topic = fresh()
    client.create_producer(topic, schema=JsonSchema(Order)).close()
    admin = f"{shared_server.url}/admin/v2/persistent/{topic.removeprefix('persistent://')}"
    assert httpx.delete(admin).status_code == 204
    assert httpx.get(f"{schemas_of(shared_server, topic)}/schema").status_code == 404
    # A topic created again under the name starts without one: version 0 again.
    client.create_producer(topic, schema=JsonSchema(Payment)).close()
    assert httpx.get(f"{schemas_of(shared_server, topic)}/schema").json()["version"] == 0


def _as_bytes(v: str | bytes) -> bytes:
    return v if isinstance(v, bytes) else v.encode("latin-1")
