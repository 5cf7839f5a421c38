"""Backlog quotas (Pulsar's ``BacklogQuota``): how large (``destination_storage``, bytes) or how
old (``message_age``, seconds) a topic's backlog may grow, and what happens past it.

A quota is set per quota type on a namespace or a topic; a topic's effective quota of a type is
its own, else its partitioned topic's, else its namespace's, else the service's default
(``COMPACTOR_BACKLOG_QUOTA_DEFAULT_*``, none unless set). What is enforced, and where, is
:mod:`service.backlog_quota_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select

from service import models
from service.db import Database
from service.errors import InvalidInput
from service.names import TopicName, partition_of
from service.policies import Scope
from service.settings import Settings

DESTINATION_STORAGE = "destination_storage"
MESSAGE_AGE = "message_age"
QUOTA_TYPES = (DESTINATION_STORAGE, MESSAGE_AGE)

PRODUCER_REQUEST_HOLD = "producer_request_hold"
PRODUCER_EXCEPTION = "producer_exception"
CONSUMER_BACKLOG_EVICTION = "consumer_backlog_eviction"
POLICIES = (PRODUCER_REQUEST_HOLD, PRODUCER_EXCEPTION, CONSUMER_BACKLOG_EVICTION)

_MAX = 2**63 - 1


@dataclass(frozen=True)
class BacklogQuota:
    """One quota: ``limit_size`` bytes (-1: none), ``limit_time`` seconds (-1: none), and the
    policy applied past it."""

    limit_size: int
    limit_time: int
    policy: str

    def to_json(self) -> dict[str, Any]:
        """Pulsar's JSON of it (``limit``: its older name of ``limitSize``, still sent)."""
        return {
            "limit": self.limit_size,
            "limitSize": self.limit_size,
            "limitTime": self.limit_time,
            "policy": self.policy,
        }


def quota_type(value: str | None) -> str:
    """The ``backlogQuotaType`` query parameter, checked (absent: ``destination_storage``)."""
    if value is None or value == "":
        return DESTINATION_STORAGE
    if value not in QUOTA_TYPES:
        raise InvalidInput(f"backlogQuotaType must be one of {', '.join(QUOTA_TYPES)}, not {value!r}")
    return value


def parse(body: Any) -> BacklogQuota:
    """A quota from Pulsar's JSON (``limitSize`` or its old name ``limit``, ``limitTime``,
    ``policy``), checked: ``InvalidInput`` for an unknown policy or a limit below -1."""
    if not isinstance(body, dict):
        raise InvalidInput("a backlog quota is a JSON object: {limitSize, limitTime, policy}")
    unknown = set(body) - {"limit", "limitSize", "limitTime", "policy"}
    if unknown:
        raise InvalidInput(f"unknown backlog quota field(s): {', '.join(sorted(unknown))}")
    policy = body.get("policy")
    if policy not in POLICIES:
        raise InvalidInput(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    size = body.get("limitSize", body.get("limit"))
    return BacklogQuota(_limit("limitSize", size), _limit("limitTime", body.get("limitTime")), policy)


def _limit(field: str, value: Any) -> int:
    if value is None:
        return -1
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= _MAX:
        raise InvalidInput(f"{field} must be a whole number >= 0, or -1 for no limit")
    return value


class BacklogQuotaStore:
    """Reads and writes backlog quotas; resolves a topic's effective ones."""

    def __init__(self, *, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    def get(self, scope: Scope) -> dict[str, BacklogQuota]:
        """The quotas set at ``scope``, by quota type."""
        with self.db.session() as s:
            rows = s.scalars(
                select(models.BacklogQuota).where(
                    models.BacklogQuota.tenant == scope.tenant,
                    models.BacklogQuota.namespace == scope.namespace,
                    models.BacklogQuota.topic == scope.topic,
                )
            ).all()
            return {r.quota_type: BacklogQuota(r.limit_size, r.limit_time, r.policy) for r in rows}

    def set(self, scope: Scope, kind: str, quota: BacklogQuota) -> None:
        with self.db.session() as s:
            row = s.scalar(
                select(models.BacklogQuota).where(
                    models.BacklogQuota.tenant == scope.tenant,
                    models.BacklogQuota.namespace == scope.namespace,
                    models.BacklogQuota.topic == scope.topic,
                    models.BacklogQuota.quota_type == kind,
                )
            )
            if row is None:
                row = models.BacklogQuota(
                    tenant=scope.tenant, namespace=scope.namespace, topic=scope.topic, quota_type=kind
                )
                s.add(row)
            row.limit_size, row.limit_time, row.policy = quota.limit_size, quota.limit_time, quota.policy

    def remove(self, scope: Scope, kind: str) -> None:
        with self.db.session() as s:
            s.execute(
                delete(models.BacklogQuota).where(
                    models.BacklogQuota.tenant == scope.tenant,
                    models.BacklogQuota.namespace == scope.namespace,
                    models.BacklogQuota.topic == scope.topic,
                    models.BacklogQuota.quota_type == kind,
                )
            )

    def default(self) -> dict[str, BacklogQuota]:
        """The service's default quota of each type (Pulsar applies one quota to both types)."""
        s = self.settings
        quota = BacklogQuota(
            s.backlog_quota_default_limit_bytes,
            s.backlog_quota_default_limit_second,
            s.backlog_quota_default_retention_policy,
        )
        return dict.fromkeys(QUOTA_TYPES, quota)

    def effective(self, name: TopicName) -> dict[str, BacklogQuota]:
        """Each quota type's quota for ``name``: the topic's, its partitioned topic's, its
        namespace's, else the service's default (one query: producers ask as they connect)."""
        parent = partition_of(name)
        scopes = [name.topic] + ([parent[0].topic] if parent is not None else []) + [""]
        with self.db.session() as s:
            rows = s.scalars(
                select(models.BacklogQuota).where(
                    models.BacklogQuota.tenant == name.tenant,
                    models.BacklogQuota.namespace == name.namespace,
                    models.BacklogQuota.topic.in_(scopes),
                )
            ).all()
            found = {
                (r.topic, r.quota_type): BacklogQuota(r.limit_size, r.limit_time, r.policy) for r in rows
            }
        default = self.default()
        return {
            kind: next((found[t, kind] for t in scopes if (t, kind) in found), default[kind])
            for kind in QUOTA_TYPES
        }
