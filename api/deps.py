"""Request dependencies as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.names import TopicName
from service.topics import Broker


async def get_broker(request: Request) -> Broker:
    return request.app.state.broker  # type: ignore[no-any-return]


async def topic_name(tenant: str, namespace: str, topic: str) -> TopicName:
    """The topic a path names; 400 for a name that could not be a directory.

    Dependencies that do no I/O are ``async``: FastAPI runs a plain ``def`` dependency in
    the thread pool, a hand-over that costs more than the work on every request."""
    return TopicName.of(tenant, namespace, topic)


BrokerDep = Annotated[Broker, Depends(get_broker)]
TopicDep = Annotated[TopicName, Depends(topic_name)]
