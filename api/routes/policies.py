"""Compaction policies: thresholds at Pulsar's paths, and the whole policy document, at topic
and namespace level; Pulsar's deduplication switch at its paths. ``?applied=true`` on a
topic's GET gives the effective value (topic over namespace over the service default), as
Pulsar's ``applied`` flag does."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request, Response

from api.deps import BrokerDep, PartitionedDep, TenantAdmin, TopicDep
from service.errors import InvalidInput, NotFound
from service.names import TopicName
from service.partitions import PartitionedTopics
from service.policies import FIELDS, Policy, PolicyStore, Scope, validate
from service.topics import Broker

# Policies, read or changed, are a tenant admin's.
router = APIRouter(tags=["policies"], dependencies=[TenantAdmin])


async def get_policies(request: Request) -> PolicyStore:
    return request.app.state.policies  # type: ignore[no-any-return]


PoliciesDep = Annotated[PolicyStore, Depends(get_policies)]
PolicyBody = Annotated[dict[str, Any], Body()]
TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
NAMESPACE = "/admin/v2/namespaces/{tenant}/{namespace}"


@router.get(TOPIC + "/compactionThreshold")
def get_topic_threshold(
    name: TopicDep,
    policies: PoliciesDep,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    applied: bool = False,
) -> int | None:
    _require_topic(name, broker, partitioned)
    if applied:
        return policies.effective(name).compactionThreshold
    return policies.get(Scope.topic_of(name)).compactionThreshold


@router.post(TOPIC + "/compactionThreshold", status_code=204, response_class=Response)
def set_topic_threshold(
    name: TopicDep,
    policies: PoliciesDep,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    value: Annotated[Any, Body()],
) -> Response:
    _require_topic(name, broker, partitioned)
    policies.set(Scope.topic_of(name), compactionThreshold=value)
    return Response(status_code=204)


@router.delete(TOPIC + "/compactionThreshold", status_code=204, response_class=Response)
def remove_topic_threshold(
    name: TopicDep, policies: PoliciesDep, broker: BrokerDep, partitioned: PartitionedDep
) -> Response:
    _require_topic(name, broker, partitioned)
    policies.remove(Scope.topic_of(name), "compactionThreshold")
    return Response(status_code=204)


@router.get(NAMESPACE + "/compactionThreshold")
def get_namespace_threshold(tenant: str, namespace: str, policies: PoliciesDep) -> int | None:
    return policies.get(Scope.namespace_of(tenant, namespace)).compactionThreshold


@router.post(NAMESPACE + "/compactionThreshold", status_code=204, response_class=Response)
def set_namespace_threshold(
    tenant: str, namespace: str, policies: PoliciesDep, value: Annotated[Any, Body()]
) -> Response:
    policies.set(Scope.namespace_of(tenant, namespace), compactionThreshold=value)
    return Response(status_code=204)


@router.delete(NAMESPACE + "/compactionThreshold", status_code=204, response_class=Response)
def remove_namespace_threshold(tenant: str, namespace: str, policies: PoliciesDep) -> Response:
    policies.remove(Scope.namespace_of(tenant, namespace), "compactionThreshold")
    return Response(status_code=204)


@router.get(NAMESPACE + "/deduplication")
def get_namespace_deduplication(tenant: str, namespace: str, policies: PoliciesDep) -> bool | None:
    """Pulsar's producer deduplication for the namespace's topics (null: not set here)."""
    return policies.get(Scope.namespace_of(tenant, namespace)).deduplicationEnabled


@router.post(NAMESPACE + "/deduplication", status_code=204, response_class=Response)
def set_namespace_deduplication(
    tenant: str, namespace: str, policies: PoliciesDep, value: Annotated[Any, Body()]
) -> Response:
    policies.set(Scope.namespace_of(tenant, namespace), deduplicationEnabled=value)
    return Response(status_code=204)


@router.delete(NAMESPACE + "/deduplication", status_code=204, response_class=Response)
def remove_namespace_deduplication(tenant: str, namespace: str, policies: PoliciesDep) -> Response:
    policies.remove(Scope.namespace_of(tenant, namespace), "deduplicationEnabled")
    return Response(status_code=204)


@router.get(TOPIC + "/deduplicationEnabled")
def get_topic_deduplication(
    name: TopicDep,
    policies: PoliciesDep,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    applied: bool = False,
) -> bool | None:
    _require_topic(name, broker, partitioned)
    if applied:
        return policies.effective(name).deduplicationEnabled
    return policies.get(Scope.topic_of(name)).deduplicationEnabled


@router.post(TOPIC + "/deduplicationEnabled", status_code=204, response_class=Response)
def set_topic_deduplication(
    name: TopicDep,
    policies: PoliciesDep,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    value: Annotated[Any, Body()],
) -> Response:
    _require_topic(name, broker, partitioned)
    policies.set(Scope.topic_of(name), deduplicationEnabled=value)
    return Response(status_code=204)


@router.delete(TOPIC + "/deduplicationEnabled", status_code=204, response_class=Response)
def remove_topic_deduplication(
    name: TopicDep, policies: PoliciesDep, broker: BrokerDep, partitioned: PartitionedDep
) -> Response:
    _require_topic(name, broker, partitioned)
    policies.remove(Scope.topic_of(name), "deduplicationEnabled")
    return Response(status_code=204)


@router.get(TOPIC + "/compactionPolicy")
def get_topic_policy(
    name: TopicDep,
    policies: PoliciesDep,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    applied: bool = False,
) -> Policy:
    _require_topic(name, broker, partitioned)
    return policies.effective(name) if applied else policies.get(Scope.topic_of(name))


@router.post(TOPIC + "/compactionPolicy", response_model=Policy)
def set_topic_policy(
    name: TopicDep, policies: PoliciesDep, broker: BrokerDep, partitioned: PartitionedDep, body: PolicyBody
) -> Policy:
    _require_topic(name, broker, partitioned)
    return _update(policies, Scope.topic_of(name), body)


@router.delete(TOPIC + "/compactionPolicy", status_code=204, response_class=Response)
def remove_topic_policy(
    name: TopicDep, policies: PoliciesDep, broker: BrokerDep, partitioned: PartitionedDep
) -> Response:
    _require_topic(name, broker, partitioned)
    policies.remove(Scope.topic_of(name))
    return Response(status_code=204)


@router.get(NAMESPACE + "/compactionPolicy")
def get_namespace_policy(tenant: str, namespace: str, policies: PoliciesDep) -> Policy:
    return policies.get(Scope.namespace_of(tenant, namespace))


@router.post(NAMESPACE + "/compactionPolicy", response_model=Policy)
def set_namespace_policy(tenant: str, namespace: str, policies: PoliciesDep, body: PolicyBody) -> Policy:
    return _update(policies, Scope.namespace_of(tenant, namespace), body)


@router.delete(NAMESPACE + "/compactionPolicy", status_code=204, response_class=Response)
def remove_namespace_policy(tenant: str, namespace: str, policies: PoliciesDep) -> Response:
    policies.remove(Scope.namespace_of(tenant, namespace))
    return Response(status_code=204)


def _update(policies: PolicyStore, scope: Scope, body: dict[str, Any]) -> Policy:
    """Fields given are set; a field given as null is unset. Checked whole before any change."""
    to_set = {k: v for k, v in body.items() if v is not None}
    to_unset = [k for k, v in body.items() if v is None]
    for k in to_unset:
        if k not in FIELDS:
            raise InvalidInput(f"unknown policy field {k!r}")
    for k, v in to_set.items():
        if k not in FIELDS:
            raise InvalidInput(f"unknown policy field {k!r}")
        validate(k, v)
    policies.set(scope, **to_set)
    if to_unset:
        policies.remove(scope, *to_unset)
    return policies.get(scope)


def _require_topic(name: TopicName, broker: Broker, partitioned: PartitionedTopics) -> None:
    """404 unless ``name`` is a topic or a partitioned topic (whose policies its partitions take)."""
    try:
        broker.topic(name)
    except NotFound:
        if partitioned.get(name) is None:
            raise
