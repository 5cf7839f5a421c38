"""Readers: a topic read from a position without a subscription; the operations once, run by
``Reader`` (sync) and ``AsyncReader``."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Iterator

from api.client._core import _C, _AsyncRunner, _Call, _Child, _Op, _Sleep, _SyncRunner, _Topic
from api.client.errors import Timeout
from api.client.message import Message, MessageId, MessageIdLike, _as_id, _page

_POLL_MIN_S = 0.02  # a reader with nothing to read polls again after this, doubling ...
_POLL_MAX_S = 0.5  # ... up to this


class _ReaderBase(_Child[_C]):
    def __init__(
        self,
        client: _C,
        topic: _Topic,
        start: MessageIdLike,
        *,
        read_compacted: bool,
        inclusive: bool,
        receiver_queue_size: int,
    ) -> None:
        super().__init__(client, topic)
        if receiver_queue_size < 1:
            raise ValueError("receiver_queue_size is at least 1")
        self._read_compacted = read_compacted
        self._inclusive = inclusive
        self._page = receiver_queue_size
        self._queue: deque[Message] = deque()
        self._reset(_as_id(start))

    @property
    def read_compacted(self) -> bool:
        return self._read_compacted

    def _reset(self, start: MessageId) -> None:
        self._queue.clear()
        self._next = str(start)  # where the next page starts (inclusive), as the server wants it
        # An exclusive start (Pulsar's default) skips the start id itself.
        special = start in (MessageId.earliest, MessageId.latest)
        self._after: MessageId | None = None if self._inclusive or special else start

    def _op_fetch(self) -> _Op[list[Message]]:
        body = yield _Call(
            "GET",
            f"{self._topic.data}/messages",
            {
                "startMessageId": self._next,
                "maxMessages": self._page,
                "readCompacted": self._read_compacted,
                "format": "columns",
            },
        )
        if body.get("nextMessageId"):
            self._next = body["nextMessageId"]
        messages = _page(str(self._topic), body)
        if self._after is not None:
            after = self._after
            messages = [m for m in messages if m.id > after]
            if self._next not in ("earliest", "latest") and MessageId.parse(self._next) > after:
                self._after = None
        return messages

    def _op_fill(self) -> _Op[bool]:
        """Fetch until a message is queued or the topic has nothing more now; True if queued."""
        while not self._queue:
            before = self._next
            self._queue.extend((yield from self._op_fetch()))
            if not self._queue and self._next == before:
                break
        return bool(self._queue)

    def _op_read_next(self, timeout_millis: int | None) -> _Op[Message]:
        self._check_open()
        deadline = None if timeout_millis is None else time.monotonic() + max(0, timeout_millis) / 1000
        delay = _POLL_MIN_S
        while not (yield from self._op_fill()):
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Timeout(f"no message on {self._topic} within {timeout_millis} ms")
                yield _Sleep(min(delay, remaining))
            else:
                yield _Sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        return self._queue.popleft()

    def _op_has_message_available(self) -> _Op[bool]:
        self._check_open()
        return (yield from self._op_fill())

    def _op_seek(self, message_id: MessageIdLike) -> _Op[None]:
        start = _as_id(message_id)
        self._check_open()
        self._reset(start)
        yield from self._op_fill()  # resolves "latest" now, as at creation


class Reader(_ReaderBase[_SyncRunner]):
    """Reads a topic from a position without a subscription; made by ``Client.create_reader``.

    Iterating yields the messages available now and stops at the end of the topic.
    """

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits (polling) up to ``timeout_millis`` (``None``: for ever) and
        raises ``Timeout`` if none came."""
        if self._queue and not self._closed:
            return self._queue.popleft()
        return self._client._run(self._op_read_next(timeout_millis))

    def has_message_available(self) -> bool:
        """Whether ``read_next`` would return at once."""
        return bool(self._queue) or self._client._run(self._op_has_message_available())

    def seek(self, message_id: MessageIdLike) -> None:
        """Read from ``message_id`` next (exclusive unless the reader was made inclusive)."""
        self._client._run(self._op_seek(message_id))

    def close(self) -> None:
        self._closed = True
        self._queue.clear()

    def __iter__(self) -> Iterator[Message]:
        while self.has_message_available():
            yield self._queue.popleft()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncReader(_ReaderBase[_AsyncRunner]):
    """See ``Reader``; ``async for msg in reader`` stops at the end of the topic."""

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        if self._queue and not self._closed:
            return self._queue.popleft()
        return await self._client._run(self._op_read_next(timeout_millis))

    async def has_message_available(self) -> bool:
        return bool(self._queue) or await self._client._run(self._op_has_message_available())

    async def seek(self, message_id: MessageIdLike) -> None:
        await self._client._run(self._op_seek(message_id))

    async def close(self) -> None:
        self._closed = True
        self._queue.clear()

    async def __aiter__(self) -> AsyncIterator[Message]:
        while await self.has_message_available():
            yield self._queue.popleft()
