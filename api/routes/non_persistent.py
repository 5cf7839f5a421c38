"""Non-persistent topics at Pulsar's admin paths (``/admin/v2/non-persistent/...``): the
namespace's list, a topic's stats and internal stats, its partitioned metadata (always 0: they
are never partitioned here), and a clear 405 for a compaction. Any other path under the
domain is answered by ``api.routes.fallback`` (405: served over Pulsar's binary protocol only).
A 405 names in ``Allow`` the methods the path's documented routes serve.

The routes are ``async``: they read ``service.non_persistent`` on the event loop that serves
the binary protocol, which is where it changes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import CanListTopics, CanLookup, NonPersistentDep, TenantAdmin, TenantsDep, TopicDep
from api.routes.subscriptions import client_json
from api.schemas import ErrorOut
from service.errors import NotAllowed
from service.names import check_part
from service.non_persistent import Subscription, Topic, full_name

router = APIRouter(prefix="/admin/v2/non-persistent", tags=["non-persistent topics"])

NOT_LOADED: dict[int | str, dict[str, Any]] = {
    404: {"description": "The topic is not served now (no producer or consumer)", "model": ErrorOut}
}


@router.get(
    "/{tenant}/{namespace}",
    response_model=list[str],
    dependencies=[CanListTopics],
    responses={404: {"description": "No such namespace", "model": ErrorOut}},
)
async def list_topics(
    tenant: str, namespace: str, tenants: TenantsDep, topics: NonPersistentDep
) -> list[str]:
    """The namespace's non-persistent topics served now (Pulsar's list of loaded ones)."""
    tenant, namespace = check_part("tenant", tenant), check_part("namespace", namespace)
    await run_in_threadpool(tenants.require_namespace, tenant=tenant, namespace=namespace)
    return topics.list(tenant, namespace)


@router.get(
    "/{tenant}/{namespace}/partitioned",
    response_model=list[str],
    dependencies=[CanListTopics],
    responses={404: {"description": "No such namespace", "model": ErrorOut}},
)
async def list_partitioned(tenant: str, namespace: str, tenants: TenantsDep) -> list[str]:
    """The namespace's partitioned non-persistent topics: none (a non-persistent topic is never
    partitioned here). Pulsar's admin clients ask it beside the persistent list."""
    tenant, namespace = check_part("tenant", tenant), check_part("namespace", namespace)
    await run_in_threadpool(tenants.require_namespace, tenant=tenant, namespace=namespace)
    return []


@router.get("/{tenant}/{namespace}/{topic}/stats", dependencies=[CanLookup], responses=NOT_LOADED)
async def topic_stats(name: TopicDep, topics: NonPersistentDep) -> dict[str, Any]:
    """Pulsar's ``NonPersistentTopicStats``: rates (per second, over the last minute), counters,
    publishers, and per subscription its consumers and what it dropped (``msgDropRate``, and
    this service's ``msgDropCount``: every message dropped since the subscription was made)."""
    return stats_json(topics.get(name))


@router.get("/{tenant}/{namespace}/{topic}/internalStats", dependencies=[CanLookup], responses=NOT_LOADED)
async def internal_stats(name: TopicDep, topics: NonPersistentDep) -> dict[str, Any]:
    """As Pulsar's for a non-persistent topic: the messages added, and a cursor per subscription
    with nothing in it (there is no ledger)."""
    topic = topics.get(name)
    return {
        "entriesAddedCounter": topic.msg_in.total,
        "numberOfEntries": 0,
        "totalSize": 0,
        "ledgers": [],
        "cursors": {s: {} for s in topic.subscriptions},
    }


@router.get("/{tenant}/{namespace}/{topic}/partitions", dependencies=[CanLookup])
async def partitions(
    name: TopicDep,
    checkAllowAutoCreation: bool = Query(False, description="Accepted as Pulsar's; changes nothing"),  # noqa: N803
    authoritative: bool = Query(False, description="Accepted as Pulsar's; changes nothing"),
) -> dict[str, int]:
    """Partitioned metadata, which a client given an ``http://`` URL asks first: 0, as
    non-persistent topics are never partitioned here."""
    return {"partitions": 0}


# The compaction paths only ever refuse: kept out of the OpenAPI document (as the fallbacks
# are), with the persistent paths' permission rules, and in the guide (docs/rest-api.md).
@router.put(
    "/{tenant}/{namespace}/{topic}/compaction",
    status_code=204,
    response_class=Response,
    dependencies=[TenantAdmin],
    include_in_schema=False,
)
async def compact(name: TopicDep) -> Response:
    raise NotAllowed(
        f"Compaction is not allowed on a non-persistent topic ({full_name(name)}): it stores nothing"
    )


@router.get("/{tenant}/{namespace}/{topic}/compaction", dependencies=[CanLookup], include_in_schema=False)
async def compaction_status(name: TopicDep) -> dict[str, str]:
    raise NotAllowed(f"A non-persistent topic ({full_name(name)}) is never compacted")


def stats_json(topic: Topic) -> dict[str, Any]:
    subs = {name: _subscription_json(s) for name, s in topic.subscriptions.items()}
    msg_out = topic.msg_out_before + sum(s["msgOutCounter"] for s in subs.values())
    bytes_out = topic.bytes_out_before + sum(s["bytesOutCounter"] for s in subs.values())
    rate_in = topic.msg_in.per_second()
    return {
        "msgRateIn": rate_in,
        "msgThroughputIn": topic.bytes_in.per_second(),
        "msgRateOut": sum(s["msgRateOut"] for s in subs.values()),
        "msgThroughputOut": sum(s["msgThroughputOut"] for s in subs.values()),
        "averageMsgSize": topic.bytes_in.per_second() / rate_in if rate_in else 0.0,
        "msgInCounter": topic.msg_in.total,
        "bytesInCounter": topic.bytes_in.total,
        "msgOutCounter": msg_out,
        "bytesOutCounter": bytes_out,
        "storageSize": 0,
        "msgDropRate": 0.0,  # producers' drops: a SEND here is never refused for load
        "publishers": [
            {
                "accessMode": "Shared",
                "producerId": p.producer_id,
                "producerName": p.name,
                "msgRateIn": p.msg_in.per_second(),
                "msgThroughputIn": p.bytes_in.per_second(),
                "msgDropRate": 0.0,
                **client_json(p.client),
            }
            for p in topic.producers
        ],
        "subscriptions": subs,
        "replication": {},
    }


def _subscription_json(s: Subscription) -> dict[str, Any]:
    consumers: list[dict[str, Any]] = [
        {
            "consumerName": c.name,
            **client_json(c.client),
            "priorityLevel": c.priority_level,
            "availablePermits": max(c.sink.permits, 0),
            "msgRateOut": c.msg_out.per_second(),
            "msgThroughputOut": c.bytes_out.per_second(),
            "msgOutCounter": c.msg_out.total,
            "bytesOutCounter": c.bytes_out.total,
        }
        for c in s.consumers
    ]
    return {
        "type": s.type or "None",
        "isDurable": s.durable,
        "msgBacklog": 0,
        "msgRateOut": sum(c["msgRateOut"] for c in consumers),
        "msgThroughputOut": sum(c["msgThroughputOut"] for c in consumers),
        "msgOutCounter": s.msg_out_before + sum(c["msgOutCounter"] for c in consumers),
        "bytesOutCounter": s.bytes_out_before + sum(c["bytesOutCounter"] for c in consumers),
        "msgDropRate": s.dropped.per_second(),
        "msgDropCount": s.dropped.total,
        "consumers": consumers,
    }
