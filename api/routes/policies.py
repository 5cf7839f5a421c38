"""Compaction thresholds at Pulsar's paths (topic and namespace level)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request, Response

from api.deps import BrokerDep, TopicDep
from service.policies import PolicyStore, Scope

router = APIRouter(tags=["policies"])


def get_policies(request: Request) -> PolicyStore:
    return request.app.state.policies  # type: ignore[no-any-return]


PoliciesDep = Annotated[PolicyStore, Depends(get_policies)]
TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
NAMESPACE = "/admin/v2/namespaces/{tenant}/{namespace}"


@router.get(TOPIC + "/compactionThreshold")
def get_topic_threshold(name: TopicDep, policies: PoliciesDep, broker: BrokerDep) -> int | None:
    broker.topic(name)
    return policies.get(Scope.topic_of(name)).compactionThreshold


@router.post(TOPIC + "/compactionThreshold", status_code=204, response_class=Response)
def set_topic_threshold(
    name: TopicDep, policies: PoliciesDep, broker: BrokerDep, value: Annotated[Any, Body()]
) -> Response:
    broker.topic(name)
    policies.set(Scope.topic_of(name), compactionThreshold=value)
    return Response(status_code=204)


@router.delete(TOPIC + "/compactionThreshold", status_code=204, response_class=Response)
def remove_topic_threshold(name: TopicDep, policies: PoliciesDep, broker: BrokerDep) -> Response:
    broker.topic(name)
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
