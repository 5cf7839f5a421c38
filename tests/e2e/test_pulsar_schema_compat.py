"""Schema compatibility with the official ``pulsar-client`` against a real ``compactor serve``:
records evolving (a field added with a default, one added without, one removed) under each of
Pulsar's strategies, set per topic and per namespace over Pulsar's admin paths; producers and
consumers refused with ``IncompatibleSchema``; auto-update and validation switches; the schema
admin paths' upload (409) and compatibility check. Each test works in a namespace of its own on
the shared server, so that its policies touch no other test."""

from __future__ import annotations

import json
import math
import socket
import uuid

import httpx
import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from tests.conftest import Server
from tests.e2e.raw_wire import connect, raw, read_frame

# Whether each strategy takes a field added with a default, one added without, one removed (that
# had no default): Pulsar's answers, the table the rules' unit tests judge too.
from tests.service.test_schema_compat import EXPECTED

pytestmark = [pytest.mark.e2e]


class User(Record):
    name = String()


class UserWithAge(Record):
    """``User`` with a field added that has a default (null)."""

    name = String()
    age = Integer(required_default=True)


class UserNeedsAge(Record):
    """``User`` with a field added without a default."""

    name = String()
    age = Integer()


def namespace(http: httpx.Client) -> str:
    ns = f"public/compat-{uuid.uuid4().hex[:10]}"
    assert http.put(f"/admin/v2/namespaces/{ns}").status_code == 204
    return ns


def topic_in(ns: str) -> str:
    return f"persistent://{ns}/t-{uuid.uuid4().hex[:10]}"


def admin(topic: str) -> str:
    return f"/admin/v2/persistent/{topic.removeprefix('persistent://')}"


def schemas(topic: str) -> str:
    return f"/admin/v2/schemas/{topic.removeprefix('persistent://')}"


def versions(http: httpx.Client, topic: str) -> int:
    return len(http.get(f"{schemas(topic)}/schemas").json()["getSchemaResponses"])


def takes(client: pulsar.Client, topic: str, schema: object) -> bool:
    try:
        client.create_producer(topic, schema=schema).close()
    except pulsar.IncompatibleSchema:
        return False
    return True


@pytest.mark.parametrize("strategy", sorted(EXPECTED))
def test_each_strategy_takes_and_refuses_producers_as_pulsar(
    strategy: str, client: pulsar.Client, http: httpx.Client
) -> None:
    ns = namespace(http)
    outcomes = []
    for first, then in ((User, UserWithAge), (User, UserNeedsAge), (UserNeedsAge, User)):
        topic = topic_in(ns)
        client.create_producer(topic, schema=AvroSchema(first)).close()  # a topic's first: any
        # Pulsar's admin sets a topic's strategy with PUT.
        r = http.put(f"{admin(topic)}/schemaCompatibilityStrategy", json=strategy)
        assert r.status_code == 204, r.text
        outcomes.append(takes(client, topic, AvroSchema(then)))
        # A refused schema adds no version; the first schema is still the topic's.
        assert versions(http, topic) == (2 if outcomes[-1] else 1)
        assert takes(client, topic, AvroSchema(first))
    assert tuple(outcomes) == EXPECTED[strategy]


def test_a_namespace_strategy_applies_to_its_json_topics_and_a_topic_strategy_overrides_it(
    client: pulsar.Client, http: httpx.Client
) -> None:
    ns = namespace(http)
    path = f"/admin/v2/namespaces/{ns}/schemaCompatibilityStrategy"
    assert http.get(path).json() == "UNDEFINED"  # not set: the service's (FULL)
    assert http.put(path, json="BACKWARD").status_code == 204
    assert http.get(path).json() == "BACKWARD"
    topic = topic_in(ns)
    client.create_producer(topic, schema=JsonSchema(User)).close()
    assert not takes(client, topic, JsonSchema(UserNeedsAge))
    assert takes(client, topic, JsonSchema(UserWithAge))
    strategy = f"{admin(topic)}/schemaCompatibilityStrategy"
    assert http.get(strategy).json() is None
    assert http.get(strategy, params={"applied": "true"}).json() == "BACKWARD"
    # The topic's own strategy wins over its namespace's; removed, the namespace's is back.
    assert http.post(strategy, json="ALWAYS_COMPATIBLE").status_code == 204
    assert http.get(strategy).json() == "ALWAYS_COMPATIBLE"
    assert takes(client, topic, JsonSchema(UserNeedsAge))
    assert http.delete(strategy).status_code == 204
    assert http.get(strategy, params={"applied": "true"}).json() == "BACKWARD"
    # UNDEFINED unsets the namespace's: the service's default (FULL) applies.
    assert http.put(path, json="UNDEFINED").status_code == 204
    assert http.get(strategy, params={"applied": "true"}).json() == "FULL"
    assert versions(http, topic) == 3
    # Bad input: a clear 4xx with a reason, nothing changed.
    for bad in ("SOMETIMES", 3, ["FULL"]):
        r = http.put(path, json=bad)
        assert r.status_code in (400, 422) and r.json()["reason"], r.text
        r = http.post(strategy, json=bad)
        assert r.status_code in (400, 422) and r.json()["reason"], r.text
    assert http.get(path).json() == "UNDEFINED" and http.get(strategy).json() is None
    missing = "/admin/v2/namespaces/public/no-such-ns/schemaCompatibilityStrategy"
    assert http.put(missing, json="FULL").status_code == 404
    assert http.put(f"{admin(topic_in(ns))}/schemaCompatibilityStrategy", json="FULL").status_code == 404


def test_the_client_suites_schema_evolve(client: pulsar.Client, http: httpx.Client) -> None:
    """apache/pulsar-client-python's ``test_schema_evolve`` (tests/schema_test.py), in a namespace
    of its own: the namespace's strategy set to FORWARD as that test sets it, then a second
    producer whose record makes a nullable field required, and both versions read back."""

    class User1(Record):
        name = String()
        age = Integer()

    class User2(Record):
        _sorted_fields = True
        name = String()
        age = Integer(required=True)

    ns = namespace(http)
    r = http.put(
        f"/admin/v2/namespaces/{ns}/schemaCompatibilityStrategy",
        content=b'"FORWARD"',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 204
    topic = f"persistent://{ns}/schema-test-schema-evolve-2"
    producer1 = client.create_producer(topic, schema=AvroSchema(User1))
    consumer = client.subscribe(topic, "sub", schema=AvroSchema(User1))
    reader = client.create_reader(topic, schema=AvroSchema(User1), start_message_id=pulsar.MessageId.earliest)
    producer2 = client.create_producer(topic, schema=AvroSchema(User2))
    for i in range(10):
        producer1.send(User1(age=i + 100, name=f"User1 {i}"))
        producer2.send(User2(age=i + 200, name=f"User2 {i}"))
    for receive in (lambda: consumer.receive(10_000), lambda: reader.read_next(10_000)):
        for i in range(20):
            value = receive().value()
            first = i % 2 == 0
            assert value.age == math.floor(i / 2) + (100 if first else 200)
            assert value.name == f"User{1 if first else 2} {math.floor(i / 2)}"
    # Under the service's default (FULL) the second producer is refused: a null age written
    # with User1 cannot be read with User2.
    other = topic_in(namespace(http))
    client.create_producer(other, schema=AvroSchema(User1)).close()
    assert not takes(client, other, AvroSchema(User2))


def test_a_consumer_whose_schema_cannot_read_the_topic_is_refused(
    client: pulsar.Client, http: httpx.Client
) -> None:
    ns = namespace(http)
    topic = topic_in(ns)
    client.create_producer(topic, schema=AvroSchema(User)).send(User(name="ann"))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(topic, "s", schema=AvroSchema(UserNeedsAge))
    with pytest.raises(pulsar.IncompatibleSchema):  # another type than the topic's
        client.subscribe(topic, "s", schema=JsonSchema(User))
    consumer = client.subscribe(
        topic, "s", schema=AvroSchema(UserWithAge), initial_position=pulsar.InitialPosition.Earliest
    )
    got = consumer.receive(10_000).value()
    assert (got.name, got.age) == ("ann", None)
    assert versions(http, topic) == 1  # a consumer adds no version to a topic that has one
    # A topic of raw bytes that has data: a consumer's schema is refused, as Pulsar refuses it
    # (the data was not written with it), and none is kept.
    raw_topic = topic_in(ns)
    client.create_producer(raw_topic).send(b"not a record")
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(raw_topic, "s", schema=AvroSchema(User))
    assert http.get(f"{schemas(raw_topic)}/schema").status_code == 404
    client.subscribe(raw_topic, "bytes").close()  # a consumer of bytes is welcome


def test_without_auto_update_producers_use_only_uploaded_schemas(
    client: pulsar.Client, http: httpx.Client
) -> None:
    ns = namespace(http)
    switch = f"/admin/v2/namespaces/{ns}/isAllowAutoUpdateSchema"
    assert http.get(switch).json() is True  # the service's default
    assert http.post(switch, json=False).status_code == 204
    assert http.get(switch).json() is False
    topic = topic_in(ns)
    assert not takes(client, topic, AvroSchema(User))
    definition = AvroSchema(User).schema_info().schema()
    r = http.post(f"{schemas(topic)}/schema", json={"type": "AVRO", "schema": definition})
    assert r.status_code == 200 and r.json() == {"version": 0}
    assert takes(client, topic, AvroSchema(User))
    assert not takes(client, topic, AvroSchema(UserWithAge))  # compatible, but not uploaded
    assert versions(http, topic) == 1
    r = http.post(switch, json="yes")
    assert r.status_code == 400 and r.json()["reason"]


def test_schema_validation_enforced_refuses_producers_without_a_schema(
    client: pulsar.Client, http: httpx.Client
) -> None:
    ns = namespace(http)
    typed, untyped = topic_in(ns), topic_in(ns)
    client.create_producer(typed, schema=AvroSchema(User)).close()
    client.create_producer(typed).close()  # not enforced by default: accepted
    assert http.post(f"/admin/v2/namespaces/{ns}/schemaValidationEnforced", json=True).status_code == 204
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(typed)
    client.create_producer(untyped).close()  # a topic without a schema takes raw bytes still
    # The topic's own setting wins over its namespace's.
    assert http.post(f"{admin(typed)}/schemaValidationEnforced", json=False).status_code == 204
    client.create_producer(typed).close()


def test_the_upload_answers_409_and_the_compatibility_path_answers_as_pulsar(http: httpx.Client) -> None:
    ns = namespace(http)
    topic = topic_in(ns)
    upload, check = f"{schemas(topic)}/schema", f"{schemas(topic)}/compatibility"

    def body(record: type[Record]) -> dict[str, str]:
        return {"type": "AVRO", "schema": AvroSchema(record).schema_info().schema()}

    # A topic without a schema takes any.
    assert http.post(check, json=body(UserNeedsAge)).json()["isCompatibility"] is True
    assert http.post(upload, json=body(User)).json() == {"version": 0}
    r = http.post(check, json=body(UserNeedsAge))
    assert r.status_code == 200
    answer = r.json()
    assert answer["isCompatibility"] is False and answer["schemaCompatibilityStrategy"] == "FULL"
    assert "'age'" in answer["reason"]
    assert http.post(check, json=body(UserWithAge)).json() == {
        "isCompatibility": True,
        "schemaCompatibilityStrategy": "FULL",
        "reason": None,
    }
    r = http.post(upload, json=body(UserNeedsAge))
    assert r.status_code == 409 and "strategy FULL" in r.json()["reason"]
    r = http.post(upload, json={"type": "JSON", "schema": body(User)["schema"]})
    assert r.status_code == 409 and "new schema type JSON" in r.json()["reason"]
    assert versions(http, topic) == 1
    # The namespace's strategy decides for a topic without its own.
    r = http.put(f"/admin/v2/namespaces/{ns}/schemaCompatibilityStrategy", json="FORWARD")
    assert r.status_code == 204
    assert http.post(check, json=body(UserNeedsAge)).json()["schemaCompatibilityStrategy"] == "FORWARD"
    assert http.post(upload, json=body(UserNeedsAge)).json() == {"version": 1}
    for bad in ({"type": "AVRO"}, {"type": "NOPE", "schema": ""}, [1]):
        r = http.post(check, json=bad)
        assert r.status_code == 422 and r.json()["reason"], r.text
    missing = "/admin/v2/schemas/public/no-such-ns/t/compatibility"
    assert http.post(missing, json=body(User)).status_code == 404


def test_get_or_create_schema_refuses_an_incompatible_schema_with_pulsars_code(
    shared_server: Server, http: httpx.Client
) -> None:
    topic = topic_in(namespace(http))
    first = AvroSchema(User).schema_info().schema()
    assert http.post(f"{schemas(topic)}/schema", json={"type": "AVRO", "schema": first}).status_code == 200

    def ask(s: socket.socket, request_id: int, record: type[Record]) -> pb.CommandGetOrCreateSchemaResponse:
        data = AvroSchema(record).schema_info().schema().encode()
        schema = pb.Schema(name="u", schema_data=data, type=pb.Schema.Avro)
        kind = pb.BaseCommand.GET_OR_CREATE_SCHEMA
        s.sendall(encode(command(kind, request_id=request_id, topic=topic, schema=schema)))
        return read_frame(s).getOrCreateSchemaResponse

    with raw(shared_server) as s:
        connect(s)
        refused = ask(s, 1, UserNeedsAge)
        assert refused.request_id == 1 and refused.error_code == pb.IncompatibleSchema
        assert "strategy FULL" in refused.error_message
        taken = ask(s, 2, UserWithAge)
        assert not taken.HasField("error_code") and taken.schema_version == (1).to_bytes(8, "big")
        # The connection serves on after a refusal.
        assert ask(s, 3, User).schema_version == (0).to_bytes(8, "big")
    assert json.loads(http.get(f"{schemas(topic)}/schema").json()["data"])["name"] == "UserWithAge"
