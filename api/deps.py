"""Request dependencies as ``Annotated`` aliases, and the authorization rule of each route."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.auth import require
from api.peers import Peers
from service.authorization import Rule
from service.backlog_quotas import BacklogQuotaStore
from service.compaction import CompactionService
from service.names import TopicName
from service.non_persistent import NonPersistentTopics
from service.partitions import PartitionedTopics
from service.policies import PolicyStore
from service.schemas import SchemaRegistry
from service.subscription_service import SubscriptionService
from service.tenants import TenantService
from service.topics import Broker


async def get_broker(request: Request) -> Broker:
    return request.app.state.broker  # type: ignore[no-any-return]


async def get_tenants(request: Request) -> TenantService:
    return request.app.state.tenants  # type: ignore[no-any-return]


async def get_schemas(request: Request) -> SchemaRegistry:
    return request.app.state.schemas  # type: ignore[no-any-return]


async def get_partitioned(request: Request) -> PartitionedTopics:
    return request.app.state.partitioned  # type: ignore[no-any-return]


async def get_peers(request: Request) -> Peers:
    return request.app.state.peers  # type: ignore[no-any-return]


async def get_policies(request: Request) -> PolicyStore:
    return request.app.state.policies  # type: ignore[no-any-return]


async def get_quotas(request: Request) -> BacklogQuotaStore:
    return request.app.state.quotas  # type: ignore[no-any-return]


async def get_subscriptions(request: Request) -> SubscriptionService:
    return request.app.state.subscriptions  # type: ignore[no-any-return]


async def get_non_persistent(request: Request) -> NonPersistentTopics:
    return request.app.state.non_persistent  # type: ignore[no-any-return]


async def get_compaction(request: Request) -> CompactionService:
    return request.app.state.compaction  # type: ignore[no-any-return]


async def authorization(request: Request) -> str | None:
    """The request's ``Authorization`` header, for a request made on the client's behalf."""
    return request.headers.get("authorization")


async def topic_name(tenant: str, namespace: str, topic: str) -> TopicName:
    """The topic a path names; 400 for a name that could not be a directory.

    Dependencies that do no I/O are ``async``: FastAPI runs a plain ``def`` dependency in
    the thread pool, a hand-over that costs more than the work on every request."""
    return TopicName.of(tenant, namespace, topic)


BrokerDep = Annotated[Broker, Depends(get_broker)]
TenantsDep = Annotated[TenantService, Depends(get_tenants)]
TopicDep = Annotated[TopicName, Depends(topic_name)]
SchemasDep = Annotated[SchemaRegistry, Depends(get_schemas)]
PartitionedDep = Annotated[PartitionedTopics, Depends(get_partitioned)]
PeersDep = Annotated[Peers, Depends(get_peers)]
PoliciesDep = Annotated[PolicyStore, Depends(get_policies)]
QuotasDep = Annotated[BacklogQuotaStore, Depends(get_quotas)]
SubscriptionsDep = Annotated[SubscriptionService, Depends(get_subscriptions)]
CompactionDep = Annotated[CompactionService, Depends(get_compaction)]
NonPersistentDep = Annotated[NonPersistentTopics, Depends(get_non_persistent)]
AuthorizationDep = Annotated[str | None, Depends(authorization)]

# A route declares what it needs with ``dependencies=[...]`` (or its router does); see
# service.authorization for the rules. tests/api/test_routes_authorization.py fails on a route
# with none that is not on its list of open routes.
Superuser = Depends(require(Rule.SUPERUSER))
TenantAdmin = Depends(require(Rule.TENANT_ADMIN))
CanProduce = Depends(require(Rule.PRODUCE))
CanConsume = Depends(require(Rule.CONSUME))
CanLookup = Depends(require(Rule.PRODUCE_OR_CONSUME))
CanListTopics = Depends(require(Rule.NAMESPACE_PRODUCE_OR_CONSUME))
Authenticated = Depends(require(Rule.AUTHENTICATED))
