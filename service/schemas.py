"""Pulsar's schema registry: the schemas that producers and consumers declare, kept per topic
with versions.

A topic's versions are 0, 1, 2, ... in the order they were first declared, and a version never
changes once written. Declaring a schema the topic already has (the same type and definition;
properties play no part) gives that version back, as Pulsar does, so producers that restart do
not add versions. A new schema becomes the next version only if the topic's schema compatibility
strategy admits it (``service.schema_compat``; the strategy, and whether producers may add
versions at all, are policies: topic over namespace over the service's settings). Clients carry a
version as 8 big-endian bytes (:func:`version_bytes`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from service import models
from service.clock import now_ms
from service.db import Database
from service.errors import IncompatibleSchema, InvalidInput, NotFound
from service.names import TopicName, partition_of
from service.policies import PolicyStore
from service.schema_compat import check, check_consumer, same_definition

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
# Pulsar's words, which its clients show and users search for.
AUTO_UPDATE_DISABLED = "Schema not found and schema auto updating is disabled."
SCHEMA_REQUIRED = "Producers cannot connect or send message without a schema to topics with a schema"


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

    def __init__(self, db: Database, *, policies: PolicyStore) -> None:
        self.db = db
        self.policies = policies

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

    def strategy(self, name: TopicName) -> str:
        """The topic's schema compatibility strategy: its own, its namespace's, the service's."""
        return self.policies.effective(name).schemaCompatibilityStrategy or "FULL"

    def put(self, name: TopicName, info: SchemaInfo) -> int:
        """An admin's upload: the version of ``info`` in the topic's history, added as the next
        version if it is new and the topic's strategy admits it (else ``IncompatibleSchema``)."""
        known = self._version_of(name, info)
        if known is not None:
            return known
        strategy = self.strategy(name)
        return _added(self._add(name, info, lambda history: _admit(history, info, strategy)))

    def put_for_producer(self, name: TopicName, info: SchemaInfo) -> int:
        """A producer's schema (or GET_OR_CREATE_SCHEMA's): as an upload, and only if producers
        may add versions to the topic (Pulsar's ``isAllowAutoUpdateSchema``)."""
        known = self._version_of(name, info)
        if known is not None:  # a producer starting again: no policy to read
            return known
        policy = self.policies.effective(name)
        strategy = policy.schemaCompatibilityStrategy or "FULL"

        def decide(history: list[StoredSchema]) -> bool:
            if policy.isAllowAutoUpdateSchema is False:
                raise IncompatibleSchema(AUTO_UPDATE_DISABLED)
            return _admit(history, info, strategy)

        return _added(self._add(name, info, decide))

    def for_consumer(self, name: TopicName, info: SchemaInfo, *, active: bool) -> None:
        """A consumer's schema, as Pulsar's broker takes it: checked against the topic's schema
        when it has one (``schema_compat.check_consumer``); the topic's first version when the
        topic has none and is idle; refused on an ``active`` topic (one with data or producers)
        without a schema, unless the strategy is ``ALWAYS_COMPATIBLE``."""
        policy = self.policies.effective(name)
        strategy = policy.schemaCompatibilityStrategy or "FULL"

        def decide(history: list[StoredSchema]) -> bool:
            if history:
                check_consumer([h.info for h in history], info, strategy)
                return False
            if active:
                if strategy == "ALWAYS_COMPATIBLE":
                    return False
                raise IncompatibleSchema(
                    "Failed to add schema to an active topic with empty(BYTES) schema: "
                    f"new schema type {info.type}"
                )
            if policy.isAllowAutoUpdateSchema is False:
                raise IncompatibleSchema(AUTO_UPDATE_DISABLED)
            return True

        history = self.versions(name)
        if history:  # checked even when the topic has this very schema, as Pulsar checks it
            decide(history)
            return
        self._add(name, info, decide)

    def for_producer_without_schema(self, name: TopicName) -> None:
        """Refuse a producer that declares no schema when the topic has one and its policy
        enforces schemas (Pulsar's ``schemaValidationEnforced``)."""
        # The topic's schema first: most topics of raw bytes have none, and then the policy's
        # three reads are spared.
        if self.latest(name) is not None and self.policies.effective(name).schemaValidationEnforced:
            raise IncompatibleSchema(SCHEMA_REQUIRED)

    def compatibility(self, name: TopicName, info: SchemaInfo) -> tuple[str | None, str]:
        """Why the topic would refuse ``info`` as its next version (None: it would take it),
        and the strategy that decides; nothing changes."""
        strategy = self.strategy(name)
        try:
            check([h.info for h in self.versions(name)], info, strategy)
        except IncompatibleSchema as e:
            return e.reason, strategy
        return None, strategy

    def _version_of(self, name: TopicName, info: SchemaInfo) -> int | None:
        """The version the topic has of ``info``'s definition, if any."""
        return next((h.version for h in self.versions(name) if same_definition(h.info, info)), None)

    def _add(
        self, name: TopicName, info: SchemaInfo, decide: Callable[[list[StoredSchema]], bool]
    ) -> int | None:
        """The version of ``info`` in the topic's history; if it has none, ``decide(history)``
        refuses (raises), adds nothing (False: None) or adds ``info`` as the next version. In one
        transaction: a version added meanwhile by another connection or instance is decided on
        again."""
        props = json.dumps(info.properties, sort_keys=True)
        for _ in range(5):
            try:
                with self.db.session() as s:
                    rows = s.scalars(
                        select(models.Schema).where(*_match(name)).order_by(models.Schema.version)
                    ).all()
                    history = [_stored(r) for r in rows]
                    for h in history:
                        if same_definition(h.info, info):
                            return h.version
                    if not decide(history):
                        return None
                    version = history[-1].version + 1 if history else 0
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


def _admit(history: list[StoredSchema], info: SchemaInfo, strategy: str) -> bool:
    check([h.info for h in history], info, strategy)
    return True


def _added(version: int | None) -> int:
    """The version a producer's or admin's ``_add`` gives: its decisions add or refuse, never
    leave out."""
    assert version is not None
    return version


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
