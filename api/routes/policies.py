"""Compaction policies: thresholds at Pulsar's paths, and the whole policy document, at topic
and namespace level; Pulsar's deduplication switch and schema policies (compatibility strategy,
auto-update, validation) at its paths. ``?applied=true`` on a topic's GET gives the effective
value (topic over namespace over the service default), as Pulsar's ``applied`` flag does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from api.deps import BrokerDep, PartitionedDep, PoliciesDep, TenantAdmin, TenantsDep, TopicDep
from service.errors import InvalidInput, NotFound
from service.names import TopicName
from service.partitions import PartitionedTopics
from service.policies import FIELDS, Policy, PolicyStore, Scope, validate
from service.topics import Broker

# Policies, read or changed, are a tenant admin's.
router = APIRouter(tags=["policies"], dependencies=[TenantAdmin])


PolicyBody = Annotated[dict[str, Any], Body()]
TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
NAMESPACE = "/admin/v2/namespaces/{tenant}/{namespace}"


def _topic_field(field: str, path: str, noun: str, kind: Any, set_with: tuple[str, ...] = ("POST",)) -> None:
    """GET (``?applied=true``: the effective value), POST (or the methods ``set_with``) and
    DELETE of one policy field of a topic at ``TOPIC + path``, as the routes ``get_topic_{noun}``,
    ``set_topic_{noun}`` and ``remove_topic_{noun}``; the value is a ``kind``."""

    # No docstrings below: FastAPI would take them for the routes' descriptions.
    def get(
        name: TopicDep,
        policies: PoliciesDep,
        broker: BrokerDep,
        partitioned: PartitionedDep,
        applied: bool = False,
    ) -> Any:
        _require_topic(name, broker, partitioned)
        if applied:
            return getattr(policies.effective(name), field)
        return getattr(policies.get(Scope.topic_of(name)), field)

    def set_(
        name: TopicDep,
        policies: PoliciesDep,
        broker: BrokerDep,
        partitioned: PartitionedDep,
        value: Annotated[Any, Body()],
    ) -> Response:
        _require_topic(name, broker, partitioned)
        policies.set(Scope.topic_of(name), **{field: value})
        return Response(status_code=204)

    def remove(
        name: TopicDep, policies: PoliciesDep, broker: BrokerDep, partitioned: PartitionedDep
    ) -> Response:
        _require_topic(name, broker, partitioned)
        policies.remove(Scope.topic_of(name), field)
        return Response(status_code=204)

    _name(get, set_, remove, f"topic_{noun}")
    router.get(TOPIC + path, response_model=kind)(get)
    for method in set_with:  # a route per method: each its own operation id
        router.api_route(TOPIC + path, methods=[method], status_code=204, response_class=Response)(set_)
    router.delete(TOPIC + path, status_code=204, response_class=Response)(remove)


def _namespace_field(field: str, path: str, noun: str, kind: Any, about: str | None = None) -> None:
    """GET, POST and DELETE of one policy field of a namespace at ``NAMESPACE + path``, as the
    routes ``get_namespace_{noun}``, ``set_namespace_{noun}`` and ``remove_namespace_{noun}``;
    ``about`` describes the GET."""

    def get(tenant: str, namespace: str, policies: PoliciesDep) -> Any:
        return getattr(policies.get(Scope.namespace_of(tenant, namespace)), field)

    def set_(tenant: str, namespace: str, policies: PoliciesDep, value: Annotated[Any, Body()]) -> Response:
        policies.set(Scope.namespace_of(tenant, namespace), **{field: value})
        return Response(status_code=204)

    def remove(tenant: str, namespace: str, policies: PoliciesDep) -> Response:
        policies.remove(Scope.namespace_of(tenant, namespace), field)
        return Response(status_code=204)

    _name(get, set_, remove, f"namespace_{noun}")
    router.get(NAMESPACE + path, response_model=kind, description=about)(get)
    router.post(NAMESPACE + path, status_code=204, response_class=Response)(set_)
    router.delete(NAMESPACE + path, status_code=204, response_class=Response)(remove)


def _name(get: Callable[..., Any], set_: Callable[..., Any], remove: Callable[..., Any], what: str) -> None:
    """Name the routes as if each were written out: the OpenAPI document's operation ids and
    the audit log's actions are their names (``get_topic_threshold``, ...)."""
    for verb, fn in (("get", get), ("set", set_), ("remove", remove)):
        fn.__name__ = fn.__qualname__ = f"{verb}_{what}"


_topic_field("compactionThreshold", "/compactionThreshold", "threshold", int | None)
_namespace_field("compactionThreshold", "/compactionThreshold", "threshold", int | None)
_namespace_field(
    "deduplicationEnabled",
    "/deduplication",
    "deduplication",
    bool | None,
    about="Pulsar's producer deduplication for the namespace's topics (null: not set here).",
)
_topic_field("deduplicationEnabled", "/deduplicationEnabled", "deduplication", bool | None)
# Pulsar's admin sets a topic's strategy with PUT; POST as the service's other topic policies.
_topic_field(
    "schemaCompatibilityStrategy",
    "/schemaCompatibilityStrategy",
    "schema_compatibility",
    str | None,
    ("PUT", "POST"),
)
_topic_field("schemaValidationEnforced", "/schemaValidationEnforced", "schema_validation", bool | None)
_namespace_field(
    "schemaValidationEnforced",
    "/schemaValidationEnforced",
    "schema_validation",
    bool | None,
    about="Refuse producers without a schema on the namespace's topics that have one (null: not set here).",
)


@router.get(NAMESPACE + "/schemaCompatibilityStrategy", response_model=str)
def get_namespace_schema_compatibility(
    tenant: str, namespace: str, policies: PoliciesDep, tenants: TenantsDep
) -> str:
    """The namespace's schema compatibility strategy; ``UNDEFINED``: not set here (its topics
    take the service's, ``COMPACTOR_SCHEMA_COMPATIBILITY_STRATEGY``), as Pulsar answers."""
    tenants.require_namespace(tenant=tenant, namespace=namespace)
    return policies.get(Scope.namespace_of(tenant, namespace)).schemaCompatibilityStrategy or "UNDEFINED"


@router.put(NAMESPACE + "/schemaCompatibilityStrategy", status_code=204, response_class=Response)
def set_namespace_schema_compatibility(
    tenant: str, namespace: str, policies: PoliciesDep, tenants: TenantsDep, value: Annotated[Any, Body()]
) -> Response:
    """Set it (``UNDEFINED``: unset)."""
    tenants.require_namespace(tenant=tenant, namespace=namespace)
    policies.set(Scope.namespace_of(tenant, namespace), schemaCompatibilityStrategy=value)
    return Response(status_code=204)


@router.get(NAMESPACE + "/isAllowAutoUpdateSchema", response_model=bool)
def get_namespace_auto_update_schema(
    tenant: str, namespace: str, policies: PoliciesDep, tenants: TenantsDep
) -> bool:
    """Whether producers may add schema versions to the namespace's topics: the namespace's
    setting, else the service's (``COMPACTOR_IS_ALLOW_AUTO_UPDATE_SCHEMA_ENABLED``)."""
    tenants.require_namespace(tenant=tenant, namespace=namespace)
    value = policies.get(Scope.namespace_of(tenant, namespace)).isAllowAutoUpdateSchema
    return value if value is not None else policies.settings.is_allow_auto_update_schema_enabled


@router.post(NAMESPACE + "/isAllowAutoUpdateSchema", status_code=204, response_class=Response)
def set_namespace_auto_update_schema(
    tenant: str, namespace: str, policies: PoliciesDep, tenants: TenantsDep, value: Annotated[Any, Body()]
) -> Response:
    tenants.require_namespace(tenant=tenant, namespace=namespace)
    policies.set(Scope.namespace_of(tenant, namespace), isAllowAutoUpdateSchema=value)
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
