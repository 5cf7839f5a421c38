"""Permissions at Pulsar's paths: ``.../permissions`` of a namespace and of a topic.

``POST .../permissions/{role}`` with ``["produce", "consume"]`` sets the role's actions at that
level; ``GET .../permissions`` is ``{"role": ["produce", ...]}``; ``DELETE .../permissions/{role}``
revokes them. A tenant admin's (or a superuser's) to change or see.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Response

from api.deps import BrokerDep, TenantAdmin, TenantsDep, TopicDep
from api.schemas import ROLE_PATTERN, Action
from service.names import check_part

router = APIRouter(prefix="/admin/v2", tags=["permissions"], dependencies=[TenantAdmin])

NAMESPACE = "/namespaces/{tenant}/{namespace}/permissions"
TOPIC = "/persistent/{tenant}/{namespace}/{topic}/permissions"
RolePath = Annotated[str, Path(pattern=ROLE_PATTERN, min_length=1, max_length=256)]
Actions = Annotated[list[Action], Body(max_length=16)]


@router.get(NAMESPACE, response_model=dict[str, list[str]])
def namespace_permissions(tenant: str, namespace: str, tenants: TenantsDep) -> dict[str, list[str]]:
    return tenants.permissions(
        tenant=check_part("tenant", tenant), namespace=check_part("namespace", namespace)
    )


@router.post(NAMESPACE + "/{role}", status_code=204, response_class=Response)
def grant_on_namespace(
    tenant: str, namespace: str, role: RolePath, actions: Actions, tenants: TenantsDep
) -> Response:
    tenants.grant(
        tenant=check_part("tenant", tenant),
        namespace=check_part("namespace", namespace),
        role=role,
        actions=list(actions),
    )
    return Response(status_code=204)


@router.delete(NAMESPACE + "/{role}", status_code=204, response_class=Response)
def revoke_on_namespace(tenant: str, namespace: str, role: RolePath, tenants: TenantsDep) -> Response:
    tenants.revoke(
        tenant=check_part("tenant", tenant), namespace=check_part("namespace", namespace), role=role
    )
    return Response(status_code=204)


@router.get(TOPIC, response_model=dict[str, list[str]])
def topic_permissions(name: TopicDep, broker: BrokerDep, tenants: TenantsDep) -> dict[str, list[str]]:
    """The topic's own grants and its namespace's, merged (as Pulsar's)."""
    broker.topic(name)
    return tenants.permissions(tenant=name.tenant, namespace=name.namespace, topic=name.topic)


@router.post(TOPIC + "/{role}", status_code=204, response_class=Response)
def grant_on_topic(
    name: TopicDep, role: RolePath, actions: Actions, broker: BrokerDep, tenants: TenantsDep
) -> Response:
    broker.topic(name)
    tenants.grant(
        tenant=name.tenant, namespace=name.namespace, topic=name.topic, role=role, actions=list(actions)
    )
    return Response(status_code=204)


@router.delete(TOPIC + "/{role}", status_code=204, response_class=Response)
def revoke_on_topic(name: TopicDep, role: RolePath, broker: BrokerDep, tenants: TenantsDep) -> Response:
    broker.topic(name)
    tenants.revoke(tenant=name.tenant, namespace=name.namespace, topic=name.topic, role=role)
    return Response(status_code=204)
