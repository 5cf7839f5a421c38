"""Partitioned topics, as Pulsar's: ``persistent://t/n/x`` with N partitions is N ordinary
topics ``x-partition-0 .. x-partition-{N-1}`` plus one metadata row holding N.

Invariants kept here: a name is a plain topic or a partitioned topic, never both; a partition
name (``<base>-partition-<i>``) is a topic only as partition ``i`` of the partitioned topic
``base`` with more than ``i`` partitions; the partition count only grows.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from ledger.entry import Position, Record
from service import models
from service.clock import now_ms
from service.db import Database
from service.errors import Conflict, InvalidInput, NotFound, NotOwner
from service.names import PARTITION_SUFFIX, TopicName, partition, partition_of
from service.partition_routing import KeyRouter, RoundRobin
from service.tenants import TenantService
from service.topics import Broker

# Stores a partition's messages (by their indexes in the request) at the instance that owns it.
Forward = Callable[[TopicName, str, list[int]], list[Position]]


@dataclass(frozen=True)
class PartitionedTopic:
    name: TopicName
    partitions: int
    # What it was created with (Pulsar's PartitionedTopicMetadata.properties); None: none given.
    properties: Mapping[str, str] | None = None

    def partition_names(self) -> list[TopicName]:
        return [partition(self.name, i) for i in range(self.partitions)]


class PartitionedTopics:
    """The partitioned topics of every namespace, in the metadata database (every instance
    sees them); their partitions are the broker's topics."""

    def __init__(
        self,
        *,
        db: Database,
        broker: Broker,
        tenants: TenantService,
        max_partitions: int,
        route_key: KeyRouter,
    ) -> None:
        """``route_key(key, partitions)``: the partition of a keyed message produced here."""
        self.db = db
        self.broker = broker
        self.tenants = tenants
        self.max_partitions = max_partitions
        self._route_key = route_key
        self._round_robin = RoundRobin()

    # ------------------------------------------------------------------ reading

    def get(self, name: TopicName) -> PartitionedTopic | None:
        with self.db.session() as s:
            row = s.get(models.PartitionedTopic, (name.tenant, name.namespace, name.topic))
            if row is None:
                return None
            props = json.loads(row.properties) if row.properties is not None else None
            return PartitionedTopic(name, row.partitions, props)

    def require(self, name: TopicName) -> PartitionedTopic:
        found = self.get(name)
        if found is None:
            raise NotFound(f"partitioned topic {name} not found")
        return found

    def partitions(self, name: TopicName) -> int:
        """N for a partitioned topic, 0 for any other name (Pulsar's answer for a plain topic)."""
        found = self.get(name)
        return found.partitions if found is not None else 0

    def names(self, tenant: str, namespace: str) -> list[str]:
        with self.db.session() as s:
            names = s.scalars(
                select(models.PartitionedTopic.name).where(
                    models.PartitionedTopic.tenant == tenant, models.PartitionedTopic.namespace == namespace
                )
            ).all()
        return sorted(str(TopicName(tenant, namespace, n)) for n in names)

    # ------------------------------------------------------------------ rules

    def check_topic_name(self, name: TopicName) -> None:
        """Refuse a plain topic the partitioned topics forbid: one named as a partitioned topic,
        or as a partition that is not one (``Conflict``: the name is the partitions')."""
        if self.get(name) is not None:
            raise Conflict(
                f"{name} is a partitioned topic; its partitions are {name.topic}{PARTITION_SUFFIX}<i>"
            )
        parsed = partition_of(name)
        if parsed is None:
            return
        base, index = parsed
        found = self.get(base)
        if found is None:
            raise Conflict(
                f"{name.topic!r} is a partition's name, and {base} is not a partitioned topic: "
                f"a topic name may not end in {PARTITION_SUFFIX}<number>"
            )
        if index >= found.partitions:
            raise NotFound(f"{base} has {found.partitions} partitions; there is no partition {index}")

    def _check_count(self, name: TopicName, n: int) -> None:
        if not 0 < n <= self.max_partitions:
            raise InvalidInput(f"the number of partitions must be 1..{self.max_partitions}, not {n}")
        partition(name, n - 1)  # InvalidInput when the partitions' names would be too long

    # ------------------------------------------------------------------ producing

    def produce(
        self, topic: PartitionedTopic, records: Sequence[Record], forward: Forward | None = None
    ) -> tuple[list[Position], list[int]]:
        """Append ``records`` to the partitions the official client would send them to (a
        keyed message by ``route_key``, the others in turn: ``service.partition_routing``);
        each record's position and partition, in the order given. Every record is checked, and
        every partition's owner found, before any is written; the partitions are then written
        one after the other, so a failure of one partition's write leaves the messages of the
        partitions written before it stored. With several instances, the messages of a partition
        another instance owns are handed to ``forward(partition, owner URL, indexes)``, which
        stores them there (without it, ``NotOwner`` before anything is written)."""
        self.broker.check_records(records)
        n = topic.partitions
        name = str(topic.name)
        targets = [self._route_key(r.key, n) if r.key else self._round_robin.next(name, n) for r in records]
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(targets):
            groups.setdefault(p, []).append(i)
        owners: dict[int, str] = {}
        for p in groups:
            try:
                self.broker.topic(partition(topic.name, p))  # served here, or taken now
            except NotOwner as e:
                if forward is None:
                    raise
                owners[p] = e.url
        positions: list[Position] = [Position(-1, -1)] * len(records)
        for p, indexes in sorted(groups.items()):
            where = partition(topic.name, p)
            if p in owners:
                written = forward(where, owners[p], indexes)  # type: ignore[misc]
            else:
                written = self.broker.produce(where, [records[i] for i in indexes])
            for i, pos in zip(indexes, written, strict=True):
                positions[i] = pos
        return positions, targets

    # ------------------------------------------------------------------ changing

    def create(
        self, name: TopicName, n: int, properties: Mapping[str, str] | None = None
    ) -> PartitionedTopic:
        """Create a partitioned topic of ``n`` partitions, and its partitions (409 when the name
        is taken by a topic of either kind), keeping the ``properties`` given with it."""
        self._check_count(name, n)
        if partition_of(name) is not None:
            raise Conflict(
                f"{name.topic!r} is a partition's name; a partitioned topic may not end in -partition-<i>"
            )
        self.tenants.require_namespace(tenant=name.tenant, namespace=name.namespace)
        if self._plain_topic_exists(name):
            raise Conflict(f"{name} exists as a topic that is not partitioned")
        try:
            with self.db.session() as s:
                s.add(
                    models.PartitionedTopic(
                        tenant=name.tenant,
                        namespace=name.namespace,
                        name=name.topic,
                        partitions=n,
                        created_at=now_ms(),
                        properties=json.dumps(dict(properties)) if properties is not None else None,
                    )
                )
        except IntegrityError:
            raise Conflict(f"partitioned topic {name} already exists") from None
        created = PartitionedTopic(name, n, properties)
        self._create_partitions(created, 0)
        return created

    def grow(self, name: TopicName, n: int) -> PartitionedTopic:
        """Raise the partition count to ``n`` (it never shrinks, as Pulsar's)."""
        self._check_count(name, n)
        with self.db.session() as s:
            row = s.get(
                models.PartitionedTopic, (name.tenant, name.namespace, name.topic), with_for_update=True
            )
            if row is None:
                raise NotFound(f"partitioned topic {name} not found")
            before = row.partitions
            if n <= before:
                raise Conflict(f"{name} has {before} partitions: the count only grows (asked {n})")
            row.partitions = n
            props = json.loads(row.properties) if row.properties is not None else None
        grown = PartitionedTopic(name, n, props)
        self._create_partitions(grown, before)
        return grown

    def delete(self, name: TopicName) -> None:
        """Delete every partition (with its subscriptions and files), then the partitioned topic."""
        found = self.require(name)
        for p in found.partition_names():
            with contextlib.suppress(NotFound):  # deleted before, by hand
                self.broker.delete_topic(p)
        with self.db.session() as s:
            row = s.get(models.PartitionedTopic, (name.tenant, name.namespace, name.topic))
            if row is not None:
                s.delete(row)
        self.broker.deleted(name)

    def _create_partitions(self, topic: PartitionedTopic, start: int) -> None:
        for i in range(start, topic.partitions):
            with contextlib.suppress(Conflict):  # created by a client's first use meanwhile
                self.broker.create_topic(partition(topic.name, i))

    def _plain_topic_exists(self, name: TopicName) -> bool:
        with self.db.session() as s:
            found = s.scalar(
                select(models.Topic.id).where(
                    models.Topic.tenant == name.tenant,
                    models.Topic.namespace == name.namespace,
                    models.Topic.name == name.topic,
                )
            )
        return found is not None
