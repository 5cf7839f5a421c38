"""Partitioned topics' rules: names, counts, growth, deletion, and the auto-creation of a
partition on its first use."""

from __future__ import annotations

import pytest

from api.client.routing import key_partition
from service.auto_topics import topic_for_use
from service.db import Database
from service.errors import Conflict, InvalidInput, NotFound
from service.names import TopicName, partition, partition_of
from service.partitions import PartitionedTopics
from service.policies import PolicyStore, Scope
from service.settings import Settings
from service.tenants import TenantService
from service.topics import Broker

ORDERS = TopicName("public", "default", "orders")


@pytest.fixture
def partitioned(broker: Broker, db: Database) -> PartitionedTopics:
    tenants = TenantService(db=db, topics_of=broker.list_topics)
    return PartitionedTopics(db=db, broker=broker, tenants=tenants, max_partitions=8, route_key=key_partition)


def test_partition_names_round_trip() -> None:
    assert str(partition(ORDERS, 3)) == "persistent://public/default/orders-partition-3"
    assert partition_of(partition(ORDERS, 3)) == (ORDERS, 3)
    assert partition_of(ORDERS) is None
    # Not a partition's name: no number, a leading zero, a sign.
    for topic in ("orders-partition-", "orders-partition-01", "orders-partition--1", "-partition-1x"):
        assert partition_of(TopicName("public", "default", topic)) is None


def test_create_makes_every_partition_and_grow_adds_the_new_ones(
    partitioned: PartitionedTopics, broker: Broker
) -> None:
    partitioned.create(ORDERS, 3)
    assert partitioned.partitions(ORDERS) == 3
    assert broker.list_topics("public", "default") == [str(partition(ORDERS, i)) for i in range(3)]
    partitioned.grow(ORDERS, 5)
    assert partitioned.partitions(ORDERS) == 5
    assert len(broker.list_topics("public", "default")) == 5
    assert partitioned.names("public", "default") == [str(ORDERS)]


def test_refusals_change_nothing(partitioned: PartitionedTopics, broker: Broker) -> None:
    partitioned.create(ORDERS, 2)
    plain = TopicName("public", "default", "plain")
    broker.create_topic(plain)
    refusals = [
        (lambda: partitioned.create(ORDERS, 4), Conflict),
        (lambda: partitioned.create(plain, 4), Conflict),
        (lambda: partitioned.create(TopicName("public", "default", "x"), 0), InvalidInput),
        (lambda: partitioned.create(TopicName("public", "default", "x"), 9), InvalidInput),  # above the limit
        (lambda: partitioned.create(partition(plain, 1), 2), Conflict),
        (
            lambda: partitioned.create(TopicName("public", "default", "x" * 125), 2),
            InvalidInput,
        ),  # names too long
        (lambda: partitioned.create(TopicName("public", "nope", "x"), 2), NotFound),
        (lambda: partitioned.grow(ORDERS, 2), Conflict),
        (lambda: partitioned.grow(ORDERS, 1), Conflict),
        (lambda: partitioned.grow(plain, 3), NotFound),
        (lambda: partitioned.delete(plain), NotFound),
        (lambda: partitioned.check_topic_name(ORDERS), Conflict),
        (lambda: partitioned.check_topic_name(partition(ORDERS, 2)), NotFound),
        (lambda: partitioned.check_topic_name(partition(plain, 0)), Conflict),
    ]
    before = (broker.list_topics("public", "default"), partitioned.names("public", "default"))
    for call, error in refusals:
        with pytest.raises(error):
            call()
    assert (broker.list_topics("public", "default"), partitioned.names("public", "default")) == before
    assert partitioned.partitions(ORDERS) == 2
    partitioned.check_topic_name(partition(ORDERS, 1))  # a partition that is one


def test_a_partition_is_created_on_first_use_even_without_auto_creation(
    partitioned: PartitionedTopics, broker: Broker, db: Database
) -> None:
    partitioned.create(ORDERS, 2)
    broker.delete_topic(partition(ORDERS, 1))  # as if never used yet
    tenants = TenantService(db=db, topics_of=broker.list_topics)
    topic = topic_for_use(
        broker=broker, tenants=tenants, partitioned=partitioned, name=partition(ORDERS, 1), create=False
    )
    assert topic.name == partition(ORDERS, 1)
    with pytest.raises(NotFound):
        topic_for_use(
            broker=broker, tenants=tenants, partitioned=partitioned, name=partition(ORDERS, 2), create=True
        )


def test_delete_removes_every_partition(partitioned: PartitionedTopics, broker: Broker) -> None:
    partitioned.create(ORDERS, 3)
    partitioned.delete(ORDERS)
    assert partitioned.partitions(ORDERS) == 0
    assert broker.list_topics("public", "default") == []
    partitioned.create(ORDERS, 1)  # the name is free again


def test_a_policy_set_on_the_partitioned_topic_applies_to_its_partitions(
    partitioned: PartitionedTopics, db: Database, settings: Settings
) -> None:
    partitioned.create(ORDERS, 2)
    policies = PolicyStore(db=db, settings=settings)
    policies.set(Scope.namespace_of("public", "default"), compactionThreshold=1_000, retainNullKey=True)
    policies.set(Scope.topic_of(ORDERS), compactionThreshold=5_000)
    first, second = partition(ORDERS, 0), partition(ORDERS, 1)
    policies.set(Scope.topic_of(second), compactionThreshold=7_000)  # a partition's own wins
    assert policies.effective(first).compactionThreshold == 5_000
    assert policies.effective(first).retainNullKey is True  # the namespace's, under both
    assert policies.effective(second).compactionThreshold == 7_000
    assert policies.applied(first)["compactionThreshold"] == (5_000, "partitioned topic")
    assert policies.effective(TopicName("public", "default", "plain")).compactionThreshold == 1_000
