"""Producers: one operation per verb, run by ``Producer`` (sync) and ``AsyncProducer``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from api.client._core import _C, _Call, _Child, _Op
from api.client.message import MessageId, MessageLike, OutgoingMessage, _batches

if TYPE_CHECKING:  # named as strings in the base classes below (imported here, they would be circular)
    from api.client.aio import AsyncClient  # noqa: F401
    from api.client.sync import Client  # noqa: F401


class _ProducerBase(_Child[_C]):
    def _op_open(self) -> _Op[None]:
        # As Pulsar without auto-creation: a producer of an unknown topic fails now (NotFound).
        # The compaction status is a look-up the produce permission allows (a read is not).
        yield _Call("GET", f"{self._topic.admin}/compaction")

    def _op_send_many(self, messages: Iterable[MessageLike]) -> _Op[list[MessageId]]:
        self._check_open()
        ids: list[MessageId] = []
        for batch in _batches(messages):
            body = yield _Call("POST", self._topic.data, body={"messages": batch})
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


class Producer(_ProducerBase["Client"]):
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


class AsyncProducer(_ProducerBase["AsyncClient"]):
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
