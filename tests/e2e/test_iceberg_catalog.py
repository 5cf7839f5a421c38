"""The REST catalog at ``/iceberg``, read by the engines themselves: pyiceberg
(``load_catalog(type="rest")``) and DuckDB (its iceberg extension, ``ATTACH ... TYPE iceberg``),
against a real server with security on.

The tables here are made as a table's commit makes them (files under the storage root's
``tables/{tenant}/{namespace}/{name}``, a ``TopicTable`` row naming the current metadata file),
with pyiceberg's own writer, so that what is checked is the catalog: names, the metadata as
stored, the bucket's FileIO properties, time travel through it, and who may see and load what.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pulsar
import pyarrow as pa
import pytest
from pulsar.schema import Integer, JsonSchema, Record, String
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import ForbiddenError, NoSuchTableError, UnauthorizedError

from service.table_catalog import file_io_properties
from tests.conftest import SUPERUSER, SecureServer
from tests.e2e.iceberg_tables import MORE, ROWS, make_table
from tests.iceberg_readers import duckdb_connection
from tests.server import engine_keys

pytestmark = pytest.mark.e2e

CONSUMER, PRODUCER, NOBODY = "ice-consumer", "ice-producer", "ice-nobody"


@dataclass(frozen=True)
class World:
    """A tenant of the secure server with one table (``orders``, two snapshots) and a topic
    without one (``plain``); CONSUMER may consume ``orders``, PRODUCER produce in the namespace."""

    server: SecureServer
    tenant: str
    namespace: str
    first_snapshot: int
    last_snapshot: int

    @property
    def uri(self) -> str:
        return f"{self.server.url}/iceberg"

    def get(self, path: str, role: str | None = SUPERUSER, **params: str) -> httpx.Response:
        headers = self.server.headers(role) if role else {}
        return httpx.get(f"{self.uri}{path}", headers=headers, params=params)


@pytest.fixture(scope="module")
def world(secure_server: SecureServer) -> Iterator[World]:
    tenant, namespace = f"ice{uuid.uuid4().hex[:6]}", "ns"
    with httpx.Client(base_url=secure_server.url, headers=secure_server.headers(SUPERUSER)) as http:
        assert http.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": []}).status_code == 204
        assert http.put(f"/admin/v2/namespaces/{tenant}/{namespace}").status_code == 204
        for topic in ("orders", "plain"):
            assert http.put(f"/admin/v2/persistent/{tenant}/{namespace}/{topic}").status_code == 204
        grant = f"/admin/v2/persistent/{tenant}/{namespace}/orders/permissions/{CONSUMER}"
        assert http.post(grant, json=["consume"]).status_code == 204
        grant = f"/admin/v2/namespaces/{tenant}/{namespace}/permissions/{PRODUCER}"
        assert http.post(grant, json=["produce"]).status_code == 204
    first, last = make_table(secure_server.server, tenant, namespace, "orders")
    yield World(secure_server, tenant, namespace, first, last)


def _rows(table: pa.Table) -> list[tuple[object, ...]]:
    return sorted(tuple(r.values()) for r in table.select(["entry_id", "key", "value"]).to_pylist())


EXPECTED = _rows(pa.concat_tables([ROWS, MORE]))


# ------------------------------------------------------------------ the engines


def test_pyiceberg_reads_the_table_and_its_previous_snapshot(world: World) -> None:
    catalog = load_catalog("svc", type="rest", uri=world.uri, token=world.server.token(CONSUMER))
    assert (world.tenant,) in catalog.list_namespaces()
    assert catalog.list_namespaces(world.tenant) == [(world.tenant, world.namespace)]
    # The consumer sees the table it may consume from, and nothing else of the namespace.
    assert catalog.list_tables(f"{world.tenant}.{world.namespace}") == [
        (world.tenant, world.namespace, "orders")
    ]
    table = catalog.load_table(f"{world.tenant}.{world.namespace}.orders")
    assert _rows(table.scan().to_arrow()) == EXPECTED
    assert _rows(table.scan(snapshot_id=world.first_snapshot).to_arrow()) == _rows(ROWS)
    assert catalog.table_exists(f"{world.tenant}.{world.namespace}.orders")


def test_duckdb_reads_the_table_through_the_catalog(world: World) -> None:
    con = duckdb_connection()
    token = world.server.token(CONSUMER)
    con.execute(f"ATTACH '' AS svc (TYPE iceberg, ENDPOINT '{world.uri}', TOKEN '{token}')")
    table = f'svc."{world.tenant}.{world.namespace}".orders'
    rows = con.execute(f"SELECT entry_id, key, value FROM {table} ORDER BY entry_id").fetchall()
    assert rows == EXPECTED
    then = con.execute(f"SELECT count(*) FROM {table} AT (VERSION => {world.first_snapshot})").fetchone()
    assert then == (len(ROWS),)


def test_duckdb_with_a_bad_token_cannot_attach(world: World) -> None:
    con = duckdb_connection()
    with pytest.raises(Exception, match="401|[Uu]nauthori"):
        con.execute(f"ATTACH '' AS svc (TYPE iceberg, ENDPOINT '{world.uri}', TOKEN 'not-a-token')")


# ------------------------------------------------------------------ who may see and load what


def test_a_role_without_consume_cannot_load_the_table(world: World) -> None:
    for role in (PRODUCER, NOBODY):
        catalog = load_catalog("svc", type="rest", uri=world.uri, token=world.server.token(role))
        with pytest.raises(ForbiddenError):
            catalog.load_table(f"{world.tenant}.{world.namespace}.orders")
        # ... nor learn that it exists: no table is listed, nor its namespace.
        assert (world.tenant,) not in catalog.list_namespaces()
    r = world.get(f"/v1/namespaces/{world.tenant}%1F{world.namespace}/tables/orders", role=PRODUCER)
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["type"] == "ForbiddenException" and error["code"] == 403
    assert f"role '{PRODUCER}' is not authorized to consume from" in error["message"]


def test_without_a_token_every_route_is_401(world: World) -> None:
    with pytest.raises(UnauthorizedError):
        load_catalog("svc", type="rest", uri=world.uri)
    for path in (
        "/v1/config",
        "/v1/namespaces",
        f"/v1/namespaces/{world.tenant}%1F{world.namespace}/tables/orders",
    ):
        r = world.get(path, role=None)
        assert r.status_code == 401, path
        assert r.json()["error"]["type"] == "NotAuthorizedException"
        assert r.headers["www-authenticate"].startswith("Bearer")


# ------------------------------------------------------------------ the protocol's shapes


def test_load_table_answers_the_metadata_file_as_stored(world: World) -> None:
    r = world.get(f"/v1/namespaces/{world.tenant}%1F{world.namespace}/tables/orders", snapshots="all")
    assert r.status_code == 200, r.text
    body = r.json()
    location = body["metadata-location"]
    stored = world.server.server.ledger_root().storage
    key = location.removeprefix(f"{stored.root}/").removeprefix(f"s3://{stored.root}/")
    assert body["metadata"] == __import__("json").loads(stored.read(key))
    assert body["metadata"]["current-snapshot-id"] == world.last_snapshot
    # The bucket's endpoint and keys when the tables are in one; nothing for a local disk.
    assert body["config"] == file_io_properties(stored, engine_keys())
    if not stored.local:  # the same for each directory a table's files are in
        prefixes = [c["prefix"] for c in body["storage-credentials"]]
        assert prefixes == [f"s3://{stored.root}/ledgers/", f"s3://{stored.root}/tables/"]
        assert all(c["config"] == body["config"] for c in body["storage-credentials"])
    else:
        assert "storage-credentials" not in body


def test_namespaces_tables_and_paging(world: World) -> None:
    ns = f"{world.tenant}%1F{world.namespace}"
    config = world.get("/v1/config", warehouse="anything").json()
    assert "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}" in config["endpoints"]
    assert config["overrides"] == {}
    assert world.get("/v1/namespaces", parent=world.tenant, pageToken="").json() == {
        "namespaces": [[world.tenant, world.namespace]]
    }
    assert world.get(f"/v1/namespaces/{ns}").json() == {
        "namespace": [world.tenant, world.namespace],
        "properties": {},
    }
    assert (
        httpx.head(f"{world.uri}/v1/namespaces/{ns}", headers=world.server.headers(SUPERUSER)).status_code
        == 204
    )
    # A tenant is a namespace with no tables of its own (DuckDB lists it).
    assert world.get(f"/v1/namespaces/{world.tenant}/tables").json()["identifiers"] == []
    first = world.get("/v1/namespaces", pageSize="1").json()
    assert len(first["namespaces"]) == 1
    if "next-page-token" in first:
        rest = world.get("/v1/namespaces", pageSize="1000", pageToken=first["next-page-token"]).json()
        assert first["namespaces"][0] not in rest["namespaces"]


@pytest.mark.parametrize(
    ("path", "status", "kind"),
    [
        ("/v1/namespaces/nosuch%1Fns", 404, "NoSuchNamespaceException"),
        ("/v1/namespaces/nosuch%1Fns/tables", 404, "NoSuchNamespaceException"),
        ("/v1/namespaces/{ns}/tables/plain", 404, "NoSuchTableException"),
        # Spark asks for a metadata table as a table of a namespace named after the table.
        ("/v1/namespaces/{ns}%1Forders/tables/snapshots", 404, "NoSuchTableException"),
        ("/v1/namespaces/{ns}/tables/no%20such%21", 404, "NoSuchTableException"),
        ("/v1/namespaces?pageToken=nope", 400, "BadRequestException"),
        ("/v1/namespaces/{ns}/tables/orders?snapshots=some", 400, "BadRequestException"),
        ("/v1/namespaces/{ns}/views", 404, None),
    ],
)
def test_bad_requests_get_icebergs_errors(world: World, path: str, status: int, kind: str | None) -> None:
    url = world.uri + path.format(ns=f"{world.tenant}%1F{world.namespace}")
    r = httpx.get(url, headers=world.server.headers(SUPERUSER))
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and error["message"]
    if kind is not None:
        assert error["type"] == kind


def test_pyiceberg_names_a_missing_table(world: World) -> None:
    catalog = load_catalog("svc", type="rest", uri=world.uri, token=world.server.token(SUPERUSER))
    with pytest.raises(NoSuchTableError):
        catalog.load_table(f"{world.tenant}.{world.namespace}.plain")
    assert not catalog.table_exists(f"{world.tenant}.{world.namespace}.plain")


# ------------------------------------------------------------------ tables of real rounds


def _view(server: SecureServer, topic: str) -> list[tuple[object, ...]]:
    """The readCompacted view as the official client reads it: (ledger, entry, batch index,
    key, value) per message, batch members with their batch's entry and their index."""
    client = pulsar.Client(
        server.server.pulsar_url, authentication=pulsar.AuthenticationToken(server.token(SUPERUSER))
    )
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        rows = []
        while reader.has_message_available():
            m = reader.read_next(timeout_millis=10_000)
            mid = m.message_id()
            key = m.partition_key() or None  # the client gives "" for a keyless message
            rows.append((mid.ledger_id(), mid.entry_id(), mid.batch_index(), key, m.data()))
        return sorted(rows, key=lambda r: (r[0], r[1], r[2]))
    finally:
        client.close()


def _table_rows(table: pa.Table) -> list[tuple[object, ...]]:
    """A table's rows as :func:`_view` gives messages: a batch member's ``entry_id`` in a part
    file is its batch's entry plus its index (``ledger.schema``), the client's id is the batch's."""
    out = []
    for r in table.select(["ledger_id", "entry_id", "batch_index", "key", "value"]).to_pylist():
        index = r["batch_index"]
        entry = r["entry_id"] - index if index is not None and index >= 0 else r["entry_id"]
        out.append((r["ledger_id"], entry, -1 if index is None else index, r["key"], r["value"]))
    return sorted(out, key=lambda r: (r[0], r[1], r[2]))


def _produce(
    server: SecureServer, topic: str, messages: list[tuple[str | None, bytes]], *, batched: bool
) -> None:
    client = pulsar.Client(
        server.server.pulsar_url, authentication=pulsar.AuthenticationToken(server.token(SUPERUSER))
    )
    try:
        producer = client.create_producer(
            topic, batching_enabled=batched, batching_max_messages=100, batching_max_publish_delay_ms=50
        )
        for key, value in messages:
            if key is None:
                producer.send_async(value, None)
            else:
                producer.send_async(value, None, partition_key=key)
        producer.flush()
        producer.close()
    finally:
        client.close()


def _compact(server: SecureServer, path: str) -> None:
    headers = server.headers(SUPERUSER)
    assert (
        httpx.put(f"{server.url}/admin/v2/persistent/{path}/compaction", headers=headers).status_code == 204
    )
    deadline = time.monotonic() + 240
    while (
        status := httpx.get(f"{server.url}/admin/v2/persistent/{path}/compaction", headers=headers).json()
    )["status"] == "RUNNING":
        assert time.monotonic() < deadline, status
        time.sleep(0.3)
    assert status["status"] == "SUCCESS", status
    assert status["table"]["lagRounds"] == 0, status


def test_a_topics_rounds_read_through_the_catalog_equal_its_compacted_views(
    secure_server: SecureServer,
) -> None:
    """Keys, updates, tombstones, keyless messages and a batch; two rounds (full, then a delta
    with deletes): each engine's current snapshot is the readCompacted view, the previous
    snapshot the previous round's, and a role without consume cannot load the table."""
    s = secure_server
    tenant = f"rounds{uuid.uuid4().hex[:6]}"
    path = f"{tenant}/ns/orders"
    topic = f"persistent://{path}"
    with httpx.Client(base_url=s.url, headers=s.headers(SUPERUSER)) as http:
        assert http.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": []}).status_code == 204
        assert http.put(f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
        policy = {"table": True, "retainNullKey": True}
        assert http.post(f"/admin/v2/namespaces/{tenant}/ns/compactionPolicy", json=policy).status_code in (
            200,
            204,
        )
        assert http.put(f"/admin/v2/persistent/{path}").status_code == 204
        grant = f"/admin/v2/persistent/{path}/permissions/{CONSUMER}"
        assert http.post(grant, json=["consume"]).status_code == 204

    _produce(
        s,
        topic,
        [("a", b"a1"), ("b", b"b1"), ("c", b"c1"), (None, b"keyless-1"), ("a", b"a2")],
        batched=False,
    )
    _produce(s, topic, [(f"k{i}", b"batch-%d" % i) for i in range(5)], batched=True)
    _compact(s, path)
    first_view = _view(s, topic)
    assert any(r[2] >= 0 for r in first_view)  # batch members, each with its index
    _produce(
        s, topic, [("b", b""), ("k1", b""), ("c", b"c2"), ("d", b"d1"), (None, b"keyless-2")], batched=False
    )
    _produce(s, topic, [("k2", b"batch-again"), ("e", b"e1")], batched=True)
    _compact(s, path)
    view = _view(s, topic)
    assert {r[3] for r in view} >= {"a", "c", "d", "e", "k2", None} and not {"b", "k1"} & {r[3] for r in view}

    catalog = load_catalog("svc", type="rest", uri=f"{s.url}/iceberg", token=s.token(CONSUMER))
    table = catalog.load_table(f"{tenant}.ns.orders")
    assert _table_rows(table.scan().to_arrow()) == view
    snapshots = [e.snapshot_id for e in table.history()]
    previous = snapshots[-2]
    assert _table_rows(table.scan(snapshot_id=previous).to_arrow()) == first_view

    con = duckdb_connection()
    con.execute(f"ATTACH '' AS svc (TYPE iceberg, ENDPOINT '{s.url}/iceberg', TOKEN '{s.token(CONSUMER)}')")
    name = f'svc."{tenant}.ns".orders'
    assert _table_rows(con.execute(f"SELECT * FROM {name}").to_arrow_table()) == view
    assert (
        _table_rows(con.execute(f"SELECT * FROM {name} AT (VERSION => {previous})").to_arrow_table())
        == first_view
    )

    stranger = load_catalog("svc", type="rest", uri=f"{s.url}/iceberg", token=s.token(NOBODY))
    with pytest.raises(ForbiddenError):
        stranger.load_table(f"{tenant}.ns.orders")


def test_a_partitioned_topic_is_one_table_partitioned_by_partition(secure_server: SecureServer) -> None:
    """Each partition's round commits into the partitioned topic's one table: its rows are the
    partitions' readCompacted views, each with its partition's index."""
    s = secure_server
    tenant = f"parts{uuid.uuid4().hex[:6]}"
    path = f"{tenant}/ns/prices"
    with httpx.Client(base_url=s.url, headers=s.headers(SUPERUSER)) as http:
        assert http.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": []}).status_code == 204
        assert http.put(f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
        assert http.post(
            f"/admin/v2/namespaces/{tenant}/ns/compactionPolicy", json={"table": True}
        ).status_code in (
            200,
            204,
        )
        assert http.put(f"/admin/v2/persistent/{path}/partitions", json=2).status_code == 204
    _produce(
        s, f"persistent://{path}", [(f"k{i}", b"v%d" % i) for i in range(20)] + [("k3", b"")], batched=False
    )
    _compact(s, path)
    views = {p: _view(s, f"persistent://{path}-partition-{p}") for p in (0, 1)}
    assert views[0] and views[1]  # keys of both partitions

    catalog = load_catalog("svc", type="rest", uri=f"{s.url}/iceberg", token=s.token(SUPERUSER))
    assert catalog.list_tables(f"{tenant}.ns") == [(tenant, "ns", "prices")]
    table = catalog.load_table(f"{tenant}.ns.prices")
    for p, view in views.items():
        rows = table.scan(row_filter=f"partition = {p}").to_arrow()
        assert _table_rows(rows) == view


class Account(Record):
    owner = String()
    balance = Integer()


def test_a_json_schema_topics_fields_are_columns_through_the_catalog(secure_server: SecureServer) -> None:
    """A topic with a JSON schema: its value's fields are columns an engine selects and filters
    on, as the latest value of each key has them."""
    s = secure_server
    tenant = f"typed{uuid.uuid4().hex[:6]}"
    path = f"{tenant}/ns/accounts"
    with httpx.Client(base_url=s.url, headers=s.headers(SUPERUSER)) as http:
        assert http.put(f"/admin/v2/tenants/{tenant}", json={"adminRoles": []}).status_code == 204
        assert http.put(f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
        policy = f"/admin/v2/namespaces/{tenant}/ns/compactionPolicy"
        assert http.post(policy, json={"table": True}).status_code in (200, 204)
    client = pulsar.Client(s.server.pulsar_url, authentication=pulsar.AuthenticationToken(s.token(SUPERUSER)))
    try:
        producer = client.create_producer(f"persistent://{path}", schema=JsonSchema(Account))
        for key, owner, balance in (("x", "ann", 1), ("y", "bob", 2), ("x", "ann", 5)):
            producer.send(Account(owner=owner, balance=balance), partition_key=key)
        producer.close()
    finally:
        client.close()
    _compact(s, path)

    catalog = load_catalog("svc", type="rest", uri=f"{s.url}/iceberg", token=s.token(SUPERUSER))
    table = catalog.load_table(f"{tenant}.ns.accounts")
    rows = table.scan(selected_fields=("key", "owner", "balance")).to_arrow().to_pylist()
    assert sorted(rows, key=lambda r: r["key"]) == [
        {"key": "x", "owner": "ann", "balance": 5},
        {"key": "y", "owner": "bob", "balance": 2},
    ]
    con = duckdb_connection()
    con.execute(f"ATTACH '' AS svc (TYPE iceberg, ENDPOINT '{s.url}/iceberg', TOKEN '{s.token(SUPERUSER)}')")
    assert con.execute(f'SELECT owner FROM svc."{tenant}.ns".accounts WHERE balance > 3').fetchall() == [
        ("ann",)
    ]
