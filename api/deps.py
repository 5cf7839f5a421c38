"""Request dependencies as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.names import TopicName
from service.topics import Broker


def get_broker(request: Request) -> Broker:
    return request.app.state.broker  # type: ignore[no-any-return]


def topic_name(tenant: str, namespace: str, topic: str) -> TopicName:
    """The topic a path names; 400 for a name that could not be a directory."""
    return TopicName.of(tenant, namespace, topic)


BrokerDep = Annotated[Broker, Depends(get_broker)]
TopicDep = Annotated[TopicName, Depends(topic_name)]
