"""Pulsar's HTTP lookup and advertised listeners, judged by the official ``pulsar-client``.

A client given ``http://host:port`` as its service URL asks the REST paths where a topic is
(the partitioned metadata, then ``/lookup/v2/topic/...``) and connects to the broker URL they
answer; a client naming an advertised listener is answered that listener's URL, and one naming
a listener the service does not have is refused, as Pulsar's broker refuses it.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from tests.conftest import SUPERUSER, SecureServer, Server
from tests.e2e.raw_wire import connect, raw, read_frame
from tests.server import free_port

pytestmark = [pytest.mark.e2e]

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def fresh(prefix: str = "hl") -> str:
    return f"public/default/{prefix}-{uuid.uuid4().hex[:10]}"


def _produce_and_consume(client: pulsar.Client, topic: str, n: int = 6) -> list[pulsar.Message]:
    """Send ``n`` messages and receive them on a new subscription from the earliest."""
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [f"m{i}".encode() for i in range(n)]
    for value in sent:
        producer.send(value)  # no key: a partitioned topic's round robin covers every partition
    got = [consumer.receive(10_000) for _ in range(n)]
    for m in got:
        consumer.acknowledge(m)
    assert sorted(m.data() for m in got) == sorted(sent)
    return got


# ------------------------------------------------------------------ a client given the HTTP URL


def test_a_client_given_the_http_url_produces_and_consumes(shared_server: Server) -> None:
    topic = fresh()
    client = pulsar.Client(shared_server.url, logger=QUIET)
    try:
        got = _produce_and_consume(client, f"persistent://{topic}")
    finally:
        client.close()
    # The same topic as over REST: its messages under the ids the client received.
    r = httpx.get(f"{shared_server.url}/topics/persistent/{topic}/messages", params={"maxMessages": 100})
    assert r.status_code == 200, r.text
    ids = [f"{m.message_id().ledger_id()}:{m.message_id().entry_id()}" for m in got]
    assert [m["messageId"] for m in r.json()["messages"]] == ids


def test_a_partitioned_topic_through_the_http_lookup(shared_server: Server) -> None:
    topic = fresh("parted")
    r = httpx.put(f"{shared_server.url}/admin/v2/persistent/{topic}/partitions", json=3)
    assert r.status_code == 204, r.text
    name = f"persistent://{topic}"
    client = pulsar.Client(shared_server.url, logger=QUIET)
    try:
        partitions = [f"{name}-partition-{i}" for i in range(3)]
        assert client.get_topic_partitions(name) == partitions
        got = _produce_and_consume(client, name, n=9)
    finally:
        client.close()
    # Round-robin over the three partitions: each received from the one it was routed to.
    assert {m.topic_name() for m in got} == set(partitions)


def test_a_pattern_consumer_through_the_http_url(shared_server: Server) -> None:
    prefix = f"hlpat{uuid.uuid4().hex[:6]}"
    topics = [f"persistent://public/default/{prefix}-{i}" for i in range(3)]
    client = pulsar.Client(shared_server.url, logger=QUIET)
    try:
        for t in topics:
            client.create_producer(t).close()
        # The namespace's topic list, at Pulsar's path, as the client asks it.
        r = httpx.get(
            f"{shared_server.url}/admin/v2/namespaces/public/default/topics", params={"mode": "PERSISTENT"}
        )
        assert r.status_code == 200, r.text
        assert set(topics) <= set(r.json())
        consumer = client.subscribe(
            re.compile(f"persistent://public/default/{prefix}-.*"),
            "s",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        for i, t in enumerate(topics):
            client.create_producer(t, batching_enabled=False).send(f"from {i}".encode())
        got = sorted(consumer.receive(10_000).data() for _ in topics)
        assert got == [f"from {i}".encode() for i in range(3)]
    finally:
        client.close()
    # A namespace that does not exist has no topics (issue 51), as over the binary protocol.
    r = httpx.get(f"{shared_server.url}/admin/v2/namespaces/public/no-such-namespace/topics")
    assert (r.status_code, r.json()) == (200, []), r.text


def test_the_lookup_answers_pulsars_lookup_data(shared_server: Server) -> None:
    topic = fresh()
    body = httpx.get(f"{shared_server.url}/lookup/v2/topic/persistent/{topic}").json()
    # No TLS: no brokerUrlTls nor httpUrlTls; brokerUrlSsl empty, as Pulsar's broker sends it.
    assert body == {
        "brokerUrl": shared_server.pulsar_url,
        "httpUrl": shared_server.url,
        "nativeUrl": shared_server.pulsar_url,
        "brokerUrlSsl": "",
    }
    # A lookup creates the topic (issue 51; tests/e2e/test_admin_rest_clients.py).
    listed = httpx.get(f"{shared_server.url}/admin/v2/persistent/public/default").json()
    assert f"persistent://{topic}" in listed
    # The partitioned metadata, with the parameters Pulsar's clients send: 0 for a plain topic.
    meta = f"{shared_server.url}/admin/v2/persistent/{topic}/partitions"
    r = httpx.get(meta, params={"checkAllowAutoCreation": "true", "authoritative": "false"})
    assert (r.status_code, r.json()) == (200, {"partitions": 0})
    # The query parameter and header Pulsar's clients send name no listener here: refused.
    look = f"{shared_server.url}/lookup/v2/topic/persistent/{topic}"
    for r in (
        httpx.get(look, params={"authoritative": "true", "listenerName": "external"}),
        httpx.get(look, headers={"X-Pulsar-ListenerName": "external"}),
    ):
        assert r.status_code == 404, r.text
        assert r.json()["reason"].startswith("the broker do not have external listener")


@pytest.mark.parametrize(
    ("path", "status", "reason"),
    [
        ("/lookup/v2/topic/nonsense/public/default/x", 422, "domain"),
        ("/lookup/v2/topic/persistent/public/default/" + "x" * 129, 400, "invalid topic name"),
        ("/lookup/v2/topic/persistent/public/def ault/x", 400, "invalid"),
        ("/lookup/v2/topic/persistent/public/default/a%2Fb", 400, "'/' is not allowed"),
    ],
)
def test_a_bad_lookup_is_refused_with_a_reason(
    shared_server: Server, path: str, status: int, reason: str
) -> None:
    r = httpx.get(shared_server.url + path)
    assert r.status_code == status, r.text
    assert reason in r.json()["reason"]


# ------------------------------------------------------------------ with security on


def test_the_http_lookup_needs_a_token_and_the_lookup_permission(secure_server: SecureServer) -> None:
    s = secure_server
    tenant = f"hl{uuid.uuid4().hex[:8]}"
    topic = f"{tenant}/ns/t"
    with httpx.Client(base_url=s.url, headers=s.headers(SUPERUSER), timeout=30) as http:
        assert http.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": []}).status_code == 204
        assert http.put(f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
        assert http.put(f"/admin/v2/persistent/{topic}").status_code == 204
        r = http.post(f"/admin/v2/namespaces/{tenant}/ns/permissions/reader", json=["consume"])
        assert r.status_code == 204, r.text
    for path in (f"/lookup/v2/topic/persistent/{topic}", f"/admin/v2/persistent/{topic}/partitions"):
        r = httpx.get(s.url + path)
        assert r.status_code == 401, r.text
        assert "authentication required" in r.json()["reason"]
        r = httpx.get(s.url + path, headers=s.headers("stranger"))
        assert r.status_code == 403, r.text
        assert "role 'stranger' is not authorized to look up" in r.json()["reason"]
        assert httpx.get(s.url + path, headers=s.headers("reader")).status_code == 200
    # The official client sends its token on the HTTP lookup as on the wire.
    client = pulsar.Client(s.url, authentication=pulsar.AuthenticationToken(s.token("reader")), logger=QUIET)
    try:
        consumer = client.subscribe(f"persistent://{topic}", "s")
        consumer.close()
    finally:
        client.close()
    anonymous = pulsar.Client(s.url, logger=QUIET, operation_timeout_seconds=5)
    try:
        with pytest.raises(pulsar.PulsarException):
            anonymous.subscribe(f"persistent://{topic}", "s")
    finally:
        anonymous.close()


# ------------------------------------------------------------------ advertised listeners


def test_a_listener_name_the_service_does_not_have_is_refused(shared_server: Server) -> None:
    """Pulsar's client test ``test_listener_name_client``: without advertised listeners, a
    client naming one is refused; the C++ core fails at once on Pulsar's error message."""
    client = pulsar.Client(shared_server.pulsar_url, listener_name="test", logger=QUIET)
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(f"persistent://{fresh()}")
    finally:
        client.close()
    # On the wire: ServiceNotReady with Pulsar's words, and nothing created.
    topic = f"persistent://{fresh()}"
    with raw(shared_server) as s:
        connect(s)
        lookup = command(
            pb.BaseCommand.LOOKUP, topic=topic, request_id=1, advertised_listener_name="internal"
        )
        s.sendall(encode(lookup))
        answer = read_frame(s).lookupTopicResponse
    assert answer.response == pb.CommandLookupTopicResponse.Failed
    assert answer.error == pb.ServiceNotReady
    assert answer.message.startswith("the broker do not have internal listener")
    listed = httpx.get(f"{shared_server.url}/admin/v2/persistent/public/default").json()
    assert topic not in listed


def test_advertised_listeners(server_factory: type[Server], tmp_path: Path) -> None:
    """``internal`` (the first: what a client naming none is answered) points at a port where
    nothing listens; ``external`` at the service. Only a client naming ``external`` gets there."""
    server = server_factory(tmp_path / "data")
    server.extra_env["COMPACTOR_ADVERTISED_LISTENERS"] = (
        f"internal:pulsar://127.0.0.1:{free_port()},external:pulsar://localhost:{server.broker_port}"
    )
    server.start()
    external = f"pulsar://localhost:{server.broker_port}"
    topic = fresh()

    client = pulsar.Client(server.pulsar_url, listener_name="external", logger=QUIET)
    try:
        _produce_and_consume(client, f"persistent://{topic}", n=3)
    finally:
        client.close()

    # Over HTTP, by the query parameter or Pulsar's header; the internal listener by default.
    look = f"{server.url}/lookup/v2/topic/persistent/{topic}"
    for r in (
        httpx.get(look, params={"listenerName": "external"}),
        httpx.get(look, headers={"X-Pulsar-ListenerName": "external"}),
    ):
        assert r.status_code == 200, r.text
        assert (r.json()["brokerUrl"], r.json()["httpUrl"]) == (external, server.url)
    internal = httpx.get(look).json()["brokerUrl"]
    assert internal.startswith("pulsar://127.0.0.1:") and internal != server.pulsar_url
    r = httpx.get(look, params={"listenerName": "test"})
    assert r.status_code == 404
    assert (
        r.json()["reason"]
        == "the broker do not have test listener (advertised listeners: internal, external)"
    )

    # A client naming none is sent to the internal listener, where nothing answers.
    unnamed = pulsar.Client(server.pulsar_url, logger=QUIET, operation_timeout_seconds=3)
    try:
        with pytest.raises(pulsar.PulsarException):
            unnamed.create_producer(f"persistent://{topic}")
    finally:
        unnamed.close()
    # One naming a listener the service does not have is refused.
    unknown = pulsar.Client(server.pulsar_url, listener_name="test", logger=QUIET)
    try:
        with pytest.raises(pulsar.PulsarException):
            unknown.create_producer(f"persistent://{topic}")
    finally:
        unknown.close()
