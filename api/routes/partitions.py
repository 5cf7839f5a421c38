"""Partitioned topics at Pulsar's admin paths (``service.partitions``): create, describe, grow
and delete one, list a namespace's, and their stats over every partition."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response
from pydantic import Discriminator, Tag

from api.deps import (
    AuthorizationDep,
    BrokerDep,
    CanListTopics,
    CanLookup,
    CompactionDep,
    PartitionedDep,
    PeersDep,
    SchemasDep,
    SubscriptionsDep,
    TenantAdmin,
    TenantsDep,
    TopicDep,
)
from api.peers import Peers
from api.routes.subscriptions import topic_stats_json
from api.routes.topics import internal_stats_json
from api.schemas import PartitionCount, PartitionedTopicMetadataIn, PartitionedTopicMetadataOut
from service.errors import NotOwner
from service.names import TopicName, check_part
from service.stats import internal_stats
from service.topics import Broker

router = APIRouter(prefix="/admin/v2/persistent", tags=["partitioned topics"])


# The partition count, a bare JSON integer as Pulsar's admin sends it.
Count = Annotated[int, Body(ge=1, le=2**31 - 1, description="The number of partitions")]
# What a create sends: the bare count (Java's admin without properties), or Pulsar's
# PartitionedTopicMetadata (Java's with properties, Go's pulsaradmin always), under either
# content type (application/json or Pulsar's application/vnd.partitioned-topic-metadata+json).
CreateBody = Annotated[
    Annotated[PartitionCount, Tag("count")] | Annotated[PartitionedTopicMetadataIn, Tag("metadata")],
    # An object is the metadata, anything else the count: a bad body's reason names one of them.
    Discriminator(lambda v: "metadata" if isinstance(v, dict | PartitionedTopicMetadataIn) else "count"),
    Body(description='The number of partitions, or {"partitions": n, "properties": {...}}'),
]
METADATA_MEDIA_TYPE = "application/vnd.partitioned-topic-metadata+json"


@router.get("/{tenant}/{namespace}/partitioned", response_model=list[str], dependencies=[CanListTopics])
def list_partitioned(
    tenant: str, namespace: str, partitioned: PartitionedDep, tenants: TenantsDep
) -> list[str]:
    """The namespace's partitioned topics (their partitions are in the topic list)."""
    tenant, namespace = check_part("tenant", tenant), check_part("namespace", namespace)
    tenants.require_namespace(tenant=tenant, namespace=namespace)
    return partitioned.names(tenant, namespace)


@router.put(
    "/{tenant}/{namespace}/{topic}/partitions",
    status_code=204,
    response_class=Response,
    dependencies=[TenantAdmin],
    openapi_extra={
        "requestBody": {
            "content": {
                METADATA_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/PartitionedTopicMetadataIn"}}
            }
        }
    },
)
def create_partitioned(name: TopicDep, partitioned: PartitionedDep, body: CreateBody) -> Response:
    """Create a partitioned topic and its partitions (409 when the name is taken), with the
    properties given (returned by ``GET .../partitions``)."""
    if isinstance(body, PartitionedTopicMetadataIn):
        partitioned.create(name, body.partitions, body.properties)
    else:
        partitioned.create(name, body)
    return Response(status_code=204)


@router.post(
    "/{tenant}/{namespace}/{topic}/partitions",
    status_code=204,
    response_class=Response,
    dependencies=[TenantAdmin],
)
def grow_partitioned(name: TopicDep, partitioned: PartitionedDep, n: Count) -> Response:
    """Raise the partition count (409 for a count not above today's: it never shrinks)."""
    partitioned.grow(name, n)
    return Response(status_code=204)


@router.get(
    "/{tenant}/{namespace}/{topic}/partitions",
    dependencies=[CanLookup],
    response_model=PartitionedTopicMetadataOut,
    response_model_exclude_none=True,
)
def get_partitions(
    name: TopicDep,
    partitioned: PartitionedDep,
    checkAllowAutoCreation: bool = Query(  # noqa: N803 - Pulsar's parameter name
        False,
        description="Accepted as Pulsar's; topics are auto-created non-partitioned, so it changes nothing",
    ),
    authoritative: bool = Query(False, description="Accepted as Pulsar's; changes nothing"),
) -> PartitionedTopicMetadataOut:
    """``{"partitions": N}``, with the ``properties`` it was created with if any; 0 for a plain
    topic or a name that is neither (as Pulsar). A Pulsar client given an ``http://`` service
    URL asks this before it looks a topic up."""
    found = partitioned.get(name)
    if found is None:
        return PartitionedTopicMetadataOut(partitions=0)
    props = dict(found.properties) if found.properties is not None else None
    return PartitionedTopicMetadataOut(partitions=found.partitions, properties=props)


@router.delete(
    "/{tenant}/{namespace}/{topic}/partitions",
    status_code=204,
    response_class=Response,
    dependencies=[TenantAdmin],
)
def delete_partitioned(
    name: TopicDep,
    partitioned: PartitionedDep,
    tenants: TenantsDep,
    schemas: SchemasDep,
    force: bool = Query(
        False, description="Accepted as Pulsar's: partitions are deleted with their consumers"
    ),
) -> Response:
    """Delete the partitioned topic and every partition, their subscriptions and files."""
    partitioned.delete(name)
    # Grants and the schema are the partitioned topic's (its partitions use them): they go too.
    tenants.forget_topic(name=name)
    schemas.delete(name)
    return Response(status_code=204)


@router.get("/{tenant}/{namespace}/{topic}/partitioned-stats", dependencies=[CanLookup])
def partitioned_stats(
    name: TopicDep,
    partitioned: PartitionedDep,
    broker: BrokerDep,
    subs: SubscriptionsDep,
    compaction: CompactionDep,
    peers: PeersDep,
    auth: AuthorizationDep,
) -> dict[str, Any]:
    """Every partition's stats (``partitions``, by partition name) and their sums."""
    found = partitioned.require(name)
    parts = {
        str(p): _anywhere(partial(topic_stats_json, p, broker, subs, compaction), p, "stats", peers, auth)
        for p in found.partition_names()
    }
    counted = [s for s in parts.values() if "error" not in s]
    return {
        "msgInCounter": sum(s["msgInCounter"] for s in counted),
        "bytesInCounter": sum(s["bytesInCounter"] for s in counted),
        "storageSize": sum(s["storageSize"] for s in counted),
        "metadata": {"partitions": found.partitions},
        "publishers": _publishers(counted),
        "subscriptions": _subscriptions(counted),
        "partitions": parts,
    }


def _publishers(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The partitions' producers, one per producer name (a partitioned producer has one on each
    partition, under one name, as Pulsar's merged stats show it once)."""
    seen: dict[str, dict[str, Any]] = {}
    for part in parts:
        for p in part.get("publishers", []):
            seen.setdefault(p["producerName"], p)
    return list(seen.values())


def _subscriptions(parts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The partitions' subscriptions by name: backlogs summed, every partition's consumers."""
    merged: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, sub in part.get("subscriptions", {}).items():
            into = merged.get(name)
            if into is None:
                merged[name] = {**sub, "consumers": list(sub.get("consumers", []))}
                continue
            for counter in ("msgBacklog", "backlogSize", "unackedMessages"):
                into[counter] = into.get(counter, 0) + sub.get(counter, 0)
            into["consumers"].extend(sub.get("consumers", []))
            into["type"] = into.get("type") or sub.get("type")
    for sub in merged.values():
        sub.pop("markDeletePosition", None)  # a partition's own
    return merged


@router.get("/{tenant}/{namespace}/{topic}/partitioned-internalStats", dependencies=[CanLookup])
def partitioned_internal_stats(
    name: TopicDep, partitioned: PartitionedDep, broker: BrokerDep, peers: PeersDep, auth: AuthorizationDep
) -> dict[str, Any]:
    found = partitioned.require(name)
    return {
        "metadata": {"partitions": found.partitions},
        "partitions": {
            str(p): _anywhere(partial(_internal, broker, p), p, "internalStats", peers, auth)
            for p in found.partition_names()
        },
    }


def _internal(broker: Broker, name: TopicName) -> dict[str, Any]:
    return internal_stats_json(internal_stats(broker, name))


def _anywhere(
    stats: Callable[[], dict[str, Any]], name: TopicName, action: str, peers: Peers, auth: str | None
) -> dict[str, Any]:
    """A partition's stats: this instance's, or with several instances, its owner's (asked on
    the client's behalf, with ``ownerUrl`` added); when the owner cannot be asked, only
    ``ownerUrl`` and the ``error``, and the sums leave the partition out."""
    try:
        return stats()
    except NotOwner as e:
        reply = peers.ask(e.url, "GET", name, action, auth)
        if reply.ok and isinstance(reply.body, dict):
            return {**reply.body, "ownerUrl": e.url}
        return {"ownerUrl": e.url, "error": reply.error}
