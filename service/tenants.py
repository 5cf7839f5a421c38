"""Tenants, namespaces and the permissions granted on them, as Pulsar keeps them.

A tenant has admin roles and allowed clusters; a namespace ``tenant/name`` belongs to one;
topics are created only in a namespace that exists. A role is granted actions (``produce``,
``consume``) on a namespace, or on one topic. ``public`` and ``public/default`` exist from the
first start (the migration makes them).

Authorization reads grants and admin roles from ``Snapshot``: the whole table, small, loaded
at once and kept ``cache_seconds``. A change made here drops it at once; a change made by
another instance sharing the database is seen within ``cache_seconds``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy import delete, select

from service import models
from service.clock import now_ms
from service.db import Database
from service.errors import Conflict, InvalidInput, NotFound
from service.names import TopicName, check_part

ACTIONS = ("produce", "consume")


@dataclass(frozen=True)
class TenantInfo:
    admin_roles: list[str] = field(default_factory=list)
    allowed_clusters: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Snapshot:
    """What authorization needs, read at one time."""

    admin_roles: dict[str, frozenset[str]]
    # (tenant, namespace, topic or "") -> role -> actions
    grants: dict[tuple[str, str, str], dict[str, frozenset[str]]]
    loaded_at: float
    generation: int  # of the service's changes when it was read
    # Decisions made from this snapshot, (role, rule, tenant, namespace, topic) -> allowed: a
    # client sends the same request shapes over and over. Dropped with the snapshot.
    decisions: dict[tuple[object, ...], bool] = field(default_factory=dict)

    def actions(self, role: str, name: TopicName) -> frozenset[str]:
        """The actions granted to ``role`` on the topic, through its namespace or itself."""
        ns = self.grants.get((name.tenant, name.namespace, ""), {}).get(role, frozenset())
        own = self.grants.get((name.tenant, name.namespace, name.topic), {}).get(role, frozenset())
        return ns | own

    def namespace_actions(self, role: str, tenant: str, namespace: str) -> frozenset[str]:
        return self.grants.get((tenant, namespace, ""), {}).get(role, frozenset())


def check_actions(actions: Iterable[object]) -> list[str]:
    """The actions of a grant, checked and sorted; 400 for one Pulsar's broker would not know."""
    out = set()
    for a in actions:
        if a not in ACTIONS:
            raise InvalidInput(f"unknown action {a!r}: the actions are {', '.join(ACTIONS)}")
        out.add(str(a))
    return sorted(out)


class TenantService:
    """The tenants, namespaces and grants of the metadata store. Thread-safe."""

    def __init__(
        self,
        *,
        db: Database,
        topics_of: Callable[[str, str], list[str]],
        cache_seconds: float = 5.0,
    ) -> None:
        self.db = db
        self._topics_of = topics_of
        self.cache_seconds = cache_seconds
        self._snapshot: Snapshot | None = None
        # Bumped by every change: a snapshot read while a change committed is not kept.
        self._generation = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ tenants

    def tenants(self) -> list[str]:
        with self.db.session() as s:
            return list(s.scalars(select(models.Tenant.name).order_by(models.Tenant.name)))

    def tenant(self, *, tenant: str) -> TenantInfo:
        with self.db.session() as s:
            row = s.get(models.Tenant, check_part("tenant", tenant))
            if row is None:
                raise NotFound(f"tenant {tenant} does not exist")
            return TenantInfo(json.loads(row.admin_roles), json.loads(row.allowed_clusters))

    def create_tenant(self, *, tenant: str, info: TenantInfo) -> None:
        with self.db.session() as s:
            if s.get(models.Tenant, check_part("tenant", tenant)) is not None:
                raise Conflict(f"tenant {tenant} already exists")
            s.add(
                models.Tenant(
                    name=tenant,
                    admin_roles=json.dumps(sorted(set(info.admin_roles))),
                    allowed_clusters=json.dumps(sorted(set(info.allowed_clusters))),
                    created_at=now_ms(),
                )
            )
        self.invalidate()

    def update_tenant(self, *, tenant: str, info: TenantInfo) -> None:
        with self.db.session() as s:
            row = s.get(models.Tenant, check_part("tenant", tenant))
            if row is None:
                raise NotFound(f"tenant {tenant} does not exist")
            row.admin_roles = json.dumps(sorted(set(info.admin_roles)))
            row.allowed_clusters = json.dumps(sorted(set(info.allowed_clusters)))
        self.invalidate()

    def delete_tenant(self, *, tenant: str) -> None:
        """409 while it has namespaces (as Pulsar: delete them first)."""
        with self.db.session() as s:
            row = s.get(models.Tenant, check_part("tenant", tenant))
            if row is None:
                raise NotFound(f"tenant {tenant} does not exist")
            if s.scalars(select(models.Namespace.name).where(models.Namespace.tenant == tenant)).first():
                raise Conflict(f"tenant {tenant} still has namespaces; delete them first")
            s.delete(row)
            s.execute(delete(models.Permission).where(models.Permission.tenant == tenant))
            s.execute(delete(models.Policy).where(models.Policy.tenant == tenant))
        self.invalidate()

    # --------------------------------------------------------------- namespaces

    def namespaces(self, *, tenant: str) -> list[str]:
        with self.db.session() as s:
            if s.get(models.Tenant, check_part("tenant", tenant)) is None:
                raise NotFound(f"tenant {tenant} does not exist")
            names = s.scalars(
                select(models.Namespace.name)
                .where(models.Namespace.tenant == tenant)
                .order_by(models.Namespace.name)
            )
            return [f"{tenant}/{n}" for n in names]

    def require_namespace(self, *, tenant: str, namespace: str) -> None:
        """404 unless the namespace exists (a topic is created only in one that does)."""
        with self.db.session() as s:
            if s.get(models.Namespace, (tenant, namespace)) is None:
                raise NotFound(f"namespace {tenant}/{namespace} does not exist")

    def create_namespace(self, *, tenant: str, namespace: str) -> None:
        check_part("namespace", namespace)
        with self.db.session() as s:
            if s.get(models.Tenant, check_part("tenant", tenant)) is None:
                raise NotFound(f"tenant {tenant} does not exist")
            if s.get(models.Namespace, (tenant, namespace)) is not None:
                raise Conflict(f"namespace {tenant}/{namespace} already exists")
            s.add(models.Namespace(tenant=tenant, name=namespace, created_at=now_ms()))

    def delete_namespace(self, *, tenant: str, namespace: str) -> None:
        """409 while it has topics; its grants and policies go with it."""
        with self.db.session() as s:
            row = s.get(models.Namespace, (tenant, namespace))
            if row is None:
                raise NotFound(f"namespace {tenant}/{namespace} does not exist")
            if self._topics_of(tenant, namespace):
                raise Conflict(f"namespace {tenant}/{namespace} still has topics; delete them first")
            s.delete(row)
            s.execute(
                delete(models.Permission).where(
                    models.Permission.tenant == tenant, models.Permission.namespace == namespace
                )
            )
            s.execute(
                delete(models.Policy).where(
                    models.Policy.tenant == tenant, models.Policy.namespace == namespace
                )
            )
            # Schemas uploaded for topics never created.
            s.execute(
                delete(models.Schema).where(
                    models.Schema.tenant == tenant, models.Schema.namespace == namespace
                )
            )
        self.invalidate()

    # -------------------------------------------------------------- permissions

    def permissions(self, *, tenant: str, namespace: str, topic: str = "") -> dict[str, list[str]]:
        """role -> actions granted at this level (a topic's: its own and its namespace's, as
        Pulsar's ``permissions`` of a topic)."""
        self.require_namespace(tenant=tenant, namespace=namespace)
        scopes = [""] if not topic else ["", topic]
        out: dict[str, set[str]] = {}
        with self.db.session() as s:
            rows = s.scalars(
                select(models.Permission).where(
                    models.Permission.tenant == tenant,
                    models.Permission.namespace == namespace,
                    models.Permission.topic.in_(scopes),
                )
            )
            for r in rows:
                out.setdefault(r.role, set()).update(r.actions.split(","))
        return {role: sorted(a) for role, a in sorted(out.items())}

    def grant(self, *, tenant: str, namespace: str, topic: str = "", role: str, actions: list[str]) -> None:
        """Set the role's actions at this level (replacing what it had there, as Pulsar)."""
        self.require_namespace(tenant=tenant, namespace=namespace)
        acts = check_actions(actions)
        with self.db.session() as s:
            row = s.get(models.Permission, (tenant, namespace, topic, role))
            if not acts:
                if row is not None:
                    s.delete(row)
            elif row is None:
                s.add(
                    models.Permission(
                        tenant=tenant, namespace=namespace, topic=topic, role=role, actions=",".join(acts)
                    )
                )
            else:
                row.actions = ",".join(acts)
        self.invalidate()

    def revoke(self, *, tenant: str, namespace: str, topic: str = "", role: str) -> None:
        self.require_namespace(tenant=tenant, namespace=namespace)
        with self.db.session() as s:
            row = s.get(models.Permission, (tenant, namespace, topic, role))
            if row is None:
                where = f"{tenant}/{namespace}" + (f"/{topic}" if topic else "")
                raise NotFound(f"role {role!r} has no permissions on {where}")
            s.delete(row)
        self.invalidate()

    def forget_topic(self, *, name: TopicName) -> None:
        """A deleted topic's grants go with it: a topic created later under the name starts bare."""
        with self.db.session() as s:
            s.execute(
                delete(models.Permission).where(
                    models.Permission.tenant == name.tenant,
                    models.Permission.namespace == name.namespace,
                    models.Permission.topic == name.topic,
                )
            )
        self.invalidate()

    # ----------------------------------------------------------------- snapshot

    def snapshot(self) -> Snapshot:
        snap = self._snapshot
        if snap is not None and self._fresh(snap):
            return snap
        with self._lock:
            snap = self._snapshot
            if snap is None or not self._fresh(snap):
                snap = self._snapshot = self._load()
            return snap

    def _fresh(self, snap: Snapshot) -> bool:
        return snap.generation == self._generation and time.monotonic() - snap.loaded_at < self.cache_seconds

    def invalidate(self) -> None:
        self._generation += 1
        self._snapshot = None

    def _load(self) -> Snapshot:
        generation = self._generation
        loaded_at = time.monotonic()
        with self.db.session() as s:
            admins = {t.name: frozenset(json.loads(t.admin_roles)) for t in s.scalars(select(models.Tenant))}
            grants: dict[tuple[str, str, str], dict[str, frozenset[str]]] = {}
            for p in s.scalars(select(models.Permission)):
                grants.setdefault((p.tenant, p.namespace, p.topic), {})[p.role] = frozenset(
                    p.actions.split(",")
                )
        return Snapshot(admin_roles=admins, grants=grants, loaded_at=loaded_at, generation=generation)
