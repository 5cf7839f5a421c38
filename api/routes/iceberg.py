"""Iceberg's REST catalog protocol, read side, at ``/iceberg``: an engine's catalog URI is
``http://host:port/iceberg`` (pyiceberg's ``uri``, DuckDB's ``ENDPOINT``, Spark's
``spark.sql.catalog.X.uri``). The tables are the compacted topics that publish one
(``service.table_catalog``); namespaces are ``[tenant, namespace]``, ``%1F``-joined in paths.

Security is the service's: the bearer token an engine sends (``token``), a role sees only the
tables it may consume from, and loading a table needs ``consume`` on its topic, as a
readCompacted consumer does. See docs/tables.md.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from api.auth import require
from api.iceberg_schemas import (
    CatalogConfigOut,
    IcebergErrorOut,
    LoadTableOut,
    NamespaceOut,
    NamespacesOut,
    TableIdentifierOut,
    TablesOut,
)
from service.authorization import Authorizer, Rule
from service.errors import InvalidInput, NoSuchNamespace, NoSuchTable
from service.table_catalog import (
    LoadedTable,
    Namespace,
    TableCatalog,
    Visible,
    everything,
    parse_namespace,
    topic_of,
)

router = APIRouter(prefix="/iceberg/v1", tags=["iceberg"])


async def get_catalog(request: Request) -> TableCatalog:
    return request.app.state.table_catalog  # type: ignore[no-any-return]


async def visible(request: Request) -> Visible:
    """What the request's role may see: the tables it may consume from."""
    authorizer: Authorizer | None = request.app.state.authorizer
    role = getattr(request.state, "role", None)
    if authorizer is None or role is None:
        return everything
    return lambda topic: authorizer.may(role=role, rule=Rule.CONSUME, topic=topic)


def _table_resource(request: Request) -> tuple[str | None, str | None, str | None] | None:
    """The topic a table's path names (its ``consume`` permission loads it); None for a path
    that names no topic's table (the route answers NoSuchTable)."""
    params = request.path_params
    topic = topic_of(parse_namespace(params.get("namespace", "")), params.get("table", ""))
    return None if topic is None else (topic.tenant, topic.namespace, topic.topic)


CatalogDep = Annotated[TableCatalog, Depends(get_catalog)]
VisibleDep = Annotated[Visible, Depends(visible)]
CanSee = Depends(require(Rule.AUTHENTICATED))
CanLoad = Depends(require(Rule.CONSUME, _table_resource))

# Every error of the catalog is Iceberg's ErrorModel (api.errors); its statuses, as the
# protocol documents them.
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": IcebergErrorOut, "description": "A malformed query (BadRequestException)"},
    401: {"model": IcebergErrorOut, "description": "No token or a bad one (NotAuthorizedException)"},
    403: {"model": IcebergErrorOut, "description": "No consume permission (ForbiddenException)"},
}
_NO_NAMESPACE: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    404: {"model": IcebergErrorOut, "description": "No such namespace (NoSuchNamespaceException)"},
}
_NO_TABLE: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    404: {"model": IcebergErrorOut, "description": "No such table (NoSuchTableException)"},
}
_HEAD_OK: dict[int | str, dict[str, Any]] = {204: {"description": "It exists"}}

PageToken = Annotated[str | None, Query(alias="pageToken", max_length=20)]
PageSize = Annotated[int | None, Query(alias="pageSize", ge=1, le=100_000)]


@router.get("/config", response_model=CatalogConfigOut, dependencies=[CanSee], responses=_ERRORS)
async def catalog_config(warehouse: str | None = None) -> CatalogConfigOut:
    """The catalog's configuration: no prefix, no overrides; the routes it serves. ``warehouse``
    is accepted and means nothing here (one catalog per service)."""
    return CatalogConfigOut()


@router.get(
    "/namespaces",
    response_model=NamespacesOut,
    response_model_exclude_none=True,
    dependencies=[CanSee],
    responses=_NO_NAMESPACE,
)
def list_namespaces(
    catalog: CatalogDep,
    shown: VisibleDep,
    parent: str | None = None,
    page_token: PageToken = None,
    page_size: PageSize = None,
) -> NamespacesOut:
    """The tenants, or with ``parent`` (a tenant) its namespaces, that hold a table the role
    may see."""
    found = catalog.namespaces(parse_namespace(parent or ""), shown)
    page, token = _page(found, page_token, page_size)
    return NamespacesOut(namespaces=[list(n) for n in page], next_page_token=token)


@router.get(
    "/namespaces/{namespace}", response_model=NamespaceOut, dependencies=[CanSee], responses=_NO_NAMESPACE
)
def load_namespace(namespace: str, catalog: CatalogDep, shown: VisibleDep) -> NamespaceOut:
    """A namespace (``tenant`` or ``tenant%1Fnamespace``) that holds a table the role may see."""
    parts = _existing(namespace, catalog, shown)
    return NamespaceOut(namespace=list(parts))


@router.head(
    "/namespaces/{namespace}",
    status_code=204,
    dependencies=[CanSee],
    responses={**_HEAD_OK, **_NO_NAMESPACE},
)
def namespace_exists(namespace: str, catalog: CatalogDep, shown: VisibleDep) -> Response:
    """204 if the namespace exists (for the role), 404 if not."""
    _existing(namespace, catalog, shown)
    return Response(status_code=204)


@router.get(
    "/namespaces/{namespace}/tables",
    response_model=TablesOut,
    response_model_exclude_none=True,
    dependencies=[CanSee],
    responses=_NO_NAMESPACE,
)
def list_tables(
    namespace: str,
    catalog: CatalogDep,
    shown: VisibleDep,
    page_token: PageToken = None,
    page_size: PageSize = None,
) -> TablesOut:
    """The tables of a namespace the role may see (none directly in a tenant)."""
    parts = parse_namespace(namespace)
    names = catalog.tables(parts, shown)
    page, token = _page(names, page_token, page_size)
    ids = [TableIdentifierOut(namespace=list(parts), name=n) for n in page]
    return TablesOut(identifiers=ids, next_page_token=token)


@router.get(
    "/namespaces/{namespace}/tables/{table}",
    response_model=LoadTableOut,
    dependencies=[CanLoad],
    responses=_NO_TABLE,
)
def load_table(
    namespace: str, table: str, catalog: CatalogDep, snapshots: Literal["all", "refs"] | None = None
) -> Response:
    """The table's current metadata (Iceberg's LoadTableResult), with its metadata file as
    stored. ``snapshots=refs`` is answered as ``all`` (the protocol allows it)."""
    loaded = catalog.load(parse_namespace(namespace), table)
    # The metadata file goes out as its bytes: parsing and re-encoding it would only cost.
    body = b"".join(
        (
            b'{"metadata-location":',
            _json(loaded.metadata_location),
            b',"metadata":',
            loaded.metadata,
            b',"config":',
            _json(loaded.config),
            _credentials(loaded),
            b"}",
        )
    )
    return Response(body, media_type="application/json")


@router.head(
    "/namespaces/{namespace}/tables/{table}",
    status_code=204,
    dependencies=[CanLoad],
    responses={**_HEAD_OK, **_NO_TABLE},
)
def table_exists(namespace: str, table: str, catalog: CatalogDep) -> Response:
    """204 if the table exists, 404 if not (``consume`` on its topic needed, as to load it)."""
    if not catalog.table_exists(parse_namespace(namespace), table):
        raise NoSuchTable(f"table {namespace.replace(chr(31), '.')}.{table} does not exist")
    return Response(status_code=204)


def _existing(namespace: str, catalog: TableCatalog, shown: Visible) -> Namespace:
    parts = parse_namespace(namespace)
    if not catalog.namespace_exists(parts, shown):
        raise NoSuchNamespace(f"namespace {'.'.join(parts)} does not exist")
    return parts


def _page(items: list[Any], token: str | None, size: int | None) -> tuple[list[Any], str | None]:
    """One page of ``items`` from ``token`` (the offset a previous page gave; empty or absent:
    the first page), and the next page's token if there is more."""
    if not token:
        start = 0
    elif token.isdigit():
        start = int(token)
    else:
        raise InvalidInput(f"invalid pageToken {token!r}: use the next-page-token of a previous page")
    if size is None:
        return items[start:], None
    end = start + size
    return items[start:end], (str(end) if end < len(items) else None)


def _credentials(loaded: LoadedTable) -> bytes:
    """``config`` again as ``storage-credentials``, one per directory of the bucket a table's
    files are in (see ``LoadedTable.storage_prefixes``); nothing for a local disk."""
    if not loaded.storage_prefixes or not loaded.config:
        return b""
    found = [{"prefix": prefix, "config": loaded.config} for prefix in loaded.storage_prefixes]
    return b',"storage-credentials":' + _json(found)


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
