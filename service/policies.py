"""Compaction, retention, deduplication and schema policies at three levels: topic over namespace
over the service.

A policy row holds the values set at one scope; a NULL column is "not set here". The
effective policy of a topic takes each field from the narrowest scope that sets it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import select

from service import models
from service.db import Database
from service.errors import InvalidInput
from service.names import TopicName, check_part, partition_of
from service.schema_compat import STRATEGIES
from service.settings import Settings

_STRATEGY = re.compile(r"^(offset|eventTime|property:[A-Za-z0-9_.\-]{1,128})$")


@dataclass(frozen=True)
class Policy:
    """Every field a policy can set (None = not set at this scope). API names in camelCase."""

    compactionThreshold: int | None = None
    minCleanableDirtyRatio: float | None = None
    maxCompactionLagMs: int | None = None
    minCompactionLagMs: int | None = None
    deleteRetentionMs: int | None = None
    retainNullKey: bool | None = None
    compactionStrategy: str | None = None
    retentionTimeMs: int | None = None
    retentionSizeBytes: int | None = None
    deduplicationEnabled: bool | None = None
    schemaCompatibilityStrategy: str | None = None
    isAllowAutoUpdateSchema: bool | None = None
    schemaValidationEnforced: bool | None = None
    table: bool | None = None


FIELDS = [f.name for f in fields(Policy)]
COLUMN = {
    "compactionThreshold": "compaction_threshold",
    "minCleanableDirtyRatio": "min_cleanable_dirty_ratio",
    "maxCompactionLagMs": "max_compaction_lag_ms",
    "minCompactionLagMs": "min_compaction_lag_ms",
    "deleteRetentionMs": "delete_retention_ms",
    "retainNullKey": "retain_null_key",
    "compactionStrategy": "compaction_strategy",
    "retentionTimeMs": "retention_time_ms",
    "retentionSizeBytes": "retention_size_bytes",
    "deduplicationEnabled": "deduplication_enabled",
    "schemaCompatibilityStrategy": "schema_compatibility_strategy",
    "isAllowAutoUpdateSchema": "is_allow_auto_update_schema",
    "schemaValidationEnforced": "schema_validation_enforced",
    "table": "table_enabled",
}
_BOOLEANS = (
    "retainNullKey",
    "deduplicationEnabled",
    "isAllowAutoUpdateSchema",
    "schemaValidationEnforced",
    "table",
)


def validate(field: str, value: Any) -> Any:
    """The value, checked; ``InvalidInput`` (400) for anything out of range."""
    if value is None:
        return None
    if field in _BOOLEANS:
        if not isinstance(value, bool):
            raise InvalidInput(f"{field} must be true or false")
        return value
    if field == "compactionStrategy":
        if not isinstance(value, str) or not _STRATEGY.match(value):
            raise InvalidInput("compactionStrategy must be 'offset', 'eventTime' or 'property:<name>'")
        return value
    if field == "schemaCompatibilityStrategy":
        if not isinstance(value, str) or value not in STRATEGIES:
            raise InvalidInput(f"schemaCompatibilityStrategy must be one of {', '.join(STRATEGIES)}")
        return None if value == "UNDEFINED" else value  # Pulsar's UNDEFINED: not set here
    if field == "minCleanableDirtyRatio":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise InvalidInput("minCleanableDirtyRatio must be a number from 0 to 1")
        return float(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON's 1000.0 is the integer 1000 (as JSON Schema counts it)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2**63:
        raise InvalidInput(f"{field} must be a whole number >= 0")
    return value


@dataclass(frozen=True)
class Scope:
    tenant: str
    namespace: str
    topic: str = ""  # "" = the namespace itself

    @classmethod
    def namespace_of(cls, tenant: str, namespace: str) -> Scope:
        return cls(check_part("tenant", tenant), check_part("namespace", namespace))

    @classmethod
    def topic_of(cls, name: TopicName) -> Scope:
        return cls(name.tenant, name.namespace, name.topic)


class PolicyStore:
    """Reads and writes policies; resolves a topic's effective policy."""

    def __init__(self, *, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    def get(self, scope: Scope) -> Policy:
        with self.db.session() as s:
            row = self._row(s, scope)
            return _policy(row) if row is not None else Policy()

    def set(self, scope: Scope, **values: Any) -> Policy:
        """Set the given fields (validated all first: a bad value changes nothing)."""
        checked = {}
        for k, v in values.items():
            if k not in COLUMN:
                raise InvalidInput(f"unknown policy field {k!r}")
            checked[k] = validate(k, v)
        with self.db.session() as s:
            row = self._row(s, scope)
            if row is None:
                row = models.Policy(tenant=scope.tenant, namespace=scope.namespace, topic=scope.topic)
                s.add(row)
            for k, v in checked.items():
                setattr(row, COLUMN[k], v)
            s.flush()
            return _policy(row)

    def remove(self, scope: Scope, *names: str) -> None:
        """Unset the named fields (all of them when none is named)."""
        with self.db.session() as s:
            row = self._row(s, scope)
            if row is None:
                return
            for k in names or FIELDS:
                setattr(row, COLUMN[k], None)
            if all(getattr(row, c) is None for c in COLUMN.values()):
                s.delete(row)

    def effective(self, name: TopicName) -> Policy:
        """Topic over namespace over the service default, field by field (a partition's: its
        own, then its partitioned topic's, then the namespace's and the service's)."""
        levels = [p for _, p in self._levels(name)]
        return Policy(
            **{f: next((getattr(p, f) for p in levels if getattr(p, f) is not None), None) for f in FIELDS}
        )

    def _levels(self, name: TopicName) -> list[tuple[str, Policy]]:
        levels = [("topic", self.get(Scope.topic_of(name)))]
        parent = partition_of(name)
        if parent is not None:  # a policy set on a partitioned topic applies to its partitions
            levels.append(("partitioned topic", self.get(Scope.topic_of(parent[0]))))
        levels.append(("namespace", self.get(Scope(name.tenant, name.namespace))))
        levels.append(("default", self.service_default()))
        return levels

    def applied(self, name: TopicName) -> dict[str, tuple[Any, str]]:
        """Each field's effective value and where it comes from: ``"topic"``, ``"partitioned
        topic"`` (a partition's), ``"namespace"``, ``"default"`` (the service's settings), or
        ``"unset"`` (no value anywhere)."""
        levels = self._levels(name)
        out: dict[str, tuple[Any, str]] = {}
        for f in FIELDS:
            found = [(getattr(p, f), source) for source, p in levels if getattr(p, f) is not None]
            out[f] = found[0] if found else (None, "unset")
        return out

    def service_default(self) -> Policy:
        s = self.settings
        return Policy(
            compactionThreshold=s.compaction_threshold,
            minCleanableDirtyRatio=None,
            maxCompactionLagMs=None,
            minCompactionLagMs=0,
            deleteRetentionMs=0,
            retainNullKey=s.retain_null_key,
            compactionStrategy="offset",
            retentionTimeMs=None,
            retentionSizeBytes=None,
            deduplicationEnabled=s.broker_deduplication_enabled,
            schemaCompatibilityStrategy=s.schema_compatibility_strategy,
            isAllowAutoUpdateSchema=s.is_allow_auto_update_schema_enabled,
            schemaValidationEnforced=s.is_schema_validation_enforced,
            table=s.table_default,
        )

    @staticmethod
    def _row(s: Any, scope: Scope) -> models.Policy | None:
        return s.scalar(  # type: ignore[no-any-return]
            select(models.Policy).where(
                models.Policy.tenant == scope.tenant,
                models.Policy.namespace == scope.namespace,
                models.Policy.topic == scope.topic,
            )
        )


def _policy(row: models.Policy) -> Policy:
    return Policy(**{k: getattr(row, c) for k, c in COLUMN.items()})
