"""The read side of the tables' catalog: what ``/iceberg`` (Iceberg's REST catalog protocol,
``api.routes.iceberg``) serves, from the ``TopicTable`` rows and the metadata files they name.

Namespaces have two levels, ``(tenant, namespace)``; a table is named as its topic's local
name (a partitioned topic's, for its one table). A namespace exists while it holds a table the
caller may see: the catalog shows nothing else of the service (an empty namespace of the admin
API is not a namespace of the catalog). ``visible`` is how a caller says what a role may see;
every verb takes it, so that a role that may not see a table cannot learn that it exists.

The metadata file is served as stored: the service writes it (``ledger.iceberg_table``), an
engine reads it, and nothing here parses more of it than JSON needs to be valid.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select

from ledger.iceberg_io import path_at
from ledger.storage import Storage
from service.db import Database
from service.errors import InvalidInput, NoSuchNamespace, NoSuchTable
from service.models import TopicTable
from service.names import TopicName, check_part

#: The top directories of the ledger storage a table's files are in (``ledger.paths``): its
#: data files are compacted ledgers' parts, its metadata and delete files the table's own.
LEDGERS, TABLES = "ledgers", "tables"
#: What a role may see: the catalog's callers pass the authorizer's answer for the role.
Visible = Callable[[TopicName], bool]
Namespace = tuple[str, ...]


def everything(_: TopicName) -> bool:
    """``visible`` when authorization is off: every table."""
    return True


@dataclass(frozen=True)
class LoadedTable:
    """A table as an engine loads it: where its current metadata file is, the file's bytes
    (JSON, as stored), and the FileIO properties an engine needs to read the files."""

    metadata_location: str
    metadata: bytes
    config: dict[str, str] = field(repr=False)
    # Where ``config`` holds, for engines that scope it (DuckDB scopes a table's ``config`` to
    # the table's location, where a compacted topic's data files are not: they are its compacted
    # ledgers' parts): the ledgers' and the tables' directories of the bucket; none on a disk.
    storage_prefixes: tuple[str, ...] = ()


class TableCatalog:
    """The tables of one service: read from the metadata database and the ledger storage."""

    def __init__(self, *, db: Database, storage: Storage, keys: tuple[str, str] | None = None) -> None:
        self.db = db
        self.storage = storage
        self.file_io = file_io_properties(storage, keys)
        root = f"s3://{storage.root}/" if storage.root else "s3://"
        self._prefixes = (f"{root}{LEDGERS}/", f"{root}{TABLES}/")

    # ------------------------------------------------------------------ namespaces

    def namespaces(self, parent: Namespace, visible: Visible) -> list[Namespace]:
        """The namespaces directly under ``parent`` (``()``: the tenants) that hold a table
        ``visible`` shows; ``NoSuchNamespace`` for a parent that holds none."""
        if parent and not self.namespace_exists(parent, visible):
            raise NoSuchNamespace(f"namespace {_dotted(parent)} does not exist")
        if len(parent) >= 2:
            return []  # tables live two levels down: nothing is deeper
        names = {t.namespace_of[: len(parent) + 1] for t in self._rows(visible, parent)}
        return sorted(names)

    def namespace_exists(self, namespace: Namespace, visible: Visible) -> bool:
        """Whether ``namespace`` (a tenant, or a tenant and namespace) holds a visible table."""
        if not namespace or len(namespace) > 2 or not _valid(namespace):
            return False
        return bool(self._rows(visible, namespace, limit=1))

    # ------------------------------------------------------------------ tables

    def tables(self, namespace: Namespace, visible: Visible) -> list[str]:
        """The names of the visible tables in ``namespace`` (none in a tenant: a table's
        namespace is a tenant and a namespace); ``NoSuchNamespace`` for one that holds none."""
        if not self.namespace_exists(namespace, visible):
            raise NoSuchNamespace(f"namespace {_dotted(namespace)} does not exist")
        if len(namespace) < 2:
            return []
        return sorted(t.name for t in self._rows(visible, namespace))

    def table_exists(self, namespace: Namespace, name: str) -> bool:
        """Whether ``namespace`` has a table ``name`` (the caller has checked the role may
        consume from it: see :func:`topic_of`)."""
        return self._row(namespace, name) is not None

    def load(self, namespace: Namespace, name: str) -> LoadedTable:
        """The table's current metadata; ``NoSuchTable`` if there is none of that name."""
        row = self._row(namespace, name)
        for _ in range(2):
            if row is None:
                raise NoSuchTable(f"table {_dotted((*namespace, name))} does not exist")
            try:
                data = path_at(self.storage, row.metadata_location).read_bytes()
            except FileNotFoundError:
                # A commit replaced the metadata (and its garbage collection removed the file
                # read here) between the row's read and the file's: read the new one.
                newer = self._row(namespace, name)
                if newer is not None and newer.metadata_location == row.metadata_location:
                    raise
                row = newer
                continue
            if data[:2] == b"\x1f\x8b":  # a gzip-compressed metadata file (.gz.metadata.json)
                data = gzip.decompress(data)
            return LoadedTable(
                metadata_location=row.metadata_location,
                metadata=data,
                config=self.file_io,
                storage_prefixes=() if self.storage.local else self._prefixes,
            )
        raise NoSuchTable(f"table {_dotted((*namespace, name))} is being replaced: try again")

    # ------------------------------------------------------------------ rows

    def _rows(self, visible: Visible, namespace: Namespace, limit: int | None = None) -> list[_Row]:
        query = select(TopicTable.tenant, TopicTable.namespace, TopicTable.name)
        if namespace:
            query = query.where(TopicTable.tenant == namespace[0])
        if len(namespace) > 1:
            query = query.where(TopicTable.namespace == namespace[1])
        with self.db.session() as s:
            rows = [_Row(*r) for r in s.execute(query.order_by(TopicTable.namespace, TopicTable.name))]
        shown = [r for r in rows if visible(TopicName(r.tenant, r.namespace, r.name))]
        return shown[:limit] if limit is not None else shown

    def _row(self, namespace: Namespace, name: str) -> TopicTable | None:
        if topic_of(namespace, name) is None:
            return None
        with self.db.session() as s:
            return s.get(TopicTable, (namespace[0], namespace[1], name))


@dataclass(frozen=True)
class _Row:
    tenant: str
    namespace: str
    name: str

    @property
    def namespace_of(self) -> Namespace:
        return (self.tenant, self.namespace)


def topic_of(namespace: Namespace, name: str) -> TopicName | None:
    """The topic whose table ``namespace`` and ``name`` would name; None where they could
    name none (a namespace of other than two levels, a part no topic name may have)."""
    if len(namespace) != 2 or not _valid((*namespace, name)):
        return None
    return TopicName(namespace[0], namespace[1], name)


def parse_namespace(text: str) -> Namespace:
    """A namespace as a path or a ``parent`` query names it: levels joined by the unit
    separator (``%1F`` in a URL, as Iceberg's REST protocol joins them)."""
    return tuple(text.split("\x1f")) if text else ()


def file_io_properties(storage: Storage, keys: tuple[str, str] | None = None) -> dict[str, str]:
    """Iceberg's FileIO properties (pyiceberg's and Java's ``s3.*``) for reading the ledger
    storage's bucket: its endpoint, region, and the keys given for engines
    (``COMPACTOR_TABLE_S3_ACCESS_KEY_ID``), never the service's own: those may write and delete
    every ledger, and a role that may consume a topic must not get them. None for a local disk:
    engines on the machine read the files by their paths."""
    if storage.local:
        return {}
    s3 = storage.s3
    props: dict[str, str] = {}
    if s3 is not None and s3.endpoint_url:
        props["s3.endpoint"] = s3.endpoint_url
        # An S3-compatible server (MinIO, Ceph) answers on its own host, not a bucket's subdomain.
        props["s3.path-style-access"] = "true"
    # The service's own chain where its settings leave a value out (AWS_REGION, AWS_ACCESS_KEY_ID
    # / AWS_SECRET_ACCESS_KEY): an engine outside it has no other way to the same bucket.
    region = (s3.region if s3 is not None else None) or os.environ.get("AWS_REGION") or "us-east-1"
    # Java's S3FileIO takes its region from client.region only; pyiceberg and DuckDB from s3.region.
    props["s3.region"] = props["client.region"] = region
    if keys is not None and all(keys):
        props["s3.access-key-id"], props["s3.secret-access-key"] = keys
    return props


def _valid(parts: tuple[str, ...]) -> bool:
    try:
        for part in parts:
            check_part("name", part)
    except InvalidInput:
        return False
    return True


def _dotted(parts: tuple[str, ...]) -> str:
    return ".".join(parts)
