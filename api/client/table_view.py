"""Table views: a live key -> latest value map over a topic, as Pulsar's ``TableView``, loaded and
followed through a compacted reader."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeAlias, TypeVar

from api.client._core import _AsyncRunner, _Op, _SyncRunner
from api.client.errors import AlreadyClosed, ClientError
from api.client.message import Message
from api.client.reader import AsyncReader, Reader, _ReaderBase

log = logging.getLogger(__name__)


#: ``callback(key, value)`` of a table view; ``value`` is ``None`` when a tombstone removed the key.
TableListener: TypeAlias = Callable[[str, bytes | None], None]


_R = TypeVar("_R", bound=_ReaderBase[Any])


class _TableViewBase(Generic[_R]):
    """The key -> latest value map and its listeners; sync and async differ in refreshing."""

    def __init__(self, readers: Sequence[_R], poll_interval: float, topic: str | None = None) -> None:
        """``readers``: one of the topic, or one per partition of a partitioned topic (whose
        name is ``topic``); a key is in one partition, so the map is their union."""
        if poll_interval <= 0:
            raise ValueError("poll_interval is a positive number of seconds")
        self._readers = list(readers)
        self._topic = topic or self._readers[0].topic()
        self.poll_interval = poll_interval
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._listeners: list[TableListener] = []
        self.last_error: ClientError | None = None

    def topic(self) -> str:
        return self._topic

    def _op_refresh(self) -> _Op[int]:
        changes = 0
        for reader in self._readers:
            while (yield from reader._op_fill()):
                batch = list(reader._queue)
                reader._queue.clear()
                changes += self._apply(batch)
        return changes

    def _apply(self, messages: Iterable[Message]) -> int:
        updates: list[tuple[str, bytes | None]] = []
        with self._lock:
            for m in messages:
                if m.partition_key is None:
                    continue  # a keyless message has no place in a table
                if not m.payload:  # null or empty: a delete, as compaction reads it
                    self._data.pop(m.partition_key, None)
                    updates.append((m.partition_key, None))
                else:
                    self._data[m.partition_key] = m.payload
                    updates.append((m.partition_key, m.payload))
            listeners = list(self._listeners)
        for key, value in updates:
            for listener in listeners:
                self._call(listener, key, value)
        return len(updates)

    @staticmethod
    def _call(listener: TableListener, key: str, value: bytes | None) -> None:
        try:
            listener(key, value)
        except Exception:  # a listener's bug must not stop the table from following the topic
            log.exception("table view listener %r failed on key %r", listener, key)

    # Mapping-like reads: snapshots, safe while the table follows the topic in the background.

    def get(self, key: str, default: bytes | None = None) -> bytes | None:
        with self._lock:
            return self._data.get(key, default)

    def __getitem__(self, key: str) -> bytes:
        with self._lock:
            return self._data[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._data)

    def values(self) -> list[bytes]:
        with self._lock:
            return list(self._data.values())

    def items(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self._data.items())

    def to_dict(self) -> dict[str, bytes]:
        """A copy of the table as it is now."""
        with self._lock:
            return dict(self._data)

    def for_each(self, callback: Callable[[str, bytes], None]) -> None:
        """Call ``callback(key, value)`` for every entry now in the table."""
        for key, value in self.items():
            callback(key, value)

    def listen(self, callback: TableListener) -> None:
        """Call ``callback(key, value)`` for every update from now on (``value`` is ``None`` when
        a tombstone removed the key), from the thread or task that refreshes the table."""
        with self._lock:
            self._listeners.append(callback)

    def for_each_and_listen(self, callback: TableListener) -> None:
        """``for_each`` then ``listen``, as Pulsar's ``forEachAndListen``."""
        with self._lock:
            current = list(self._data.items())
            self._listeners.append(callback)
        for key, value in current:
            self._call(callback, key, value)


class TableView(_TableViewBase[Reader]):
    """A live key -> latest value map over a topic, as Pulsar's ``TableView``; made by
    ``Client.create_table_view``. Keyless messages are ignored; a tombstone removes its key."""

    def __init__(
        self, client: _SyncRunner, readers: Sequence[Reader], poll_interval: float, topic: str | None = None
    ) -> None:
        super().__init__(readers, poll_interval, topic)
        self._client = client
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> int:
        """Apply every message published since the last refresh; returns how many changed the
        table (tombstones included)."""
        with self._refresh_lock:
            return self._client._run(self._op_refresh())

    def start(self) -> TableView:
        """Follow the topic in a background thread, refreshing every ``poll_interval`` s; errors
        are logged and kept in ``last_error``, and the thread goes on."""
        if self._thread is None:
            self._readers[0]._check_open()
            self._thread = threading.Thread(
                target=self._follow, name=f"table-view {self.topic()}", daemon=True
            )
            self._thread.start()
        return self

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.refresh()
                self.last_error = None
            except AlreadyClosed:
                return
            except ClientError as e:
                self.last_error = e
                log.warning("table view of %s: %s", self.topic(), e)

    def close(self) -> None:
        """Stop following the topic."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._client.timeout + 1)
            self._thread = None
        for reader in self._readers:
            reader.close()

    def __enter__(self) -> TableView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTableView(_TableViewBase[AsyncReader]):
    """See ``TableView``; ``start()`` follows the topic in an asyncio task of the running loop."""

    def __init__(
        self,
        client: _AsyncRunner,
        readers: Sequence[AsyncReader],
        poll_interval: float,
        topic: str | None = None,
    ) -> None:
        super().__init__(readers, poll_interval, topic)
        self._client = client
        self._refresh_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> int:
        async with self._refresh_lock:
            return await self._client._run(self._op_refresh())

    def start(self) -> AsyncTableView:
        if self._task is None:
            self._readers[0]._check_open()
            self._task = asyncio.get_running_loop().create_task(
                self._follow(), name=f"table-view {self.topic()}"
            )
        return self

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.refresh()
                self.last_error = None
            except AlreadyClosed:
                return
            except ClientError as e:
                self.last_error = e
                log.warning("table view of %s: %s", self.topic(), e)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for reader in self._readers:
            await reader.close()
