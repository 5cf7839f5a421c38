"""Pulsar's topic lookup: which instance serves a topic.

``GET /lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}`` answers the owner's URLs. A
topic nobody holds (new, or its owner's lease lapsed) is taken by the instance asked, as a
Pulsar broker assigns an unowned bundle on lookup. There is no binary protocol here:
``brokerUrl`` is the owner's HTTP(S) URL too.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from api.deps import BrokerDep, CanLookup, TopicDep
from api.schemas import LookupOut

router = APIRouter(prefix="/lookup/v2/topic/persistent", tags=["lookup"])


@router.get("/{tenant}/{namespace}/{topic}", response_model=LookupOut, dependencies=[CanLookup])
async def lookup(name: TopicDep, broker: BrokerDep) -> LookupOut:
    url = await run_in_threadpool(broker.owner_url, name)
    return LookupOut(brokerUrl=url, httpUrl=url)
