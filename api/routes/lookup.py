"""Pulsar's topic lookup: which instance serves a topic.

``GET /lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}`` answers the owner's URLs. A
topic nobody holds (new, or its owner's lease lapsed) is taken by the instance asked, as a
Pulsar broker assigns an unowned bundle on lookup. ``brokerUrl`` is where the owner serves
Pulsar's binary protocol (``pulsar://host:port``; its HTTP(S) URL when it does not listen for the
protocol), ``httpUrl`` its REST URL: a Pulsar client given an ``http://`` service URL looks topics
up here and connects to ``brokerUrl``.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from api.deps import BrokerDep, CanLookup, TopicDep
from api.schemas import LookupOut

router = APIRouter(prefix="/lookup/v2/topic/persistent", tags=["lookup"])


@router.get("/{tenant}/{namespace}/{topic}", response_model=LookupOut, dependencies=[CanLookup])
async def lookup(name: TopicDep, broker: BrokerDep) -> LookupOut:
    url, binary = await run_in_threadpool(broker.owner_urls, name)
    return LookupOut(brokerUrl=binary or url, httpUrl=url)
