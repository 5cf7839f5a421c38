"""Consumers of a partitioned topic: one consumer per partition behind one, as Pulsar's client
subscribes to a partitioned topic (its multi-topic consumer over the partitions).

A key is always in one partition (the service routes it there), and each partition's messages
come in order, so a key's messages come in order. ``receive`` takes from the partitions in
turn: first what their receiver queues hold, then a look at each partition without waiting,
and only then a wait on one partition at a time, in slices of ``_WAIT_SLICE_MS``, so that a
message in any partition is seen within a slice. An acknowledgement goes to the partition its
message came from: the message's ``topic``, or for a bare id, the partition it was received
from (ledger ids are never shared between topics). Partitions added to the topic later are
found within ``partitions_update_interval_s`` (a minute, as Pulsar's client) and consumed from
their earliest message, so that nothing produced to them before the consumer looked is missed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from api.client._core import _C, _Call, _Child, _Op, _Topic
from api.client.consumer import AsyncConsumer, Consumer, _ConsumerBase
from api.client.errors import Timeout
from api.client.message import Message, MessageId, MessageIdLike, _as_id

if TYPE_CHECKING:  # named as strings in the base classes below (imported here, they would be circular)
    from api.client.aio import AsyncClient  # noqa: F401
    from api.client.sync import Client  # noqa: F401

# How long a receive waits on one partition before it looks at the others again.
_WAIT_SLICE_MS = 100

_P = TypeVar("_P", bound=_ConsumerBase[Any])


def partition_topic(topic: _Topic, index: int) -> _Topic:
    """Partition ``index`` of a partitioned topic, as Pulsar names it."""
    return _Topic(topic.tenant, topic.namespace, f"{topic.name}-partition-{index}")


def _op_partitions(topic: _Topic) -> _Op[int]:
    """How many partitions ``topic`` has (0: a plain topic, or none yet)."""
    body = yield _Call("GET", f"{topic.admin}/partitions")
    return int(body["partitions"])


class _PartitionedBase(_Child[_C], Generic[_C, _P]):
    def __init__(
        self,
        client: _C,
        topic: _Topic,
        parts: Sequence[_P],
        *,
        make: Callable[[_Topic], _P] | None = None,
        update_interval_s: float = 60.0,
    ) -> None:
        """``make(partition)``: the consumer of a partition added later (found every
        ``update_interval_s`` seconds, as Pulsar's client looks every minute)."""
        super().__init__(client, topic)
        self._parts = list(parts)
        self._by_topic = {p.topic(): p for p in self._parts}
        self._by_ledger: dict[int, _P] = {}  # learned from the messages received
        self._next = 0  # the partition a receive looks at first
        self._make = make
        self._update_interval_s = update_interval_s
        self._looked = time.monotonic()

    def _op_follow_growth(self) -> _Op[None]:
        """Subscribe to the partitions added since the last look, if it is time to look."""
        if self._make is None or time.monotonic() - self._looked < self._update_interval_s:
            return
        self._looked = time.monotonic()
        n = yield from _op_partitions(self._topic)
        for i in range(len(self._parts), n):
            part = self._make(partition_topic(self._topic, i))
            yield from part._op_open()
            self._parts.append(part)
            self._by_topic[part.topic()] = part

    def subscription_name(self) -> str:
        return self._parts[0].subscription_name()

    def consumer_name(self) -> str | None:
        return self._parts[0].consumer_name()

    @property
    def partitions(self) -> int:
        return len(self._parts)

    def _op_open(self) -> _Op[None]:
        opened: list[_P] = []
        try:
            for p in self._parts:
                yield from p._op_open()
                opened.append(p)
        except BaseException:
            for p in opened:  # all or none: detach the partitions already attached
                yield from p._op_close()
            raise

    def _learn(self, got: list[Message], part: _P) -> list[Message]:
        for m in got:
            self._by_ledger[m.id.ledger_id] = part
        return got

    def _take_queued(self, want: int) -> list[Message]:
        """Up to ``want`` messages from the partitions' receiver queues, partition by partition
        from the one after the last served."""
        out: list[Message] = []
        n = len(self._parts)
        for k in range(n):
            p = self._parts[(self._next + k) % n]
            while p._queue and len(out) < want:
                m = p._queue.popleft()
                self._by_ledger[m.id.ledger_id] = p
                out.append(m)
            if len(out) >= want:
                self._next = (self._next + k + 1) % n
                break
        return out

    def _op_receive(self, timeout_millis: int | None, max_messages: int | None) -> _Op[list[Message]]:
        self._check_open()
        if max_messages is not None and max_messages < 1:
            raise ValueError("max_messages is at least 1")
        want = max_messages or 1
        deadline = None if timeout_millis is None else time.monotonic() + max(0, timeout_millis) / 1000
        while True:
            yield from self._op_follow_growth()
            n = len(self._parts)
            out = self._take_queued(want)
            if out:
                return out
            # A look at every partition without waiting (each fills its receiver queue).
            for k in range(n):
                p = self._parts[(self._next + k) % n]
                got = yield from p._op_receive(0, max_messages)
                if got:
                    self._next = (self._next + k + 1) % n
                    return self._learn(got, p)
            remaining_ms = None if deadline is None else int((deadline - time.monotonic()) * 1000)
            if remaining_ms is not None and remaining_ms <= 0:
                return []
            # Nothing anywhere: wait on one partition for a slice, the next one next time.
            p = self._parts[self._next]
            self._next = (self._next + 1) % n
            wait = _WAIT_SLICE_MS if remaining_ms is None else min(_WAIT_SLICE_MS, remaining_ms)
            got = yield from p._op_receive(wait, max_messages)
            if got:
                return self._learn(got, p)

    def _part_of(self, item: MessageIdLike | Message) -> _P:
        if isinstance(item, Message) and item.topic in self._by_topic:
            return self._by_topic[item.topic]
        part = self._by_ledger.get(_as_id(item).ledger_id)
        if part is None:
            raise ValueError(f"{item!r} was not received by this consumer: its partition is unknown")
        return part

    def _by_part(self, items: Iterable[MessageIdLike | Message]) -> dict[int, list[MessageIdLike | Message]]:
        groups: dict[int, list[MessageIdLike | Message]] = {}
        for item in items:
            groups.setdefault(self._parts.index(self._part_of(item)), []).append(item)
        return groups

    def _op_ack(self, items: Iterable[MessageIdLike | Message], cumulative: bool) -> _Op[None]:
        self._check_open()
        for i, group in self._by_part(items).items():
            yield from self._parts[i]._op_ack(group, cumulative)

    def _op_negative_ack(self, items: Iterable[MessageIdLike | Message]) -> _Op[None]:
        self._check_open()
        for i, group in self._by_part(items).items():
            yield from self._parts[i]._op_negative_ack(group)

    def _op_redeliver(self) -> _Op[None]:
        self._check_open()
        for p in self._parts:
            yield from p._op_redeliver()

    def _op_seek(self, target: MessageIdLike | int) -> _Op[None]:
        """A publish time, ``earliest`` or ``latest``: every partition; an id: its partition."""
        self._check_open()
        if isinstance(target, int) or _as_id(target) in (MessageId.earliest, MessageId.latest):
            for p in self._parts:
                yield from p._op_seek(target)
            return
        yield from self._part_of(target)._op_seek(target)

    def _op_close(self) -> _Op[None]:
        if self._closed:
            return
        self._closed = True
        for p in self._parts:
            yield from p._op_close()

    def _op_unsubscribe(self) -> _Op[None]:
        self._check_open()
        for p in self._parts:
            yield from p._op_unsubscribe()
        self._closed = True


class PartitionedConsumer(_PartitionedBase["Client", Consumer]):
    """A consumer of every partition of a partitioned topic, with ``Consumer``'s methods; made
    by ``Client.subscribe`` when the topic is partitioned. A message's ``topic`` names its
    partition."""

    def receive(self, timeout_millis: int | None = None) -> Message:
        got = self._client._run(self._op_receive(timeout_millis, None))
        if not got:
            raise Timeout(f"no message on {self._topic} within {timeout_millis} ms")
        return got[0]

    def batch_receive(self, max_messages: int = 100, timeout_millis: int = 0) -> list[Message]:
        return self._client._run(self._op_receive(timeout_millis, max_messages))

    def acknowledge(self, message: Message | MessageIdLike) -> None:
        self._client._run(self._op_ack([message], cumulative=False))

    def acknowledge_many(self, messages: Iterable[Message | MessageIdLike]) -> None:
        self._client._run(self._op_ack(messages, cumulative=False))

    def acknowledge_cumulative(self, message: Message | MessageIdLike) -> None:
        """This message and every one before it in its partition (Exclusive and Failover)."""
        self._client._run(self._op_ack([message], cumulative=True))

    def negative_acknowledge(self, message: Message | MessageIdLike) -> None:
        self._client._run(self._op_negative_ack([message]))

    def negative_acknowledge_many(self, messages: Iterable[Message | MessageIdLike]) -> None:
        self._client._run(self._op_negative_ack(messages))

    def redeliver_unacknowledged_messages(self) -> None:
        self._client._run(self._op_redeliver())

    def seek(self, target: MessageIdLike | int) -> None:
        self._client._run(self._op_seek(target))

    def unsubscribe(self) -> None:
        self._client._run(self._op_unsubscribe())

    def close(self) -> None:
        if not self._closed:
            self._client._run(self._op_close())

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield self.receive()

    def __enter__(self) -> PartitionedConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncPartitionedConsumer(_PartitionedBase["AsyncClient", AsyncConsumer]):
    """See ``PartitionedConsumer``."""

    async def receive(self, timeout_millis: int | None = None) -> Message:
        got = await self._client._run(self._op_receive(timeout_millis, None))
        if not got:
            raise Timeout(f"no message on {self._topic} within {timeout_millis} ms")
        return got[0]

    async def batch_receive(self, max_messages: int = 100, timeout_millis: int = 0) -> list[Message]:
        return await self._client._run(self._op_receive(timeout_millis, max_messages))

    async def acknowledge(self, message: Message | MessageIdLike) -> None:
        await self._client._run(self._op_ack([message], cumulative=False))

    async def acknowledge_many(self, messages: Iterable[Message | MessageIdLike]) -> None:
        await self._client._run(self._op_ack(messages, cumulative=False))

    async def acknowledge_cumulative(self, message: Message | MessageIdLike) -> None:
        await self._client._run(self._op_ack([message], cumulative=True))

    async def negative_acknowledge(self, message: Message | MessageIdLike) -> None:
        await self._client._run(self._op_negative_ack([message]))

    async def negative_acknowledge_many(self, messages: Iterable[Message | MessageIdLike]) -> None:
        await self._client._run(self._op_negative_ack(messages))

    async def redeliver_unacknowledged_messages(self) -> None:
        await self._client._run(self._op_redeliver())

    async def seek(self, target: MessageIdLike | int) -> None:
        await self._client._run(self._op_seek(target))

    async def unsubscribe(self) -> None:
        await self._client._run(self._op_unsubscribe())

    async def close(self) -> None:
        if not self._closed:
            await self._client._run(self._op_close())

    async def __aiter__(self) -> AsyncIterator[Message]:
        while True:
            yield await self.receive()
