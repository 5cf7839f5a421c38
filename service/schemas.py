"""Pulsar's schema registry: the schemas that producers and consumers declare, kept per topic
with versions.

A topic's versions are 0, 1, 2, ... in the order they were first declared, and a version never
changes once written. Declaring a schema the topic already has (same type, definition and
properties) gives that version back, as Pulsar does, so producers that restart do not add
versions. Compatibility between versions is not checked (Pulsar's ``ALWAYS_COMPATIBLE``): any
schema is accepted as the next version. Clients carry a version as 8 big-endian bytes
(:func:`version_bytes`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from service import models
from service.clock import now_ms
from service.db import Database
from service.errors import InvalidInput, NotFound
from service.names import TopicName, partition_of

# Pulsar's schema types by their admin names; the protocol numbers them in this order
# (``Schema.Type`` in Pulsar's protocol).
SCHEMA_TYPES = (
    "NONE",
    "STRING",
    "JSON",
    "PROTOBUF",
    "AVRO",
    "BOOLEAN",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FLOAT",
    "DOUBLE",
    "DATE",
    "TIME",
    "TIMESTAMP",
    "KEY_VALUE",
    "INSTANT",
    "LOCAL_DATE",
    "LOCAL_TIME",
    "LOCAL_DATE_TIME",
    "PROTOBUF_NATIVE",
)
# A schema definition above this is refused (Pulsar keeps schemas in its metadata store too).
MAX_SCHEMA_BYTES = 1 << 20


@dataclass(frozen=True)
class SchemaInfo:
    """A schema as a client declares it: its type, its definition and its properties."""

    type: str
    data: bytes
    properties: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.type not in SCHEMA_TYPES:
            raise InvalidInput(f"unknown schema type {self.type!r}; one of {', '.join(SCHEMA_TYPES)}")
        if len(self.data) > MAX_SCHEMA_BYTES:
            raise InvalidInput(f"a schema of {len(self.data)} bytes; the limit is {MAX_SCHEMA_BYTES}")
        for k, v in self.properties.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidInput("schema properties are strings")


@dataclass(frozen=True)
class StoredSchema:
    """One version of a topic's schema."""

    version: int
    info: SchemaInfo
    created_at: int  # ms since the epoch


def version_bytes(version: int) -> bytes:
    """A version as Pulsar's clients carry it (in PRODUCER_SUCCESS and each message)."""
    return version.to_bytes(8, "big", signed=True)


def parse_version(data: bytes) -> int:
    """The version that ``data`` (8 big-endian bytes) names; ``InvalidInput`` for anything else."""
    if len(data) != 8:
        raise InvalidInput(f"a schema version is 8 bytes, not {len(data)}")
    return int.from_bytes(data, "big", signed=True)


class SchemaRegistry:
    """The schema versions of every topic, in the metadata database (so every instance sees
    them). Keyed by topic name, not topic row: a schema may be uploaded before its topic
    exists, as with Pulsar's admin, and goes with the topic when the topic is deleted."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def latest(self, name: TopicName) -> StoredSchema | None:
        with self.db.session() as s:
            row = s.scalars(
                select(models.Schema).where(*_match(name)).order_by(models.Schema.version.desc()).limit(1)
            ).first()
            return _stored(row) if row is not None else None

    def get(self, name: TopicName, version: int | None = None) -> StoredSchema:
        """Version ``version`` of the topic's schema (the latest if None); ``NotFound``."""
        if version is None:
            found = self.latest(name)
            if found is None:
                raise NotFound(f"topic {name} has no schema")
            return found
        with self.db.session() as s:
            row = s.scalars(
                select(models.Schema).where(*_match(name), models.Schema.version == version)
            ).first()
            if row is None:
                raise NotFound(f"topic {name} has no schema version {version}")
            return _stored(row)

    def versions(self, name: TopicName) -> list[StoredSchema]:
        with self.db.session() as s:
            rows = s.scalars(select(models.Schema).where(*_match(name)).order_by(models.Schema.version)).all()
            return [_stored(r) for r in rows]

    def put(self, name: TopicName, info: SchemaInfo) -> int:
        """The version of ``info`` in the topic's history, added as the next version if it is
        new."""
        return self._put(name, info, only_if_none=False)  # type: ignore[return-value]

    def put_if_none(self, name: TopicName, info: SchemaInfo) -> int | None:
        """What a consumer's schema does: it becomes version 0 of a topic without a schema, and
        names its version when the topic has it; else None (nothing changes)."""
        return self._put(name, info, only_if_none=True)

    def _put(self, name: TopicName, info: SchemaInfo, *, only_if_none: bool) -> int | None:
        props = json.dumps(info.properties, sort_keys=True)
        for _ in range(5):  # another instance or connection may add the same version first
            try:
                with self.db.session() as s:
                    rows = s.scalars(select(models.Schema).where(*_match(name))).all()
                    for r in rows:
                        if r.type == info.type and bytes(r.data) == info.data and r.properties == props:
                            return r.version
                    if rows and only_if_none:
                        return None
                    version = max((r.version for r in rows), default=-1) + 1
                    key = _key(name)
                    s.add(
                        models.Schema(
                            tenant=key.tenant,
                            namespace=key.namespace,
                            topic=key.topic,
                            version=version,
                            type=info.type,
                            data=info.data,
                            properties=props,
                            created_at=now_ms(),
                        )
                    )
                return version
            except IntegrityError:
                continue
        raise InvalidInput(f"the schema of {name} changes too fast to add a version; try again")

    def delete(self, name: TopicName) -> int | None:
        """Forget every version of the topic's schema; the last version there was, if any."""
        with self.db.session() as s:
            last = s.scalar(select(func.max(models.Schema.version)).where(*_match(name)))
            s.execute(delete(models.Schema).where(*_match(name)))
            return last


def _key(name: TopicName) -> TopicName:
    """Where a topic's schema is kept: a partition's is its partitioned topic's, as Pulsar's."""
    parent = partition_of(name)
    return parent[0] if parent is not None else name


def _match(name: TopicName) -> tuple[ColumnElement[bool], ...]:
    name = _key(name)
    return (
        models.Schema.tenant == name.tenant,
        models.Schema.namespace == name.namespace,
        models.Schema.topic == name.topic,
    )


def _stored(row: models.Schema) -> StoredSchema:
    return StoredSchema(
        row.version, SchemaInfo(row.type, bytes(row.data), json.loads(row.properties)), row.created_at
    )
