"""Who may do what, as Pulsar's ``PulsarAuthorizationProvider`` decides it.

- A superuser (``superuserRoles``) may do everything.
- A tenant admin (a role in the tenant's ``adminRoles``) may do every admin operation inside
  its tenant, and produce and consume there.
- ``produce`` on a namespace or topic allows producing; ``consume`` allows subscriptions,
  consumers, acknowledgements, seeks and reads; either allows stats and compaction status.

Each route names one ``Rule``; ``Authorizer.check`` raises ``Forbidden`` with a reason that
names the role and the action.
"""

from __future__ import annotations

from enum import Enum

from service.errors import Forbidden
from service.names import TopicName, partition_of
from service.tenants import Snapshot, TenantService


class Rule(Enum):
    """What a route needs. The value is how a refusal describes the action."""

    SUPERUSER = "administer tenants"
    TENANT_ADMIN = "administer"
    PRODUCE = "produce to"
    CONSUME = "consume from"
    PRODUCE_OR_CONSUME = "look up"
    # Listing a namespace's topics: a tenant admin, or a role with a grant on the namespace.
    NAMESPACE_PRODUCE_OR_CONSUME = "list the topics of"
    # Any role with a valid token: a view that shows each role only what it may look up
    # (the dashboard's topic list), or /metrics under authenticateMetricsEndpoint.
    AUTHENTICATED = "see"


_NEEDS = {
    Rule.PRODUCE: frozenset({"produce"}),
    Rule.CONSUME: frozenset({"consume"}),
    Rule.PRODUCE_OR_CONSUME: frozenset({"produce", "consume"}),
    Rule.NAMESPACE_PRODUCE_OR_CONSUME: frozenset({"produce", "consume"}),
}


class Authorizer:
    """Decides a role's requests from the superuser roles and the tenants' grants."""

    def __init__(self, *, superusers: frozenset[str], tenants: TenantService) -> None:
        self.superusers = superusers
        self.tenants = tenants

    def may(self, *, role: str, rule: Rule, topic: TopicName) -> bool:
        """Whether ``role`` may do what ``rule`` describes on ``topic`` (for views that filter
        what they show rather than refuse)."""
        try:
            self.check(
                role=role, rule=rule, tenant=topic.tenant, namespace=topic.namespace, topic=topic.topic
            )
        except Forbidden:
            return False
        return True

    def check(
        self, *, role: str, rule: Rule, tenant: str | None, namespace: str | None, topic: str | None
    ) -> None:
        """Return if ``role`` may do what ``rule`` describes on the resource; ``Forbidden`` if not."""
        if role in self.superusers or rule is Rule.AUTHENTICATED:
            return
        snap = self.tenants.snapshot()
        key = (role, rule, tenant, namespace, topic)
        allowed = snap.decisions.get(key)
        if allowed is None:
            allowed = _allowed(snap, role, rule, tenant, namespace, topic)
            if len(snap.decisions) >= _MAX_DECISIONS:
                snap.decisions.clear()  # bounded, whatever names clients send
            snap.decisions[key] = allowed
        if not allowed:
            raise Forbidden(_reason(role, rule, tenant, namespace, topic))


_MAX_DECISIONS = 100_000


def _allowed(
    snap: Snapshot, role: str, rule: Rule, tenant: str | None, namespace: str | None, topic: str | None
) -> bool:
    if rule is Rule.SUPERUSER or tenant is None:
        return False
    if role in snap.admin_roles.get(tenant, ()):
        return True
    needs = _NEEDS.get(rule)
    if needs is None or namespace is None:
        return False
    if rule is Rule.NAMESPACE_PRODUCE_OR_CONSUME or topic is None:
        granted = snap.namespace_actions(role, tenant, namespace)
    else:
        name = TopicName(tenant, namespace, topic)
        granted = snap.actions(role, name)
        parent = partition_of(name)
        if parent is not None:  # a partition: the partitioned topic's grants are its own (Pulsar)
            granted = granted | snap.actions(role, parent[0])
    return bool(granted & needs)


def _reason(role: str, rule: Rule, tenant: str | None, namespace: str | None, topic: str | None) -> str:
    if rule is Rule.SUPERUSER:
        return f"role {role!r} is not authorized to {rule.value}: it needs to be a superuser"
    if topic is not None:
        resource = f"persistent://{tenant}/{namespace}/{topic}"
    elif namespace is not None:
        resource = f"namespace {tenant}/{namespace}"
    else:
        resource = f"tenant {tenant}"
    needs = {
        Rule.TENANT_ADMIN: "an admin role of the tenant",
        Rule.PRODUCE: "the produce permission",
        Rule.CONSUME: "the consume permission",
        Rule.PRODUCE_OR_CONSUME: "the produce or consume permission",
        Rule.NAMESPACE_PRODUCE_OR_CONSUME: "the produce or consume permission on the namespace",
    }[rule]
    return f"role {role!r} is not authorized to {rule.value} {resource}: it needs {needs}"
