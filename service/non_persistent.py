"""Pulsar's non-persistent topics (``non-persistent://t/n/x``): held in memory only, a message
sent goes to the consumers connected now and is stored nowhere (no write-ahead log, no ledger,
no metadata row), as Pulsar's ``NonPersistentTopic`` and its dispatchers do:

- Exclusive and Failover (``NonPersistentDispatcherSingleActiveConsumer``): the active consumer
  gets it if it has a permit and its connection keeps up, else it is dropped. Failover's active
  consumer is the first by priority level and name (attach order breaks ties), the partition's
  index along that order for a partition.
- Shared (``NonPersistentDispatcherMultipleConsumers``): the next consumer, round robin among
  those of the best priority level that have a permit and keep up; none: dropped.
- Key_Shared (``NonPersistentStickyKeyDispatcherMultipleConsumers``): the consumer whose hash
  range holds the message's sticky key (``service.dispatchers``' selector); dropped when that
  one has no permit.

A dropped message is counted, per subscription (Pulsar's ``msgDropRate``). Nothing is
acknowledged, redelivered or replayed: a consumer's acks are no-ops, as Pulsar's.

A topic lives here while a producer or consumer is attached (Pulsar's broker unloads an
inactive one); its durable subscriptions go with it. Everything runs on the event loop that
serves the binary protocol (the REST stats routes read it there too), so nothing here locks.
The messages are opaque: what a consumer is sent is the binary protocol's business
(``Sink``), and a message's sticky key is read by the protocol's edge.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from service.dispatchers import HashRangeAutoSplitSelector, sticky_hash
from service.errors import Conflict, NotAllowed, NotFound
from service.names import TopicName
from service.publishers import ClientInfo
from service.subscription_types import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED

PREFIX = "non-persistent://"

#: Over how many seconds the rates in stats are averaged (Pulsar's stats period is a minute).
RATE_WINDOW_S = 60


def is_non_persistent(topic: str) -> bool:
    """Whether a client's topic name is in the ``non-persistent`` domain."""
    return topic.startswith(PREFIX)


def parse(text: str) -> TopicName:
    """The parts of ``non-persistent://t/n/x`` (``InvalidInput`` for a malformed name)."""
    return TopicName.parse("persistent://" + text.removeprefix(PREFIX))


def full_name(name: TopicName) -> str:
    return f"{PREFIX}{name.tenant}/{name.namespace}/{name.topic}"


class Rate:
    """Events per second over the last :data:`RATE_WINDOW_S` seconds, in one-second buckets,
    and the total ever counted."""

    __slots__ = ("_buckets", "total")

    def __init__(self) -> None:
        self._buckets: deque[list[int]] = deque()  # [second, count], oldest first
        self.total = 0

    def add(self, n: int) -> None:
        self.total += n
        now = int(time.monotonic())
        if self._buckets and self._buckets[-1][0] == now:
            self._buckets[-1][1] += n
            return
        self._buckets.append([now, n])
        while self._buckets[0][0] <= now - RATE_WINDOW_S:
            self._buckets.popleft()

    def per_second(self) -> float:
        since = int(time.monotonic()) - RATE_WINDOW_S
        return sum(n for second, n in self._buckets if second > since) / RATE_WINDOW_S


@dataclass(frozen=True, slots=True)
class Message:
    """One SEND as the consumers are sent it: its metadata and payload as the producer sent
    them (``count`` messages: a batch's members), and its sticky key (None: it has none)."""

    metadata: bytes
    payload: bytes
    count: int
    sticky_key: bytes | None

    @property
    def size(self) -> int:
        return len(self.metadata) + len(self.payload)


class Sink(Protocol):
    """A consumer as dispatch sees it: the binary protocol's consumer implements it."""

    permits: int

    def writable(self) -> bool:
        """Whether its connection keeps up (Pulsar's ``isWritable``)."""

    def send(self, message: Message) -> None:
        """Send ``message`` now, spending ``message.count`` permits."""


_seq = itertools.count()


@dataclass(eq=False)
class Consumer:
    """A consumer attached to a subscription of a non-persistent topic."""

    name: str
    priority_level: int
    sink: Sink
    client: ClientInfo = field(default_factory=ClientInfo)  # for stats
    seq: int = field(default_factory=lambda: next(_seq))
    msg_out: Rate = field(default_factory=Rate)
    bytes_out: Rate = field(default_factory=Rate)

    def available(self) -> bool:
        return self.sink.permits > 0 and self.sink.writable()


@dataclass(eq=False)
class Producer:
    """A producer attached to a non-persistent topic (for its stats)."""

    name: str
    producer_id: int
    client: ClientInfo = field(default_factory=ClientInfo)  # for stats
    msg_in: Rate = field(default_factory=Rate)
    bytes_in: Rate = field(default_factory=Rate)


class Subscription:
    """A subscription of a non-persistent topic: its consumers and how it dispatches."""

    def __init__(self, name: str, *, durable: bool, partition: int) -> None:
        self.name = name
        self.durable = durable
        self.partition = partition
        self.type: str | None = None  # fixed by its consumers while it has some
        self.consumers: list[Consumer] = []  # in attach order
        self.selector: HashRangeAutoSplitSelector | None = None
        self.dropped = Rate()
        self.msg_out_before = 0  # of consumers gone (Pulsar keeps them in the counters)
        self.bytes_out_before = 0
        self._next = 0  # Shared: where the round robin goes on

    def add(self, consumer: Consumer, subscription_type: str) -> None:
        """Attach ``consumer``: the first fixes the type (``Conflict`` for another type, and for
        a second consumer of an Exclusive subscription, as Pulsar's ``ConsumerBusy``)."""
        if self.consumers:
            if self.type != subscription_type:
                raise Conflict(f"Subscription is of different type: {self.name!r} is {self.type}")
            if subscription_type == EXCLUSIVE:
                raise Conflict(f"Exclusive consumer is already connected to {self.name!r}")
        else:
            self.type = subscription_type
            self.selector = HashRangeAutoSplitSelector() if subscription_type == KEY_SHARED else None
        if self.selector is not None:
            self.selector.add(str(consumer.seq))  # Conflict when no hash range is left
        self.consumers.append(consumer)

    def remove(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        self.msg_out_before += consumer.msg_out.total
        self.bytes_out_before += consumer.bytes_out.total
        if self.selector is not None:
            self.selector.remove(str(consumer.seq))
        if not self.consumers:
            self.type = None
            self.selector = None

    def active(self) -> Consumer | None:
        """Exclusive and Failover: the consumer that is sent messages."""
        if not self.consumers:
            return None
        if self.type == EXCLUSIVE:
            return self.consumers[0]
        order = sorted(self.consumers, key=lambda c: (c.priority_level, c.name, c.seq))
        return order[max(self.partition, 0) % len(order)]

    def dispatch(self, message: Message) -> None:
        """Send ``message`` to the consumer the subscription's type chooses, or drop it."""
        chosen: Consumer | None
        if self.type == SHARED:
            chosen = self._round_robin()
        elif self.type == KEY_SHARED:
            assert self.selector is not None
            owner = self.selector.select(sticky_hash(message.sticky_key))
            chosen = next((c for c in self.consumers if str(c.seq) == owner), None)
        else:
            chosen = self.active()
        if chosen is None or not chosen.available():
            self.dropped.add(message.count)
            return
        chosen.sink.send(message)
        chosen.msg_out.add(message.count)
        chosen.bytes_out.add(message.size)

    def _round_robin(self) -> Consumer | None:
        ready = [c for c in self.consumers if c.available()]
        if not ready:
            return None
        best = min(c.priority_level for c in ready)
        ready = [c for c in ready if c.priority_level == best]
        self._next += 1
        return ready[self._next % len(ready)]

    def unsubscribe(self, consumer: Consumer) -> None:
        """Pulsar's rule: only the subscription's one consumer may unsubscribe it."""
        if self.consumers != [consumer]:
            raise Conflict(f"Unconnected or shared consumer attempting to unsubscribe {self.name!r}")


class Topic:
    """One non-persistent topic: its producers and subscriptions, and what went through it."""

    def __init__(self, name: TopicName, partition: int) -> None:
        self.name = name
        self.partition = partition
        self.producers: list[Producer] = []
        self.subscriptions: dict[str, Subscription] = {}
        self.msg_in = Rate()
        self.bytes_in = Rate()
        self.msg_out_before = 0  # of subscriptions gone
        self.bytes_out_before = 0

    def publish(self, producer: Producer, message: Message) -> None:
        """Count ``message`` in and hand it to every subscription."""
        self.msg_in.add(message.count)
        self.bytes_in.add(message.size)
        producer.msg_in.add(message.count)
        producer.bytes_in.add(message.size)
        for sub in self.subscriptions.values():
            sub.dispatch(message)

    def idle(self) -> bool:
        return not self.producers and not any(s.consumers for s in self.subscriptions.values())


class NonPersistentTopics:
    """Every non-persistent topic this instance serves now, by name."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.topics: dict[TopicName, Topic] = {}

    def get(self, name: TopicName) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise NotFound(f"Topic {full_name(name)} not found")
        return topic

    def open(self, name: TopicName, *, partition: int, create: bool) -> Topic:
        """The topic, loaded now if ``create`` allows (``NotFound`` otherwise); ``NotAllowed``
        when the service does not serve non-persistent topics (Pulsar's
        ``enableNonPersistentTopics``). The caller checked that its namespace exists, and
        attaches its producer or consumer at once (no await between: a topic loaded and left
        idle would stay)."""
        if not self.enabled:
            raise NotAllowed("non-persistent topics are disabled here (enableNonPersistentTopics=false)")
        topic = self.topics.get(name)
        if topic is None:
            if not create:
                raise NotFound(f"Topic {full_name(name)} not found")
            topic = self.topics[name] = Topic(name, partition)
        return topic

    def add_producer(self, topic: Topic, producer: Producer) -> None:
        """Attach ``producer`` to ``topic`` (as ``open`` returned it, with no await between)."""
        topic.producers.append(producer)

    def remove_producer(self, topic: Topic, producer: Producer) -> None:
        if producer in topic.producers:
            topic.producers.remove(producer)
        self._unload_if_idle(topic)

    def subscribe(
        self,
        topic: Topic,
        subscription: str,
        consumer: Consumer,
        *,
        subscription_type: str,
        durable: bool,
        read_compacted: bool,
    ) -> Subscription:
        """Attach ``consumer`` to ``subscription`` (made now if it is new)."""
        try:
            if read_compacted:
                # Pulsar's words (NonPersistentTopic.subscribe).
                raise NotAllowed("readCompacted only valid on persistent topics")
            if subscription_type not in (EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED):
                raise NotAllowed(f"subscription type {subscription_type!r} is not served")
            sub = topic.subscriptions.get(subscription)
            if sub is None:
                sub = Subscription(subscription, durable=durable, partition=topic.partition)
            sub.add(consumer, subscription_type)
        except Exception:
            self._unload_if_idle(topic)  # loaded for this consumer alone
            raise
        topic.subscriptions[subscription] = sub
        return sub

    def unsubscribe(self, topic: Topic, sub: Subscription, consumer: Consumer) -> None:
        """Remove the subscription, if ``consumer`` is its one consumer (``Conflict`` if not)."""
        sub.unsubscribe(consumer)
        self._drop_subscription(topic, sub)
        self._unload_if_idle(topic)

    def detach(self, topic: Topic, sub: Subscription, consumer: Consumer) -> None:
        """A consumer closed: a non-durable subscription (a reader's) goes with its consumer."""
        sub.remove(consumer)
        if not sub.durable and not sub.consumers:
            self._drop_subscription(topic, sub)
        self._unload_if_idle(topic)

    def _drop_subscription(self, topic: Topic, sub: Subscription) -> None:
        for c in list(sub.consumers):
            sub.remove(c)
        if topic.subscriptions.get(sub.name) is sub:
            del topic.subscriptions[sub.name]
            topic.msg_out_before += sub.msg_out_before
            topic.bytes_out_before += sub.bytes_out_before

    def _unload_if_idle(self, topic: Topic) -> None:
        if topic.idle() and self.topics.get(topic.name) is topic:
            del self.topics[topic.name]

    def list(self, tenant: str, namespace: str) -> list[str]:
        """The full names of the namespace's topics served now, sorted."""
        return sorted(
            full_name(n) for n in list(self.topics) if n.tenant == tenant and n.namespace == namespace
        )

    def __iter__(self) -> Iterator[Topic]:
        return iter(list(self.topics.values()))
