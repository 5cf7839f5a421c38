"""Topics created on first use, as Pulsar's ``allowAutoTopicCreation`` does: a producer or a
consumer naming a topic that does not exist, in a namespace that does, creates it."""

from __future__ import annotations

import contextlib

from service.errors import Conflict, NotFound
from service.managed_topic import ManagedTopic
from service.names import TopicName, partition_of
from service.partitions import PartitionedTopics
from service.tenants import TenantService
from service.topics import Broker


def topic_for_use(
    *,
    broker: Broker,
    tenants: TenantService,
    partitioned: PartitionedTopics,
    name: TopicName,
    create: bool,
) -> ManagedTopic:
    """The topic ``name``; when it does not exist and ``create`` is set, it is created (404 for
    a namespace that does not exist, and with ``create`` off for the topic). A partition of a
    partitioned topic is created on its first use whatever ``create`` says, as Pulsar's; a name
    the partitioned topics forbid (``PartitionedTopics.check_topic_name``) is refused."""
    try:
        return broker.topic(name)
    except NotFound:
        if partition_of(name) is None and not create:
            raise
    tenants.require_namespace(tenant=name.tenant, namespace=name.namespace)
    partitioned.check_topic_name(name)
    with contextlib.suppress(Conflict):  # another client created it meanwhile
        broker.create_topic(name)
    return broker.topic(name)
