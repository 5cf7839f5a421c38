"""Producers: one operation per verb, run by ``Producer`` (sync) and ``AsyncProducer``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from api.client._core import (
    _C,
    _AsyncRunner,
    _Call,
    _Child,
    _Op,
    _op_partitions,
    _SyncRunner,
    _Topic,
    partition_topic,
)
from api.client.message import MessageId, MessageLike, OutgoingMessage, _batches, _outgoing
from api.client.routing import Router


class _ProducerBase(_Child[_C]):
    def __init__(
        self, client: _C, topic: _Topic, router: Router | None = None, update_interval_s: float = 60.0
    ) -> None:
        """``router``: how messages to a partitioned topic choose their partition (the
        service's routing, the official client's default, when None or equal to it)."""
        super().__init__(client, topic)
        self._router = router if router is not None and not router.by_service else None
        self._partitions = 0
        self._update_interval_s = update_interval_s
        self._looked = time.monotonic()

    def _op_open(self) -> _Op[None]:
        # As Pulsar without auto-creation: a producer of an unknown topic fails now (NotFound).
        # The compaction status is a look-up the produce permission allows (a read is not).
        yield _Call("GET", f"{self._topic.admin}/compaction")
        if self._router is not None:
            self._partitions = yield from _op_partitions(self._topic)

    def _op_send_many(self, messages: Iterable[MessageLike]) -> _Op[list[MessageId]]:
        self._check_open()
        if self._router is None:
            return (yield from self._op_send_to(self._topic, messages))
        return (yield from self._op_route(messages))

    def _op_route(self, messages: Iterable[MessageLike]) -> _Op[list[MessageId]]:
        """Send each message to the partition the router chooses (every choice is made, and
        checked, before anything is sent); the partitions are written one after the other."""
        assert self._router is not None
        if time.monotonic() - self._looked >= self._update_interval_s:  # follows growth, as Pulsar's
            self._looked = time.monotonic()
            self._partitions = yield from _op_partitions(self._topic)
        outgoing = [_outgoing(m) for m in messages]
        if not self._partitions:
            return (yield from self._op_send_to(self._topic, outgoing))
        groups: dict[int, list[int]] = {}
        for i, m in enumerate(outgoing):
            groups.setdefault(self._router.partition(m, self._partitions), []).append(i)
        ids: list[MessageId] = [MessageId.earliest] * len(outgoing)
        for p, indexes in groups.items():
            share = [outgoing[i] for i in indexes]
            sent = yield from self._op_send_to(partition_topic(self._topic, p), share)
            for i, mid in zip(indexes, sent, strict=True):
                ids[i] = mid
        return ids

    def _op_send_to(self, topic: _Topic, messages: Iterable[MessageLike]) -> _Op[list[MessageId]]:
        ids: list[MessageId] = []
        for batch in _batches(messages):
            body = yield _Call("POST", topic.data, body={"messages": batch})
            ids.extend(MessageId.parse(i) for i in body["messageIds"])
        return ids

    def _op_send(
        self,
        value: bytes | str | None,
        key: str | None,
        properties: Mapping[str, str] | None,
        event_timestamp: int | None,
    ) -> _Op[MessageId]:
        ids = yield from self._op_send_many([OutgoingMessage(value, key, properties, event_timestamp)])
        return ids[0]


class Producer(_ProducerBase[_SyncRunner]):
    """Sends messages to one topic; made by ``Client.create_producer``."""

    def send(
        self,
        value: bytes | str | None,
        *,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_timestamp: int | None = None,
    ) -> MessageId:
        """Store one message and return its id. ``value=None`` is a tombstone for ``key``;
        a ``str`` is sent as UTF-8."""
        return self._client._run(self._op_send(value, key, properties, event_timestamp))

    def send_many(self, messages: Iterable[MessageLike]) -> list[MessageId]:
        """Store many messages, in requests of up to ``MAX_BATCH_MESSAGES``; ids in order.

        Each item is an ``OutgoingMessage``, ``bytes``/``str`` (no key), a ``(key, value)``
        pair, or a mapping of ``OutgoingMessage``'s fields. Each request is all-or-nothing;
        if one fails, the requests before it are stored.
        """
        return self._client._run(self._op_send_many(messages))

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncProducer(_ProducerBase[_AsyncRunner]):
    """See ``Producer``."""

    async def send(
        self,
        value: bytes | str | None,
        *,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_timestamp: int | None = None,
    ) -> MessageId:
        return await self._client._run(self._op_send(value, key, properties, event_timestamp))

    async def send_many(self, messages: Iterable[MessageLike]) -> list[MessageId]:
        return await self._client._run(self._op_send_many(messages))

    async def close(self) -> None:
        self._closed = True
