"""The REST catalog at ``/iceberg``, read by the engines themselves: pyiceberg
(``load_catalog(type="rest")``) and DuckDB (its iceberg extension, ``ATTACH ... TYPE iceberg``),
against a real server with security on.

The tables here are made as a table's commit makes them (files under the storage root's
``tables/{tenant}/{namespace}/{name}``, a ``TopicTable`` row naming the current metadata file),
with pyiceberg's own writer, so that what is checked is the catalog: names, the metadata as
stored, the bucket's FileIO properties, time travel through it, and who may see and load what.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import ForbiddenError, NoSuchTableError, UnauthorizedError

from service.table_catalog import file_io_properties
from tests.conftest import SUPERUSER, SecureServer
from tests.e2e.iceberg_tables import MORE, ROWS, make_table
from tests.iceberg_readers import duckdb_connection

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
    assert body["config"] == file_io_properties(stored)


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
