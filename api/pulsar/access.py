"""The producers of each topic on this instance and Pulsar's producer access modes.

- Shared (the default): any number of producers, unless an exclusive one holds the topic or
  waits for it (then ProducerBusy).
- Exclusive: the only producer, or refused at once with ProducerFenced.
- WaitForExclusive: queued (the client hears ``producer_ready=false``) until every other
  producer has gone, then granted.
- ExclusiveWithFencing: the producers there are closed (fenced) and this one takes the topic.

A producer name is unique on a topic (ProducerBusy), as in Pulsar. REST produce requests are not
producers with a session, so access modes bind the binary protocol's producers only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.errors import ProtocolError
from service.names import TopicName


class Holder(Protocol):
    """What the registry needs of a producer."""

    name: str
    mode: int

    def fence(self) -> None: ...


@dataclass
class _Topic:
    producers: list[Holder] = field(default_factory=list)
    waiting: deque[tuple[Holder, asyncio.Future[int]]] = field(default_factory=deque)
    epoch: int = 0

    @property
    def exclusive(self) -> bool:
        return any(p.mode != pb.Shared for p in self.producers)


class ProducerAccess:
    """Grants producers their access to a topic; one per listener (event loop thread only)."""

    def __init__(self) -> None:
        self._topics: dict[TopicName, _Topic] = {}

    def acquire(
        self, topic: TopicName, producer: Holder, *, epoch: int | None = None
    ) -> int | asyncio.Future[int]:
        """Register ``producer`` and return the topic epoch it holds; for a WaitForExclusive
        producer that must wait, a future of it instead (resolved when it is granted, cancelled
        when it gives up: ``release``). ``epoch`` is the one an exclusive producer held before
        it reconnected: older than the topic's, it was fenced, and stays so."""
        t = self._topics.setdefault(topic, _Topic())
        if epoch is not None and producer.mode != pb.Shared and epoch < t.epoch:
            raise ProtocolError(pb.ProducerFenced, f"producer {producer.name} was fenced off topic {topic}")
        if any(p.name == producer.name for p in t.producers):
            raise ProtocolError(
                pb.ProducerBusy, f"Producer with name '{producer.name}' is already connected to topic {topic}"
            )
        mode = producer.mode
        if mode == pb.Shared:
            if t.exclusive or t.waiting:
                raise ProtocolError(pb.ProducerBusy, f"Topic {topic} has an exclusive producer")
        elif mode == pb.Exclusive:
            if t.producers:
                raise ProtocolError(
                    pb.ProducerFenced, f"Topic {topic} has a producer; exclusive access refused"
                )
        elif mode == pb.ExclusiveWithFencing:
            for other in list(t.producers):
                other.fence()
            t.producers.clear()
        elif mode == pb.WaitForExclusive:
            if t.producers or t.waiting:
                granted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                t.waiting.append((producer, granted))
                return granted
        else:
            raise ProtocolError(pb.NotAllowedError, f"unknown producer access mode {mode}")
        return self._grant(t, producer)

    @staticmethod
    def _grant(t: _Topic, producer: Holder) -> int:
        if producer.mode != pb.Shared:
            t.epoch += 1  # a new exclusive holder: the ones before it are fenced off
        t.producers.append(producer)
        return t.epoch

    def has_producers(self, topic: TopicName) -> bool:
        """Whether a producer holds ``topic`` now (a consumer's schema checks on a busy topic)."""
        t = self._topics.get(topic)
        return t is not None and bool(t.producers)

    def release(self, topic: TopicName, producer: Holder) -> None:
        """The producer closed (or its connection did): the next waiter may get the topic."""
        t = self._topics.get(topic)
        if t is None:
            return
        if producer in t.producers:
            t.producers.remove(producer)
        self._drop_waiter(t, producer)
        if not t.producers and t.waiting:
            waiter, granted = t.waiting.popleft()
            if not granted.done():
                granted.set_result(self._grant(t, waiter))
        if not t.producers and not t.waiting:
            del self._topics[topic]

    @staticmethod
    def _drop_waiter(t: _Topic, producer: Holder) -> None:
        for entry in list(t.waiting):
            if entry[0] is producer:
                t.waiting.remove(entry)
                if not entry[1].done():
                    entry[1].cancel()
