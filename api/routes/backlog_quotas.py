"""Backlog quotas at Pulsar's admin paths (``service.backlog_quotas``), as Go's ``pulsaradmin``
and Java's admin client call them: ``backlogQuotaMap`` (GET) and ``backlogQuota`` (POST with
Pulsar's ``BacklogQuota`` JSON, DELETE; ``?backlogQuotaType=destination_storage|message_age``,
``destination_storage`` when absent), of a namespace and of a topic."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from api.deps import BrokerDep, PartitionedDep, QuotasDep, TenantAdmin, TenantsDep, TopicDep
from api.routes.policies import _require_topic
from service.backlog_quotas import parse, quota_type
from service.policies import Scope

# Policies, read or changed, are a tenant admin's.
router = APIRouter(tags=["policies"], dependencies=[TenantAdmin])

TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
NAMESPACE = "/admin/v2/namespaces/{tenant}/{namespace}"
QuotaType = Annotated[
    Literal["destination_storage", "message_age"] | None,
    Query(description="destination_storage (bytes, the default) or message_age (seconds)"),
]


# The largest limit taken: 2^53 - 1 (8 PiB, or 285 million years), the largest integer a JSON
# number holds exactly everywhere, so that every limit the document allows the service takes.
MAX_LIMIT = 2**53 - 1


class BacklogQuotaIn(BaseModel):
    """Pulsar's ``BacklogQuota`` JSON, as its admin clients send it (-1 or absent: no limit;
    the policies are ``service.backlog_quotas.POLICIES``)."""

    model_config = ConfigDict(extra="forbid")

    limit: int | None = Field(
        default=None, ge=-1, le=MAX_LIMIT, description="Pulsar's older name of limitSize"
    )
    limitSize: int | None = Field(
        default=None, ge=-1, le=MAX_LIMIT, description="bytes (destination_storage)"
    )
    limitTime: int | None = Field(default=None, ge=-1, le=MAX_LIMIT, description="seconds (message_age)")
    policy: Literal["producer_request_hold", "producer_exception", "consumer_backlog_eviction"]


QuotaBody = Annotated[BacklogQuotaIn, Body()]
BAD: dict[int | str, dict[str, Any]] = {
    422: {"description": "an unknown quota type or policy, or a limit below -1: nothing changed"}
}
QuotaMap = dict[str, dict[str, Any]]


@router.get(NAMESPACE + "/backlogQuotaMap", response_model=QuotaMap)
def get_namespace_backlog_quotas(
    tenant: str, namespace: str, quotas: QuotasDep, tenants: TenantsDep
) -> QuotaMap:
    """The namespace's backlog quotas, by quota type (those set; ``{}`` when none is)."""
    tenants.require_namespace(tenant=tenant, namespace=namespace)
    return {k: q.to_json() for k, q in quotas.get(Scope.namespace_of(tenant, namespace)).items()}


@router.post(NAMESPACE + "/backlogQuota", status_code=204, response_class=Response, responses=BAD)
def set_namespace_backlog_quota(
    tenant: str,
    namespace: str,
    quotas: QuotasDep,
    tenants: TenantsDep,
    value: QuotaBody,
    backlogQuotaType: QuotaType = None,
) -> Response:
    """Set one of the namespace's backlog quotas (its topics take it unless they set their own)."""
    kind, quota = quota_type(backlogQuotaType), parse(value.model_dump(exclude_none=True))
    tenants.require_namespace(tenant=tenant, namespace=namespace)
    quotas.set(Scope.namespace_of(tenant, namespace), kind, quota)
    return Response(status_code=204)


@router.delete(NAMESPACE + "/backlogQuota", status_code=204, response_class=Response, responses=BAD)
def remove_namespace_backlog_quota(
    tenant: str, namespace: str, quotas: QuotasDep, tenants: TenantsDep, backlogQuotaType: QuotaType = None
) -> Response:
    kind = quota_type(backlogQuotaType)
    tenants.require_namespace(tenant=tenant, namespace=namespace)
    quotas.remove(Scope.namespace_of(tenant, namespace), kind)
    return Response(status_code=204)


@router.get(TOPIC + "/backlogQuotaMap", response_model=QuotaMap)
def get_topic_backlog_quotas(
    name: TopicDep, quotas: QuotasDep, broker: BrokerDep, partitioned: PartitionedDep, applied: bool = False
) -> QuotaMap:
    """The topic's backlog quotas, by quota type; ``?applied=true``: the ones in force (the
    topic's, its namespace's, else the service's default, for each type)."""
    _require_topic(name, broker, partitioned)
    found = quotas.effective(name) if applied else quotas.get(Scope.topic_of(name))
    return {k: q.to_json() for k, q in found.items()}


@router.post(TOPIC + "/backlogQuota", status_code=204, response_class=Response, responses=BAD)
def set_topic_backlog_quota(
    name: TopicDep,
    quotas: QuotasDep,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    value: QuotaBody,
    backlogQuotaType: QuotaType = None,
) -> Response:
    """Set one of the topic's backlog quotas (over its namespace's)."""
    kind, quota = quota_type(backlogQuotaType), parse(value.model_dump(exclude_none=True))
    _require_topic(name, broker, partitioned)
    quotas.set(Scope.topic_of(name), kind, quota)
    return Response(status_code=204)


@router.delete(TOPIC + "/backlogQuota", status_code=204, response_class=Response, responses=BAD)
def remove_topic_backlog_quota(
    name: TopicDep,
    quotas: QuotasDep,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    backlogQuotaType: QuotaType = None,
) -> Response:
    kind = quota_type(backlogQuotaType)
    _require_topic(name, broker, partitioned)
    quotas.remove(Scope.topic_of(name), kind)
    return Response(status_code=204)
