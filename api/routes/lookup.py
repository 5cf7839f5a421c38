"""Pulsar's topic lookup over HTTP: which instance serves a topic.

``GET /lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}`` answers Pulsar's ``LookupData``:
``brokerUrl`` (where the owner serves Pulsar's binary protocol, ``pulsar://host:port``; its
HTTP(S) URL when it does not listen for the protocol), ``brokerUrlTls`` (``pulsar+ssl://``)
when it serves the protocol over TLS, ``httpUrl`` (its REST URL), ``httpUrlTls`` when it serves
HTTPS (its TLS port, or the one port made HTTPS), ``nativeUrl`` (``brokerUrl``
again, the legacy name) and ``brokerUrlSsl`` (empty: Pulsar's broker sends it for older C++
clients, which fail a lookup without it). A Pulsar client given an ``http://`` service URL
asks the partitioned metadata (``api.routes.partitions``), then this, then connects to
``brokerUrl``. The answer is the binary protocol's ``LOOKUP``'s (``service.lookup``): the owner
with several instances, the advertised listener named by ``listenerName`` (or the
``X-Pulsar-ListenerName`` header) if one is. A topic that does not exist yet, in a namespace
that does, is created by the lookup where auto-creation is on (``service.lookup``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query
from fastapi.concurrency import run_in_threadpool

from api.deps import BrokerDep, CanLookup, PartitionedDep, TenantsDep, TopicDep
from api.schemas import ErrorOut, LookupOut
from service.lookup import lookup_topic

router = APIRouter(prefix="/lookup/v2/topic", tags=["lookup"])

LISTENER = "Name of an advertised listener (COMPACTOR_ADVERTISED_LISTENERS): its URL is answered"


@router.get(
    "/{domain}/{tenant}/{namespace}/{topic}",
    response_model=LookupOut,
    response_model_exclude_none=True,
    dependencies=[CanLookup],
    responses={
        307: {
            "description": "A listener is named and another instance owns the topic: the same "
            "lookup at the owner (Location), which knows its listeners",
            "model": ErrorOut,
        },
        404: {
            "description": "The namespace does not exist; the topic does not and auto-creation "
            "(COMPACTOR_ALLOW_AUTO_TOPIC_CREATION) is off; or the advertised listener named is not "
            "one of the service's"
        },
    },
)
async def lookup(
    # A non-persistent topic is served where it is asked for (service.lookup); any other
    # domain is a 422.
    domain: Literal["persistent", "non-persistent"],
    name: TopicDep,
    broker: BrokerDep,
    tenants: TenantsDep,
    partitioned: PartitionedDep,
    authoritative: bool = Query(False, description="Accepted as Pulsar's; ownership decides the answer"),
    listenerName: Annotated[str | None, Query(max_length=256, description=LISTENER)] = None,  # noqa: N803
    listener_header: Annotated[
        str | None, Header(alias="X-Pulsar-ListenerName", max_length=256, description=LISTENER)
    ] = None,
) -> LookupOut:
    found = await run_in_threadpool(
        lookup_topic,
        broker=broker,
        tenants=tenants,
        partitioned=partitioned,
        name=name,
        listener=listenerName or listener_header,
        persistent=domain == "persistent",
    )
    http_url = found.http_url
    broker_url = found.broker_url or http_url
    return LookupOut(
        brokerUrl=broker_url,
        brokerUrlTls=found.broker_url_tls,
        httpUrl=http_url,
        httpUrlTls=found.http_url_tls or (http_url if http_url.startswith("https://") else None),
        nativeUrl=broker_url,
    )
