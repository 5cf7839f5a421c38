"""A non-durable subscription's consumer on the wire (``WireReader``: Pulsar's readers): it keeps
its position on the connection and reads the log (or the compacted view) with
``Broker.read_waiting``, as Pulsar's non-durable cursor does: nothing of it is stored."""

from __future__ import annotations

import asyncio

from api.pulsar.connection import PulsarConnection
from api.pulsar.delivery import POLL_S, Page, WireSubscriber
from ledger.entry import Entry, Position
from service.dispatchers import rest_of_batch
from service.names import TopicName
from service.subscriptions import before


class WireReader(WireSubscriber):
    """A consumer of a non-durable subscription (Pulsar's readers): its position lives here."""

    def __init__(
        self,
        conn: PulsarConnection,
        consumer_id: int,
        topic: TopicName,
        subscription: str,
        start: Position,
        read_compacted: bool,
    ) -> None:
        super().__init__(conn, consumer_id, topic, subscription, read_compacted)
        self.position = start
        # Pulsar's non-durable cursor: its mark-delete position moves with the reader's
        # acknowledgements (the clients acknowledge what they read), not with what was sent
        # ahead; GET_LAST_MESSAGE_ID reports it, and Go's Reader.HasNext after a seek by time
        # compares the last message with it.
        self.mark = before(start)
        self._seeks = 0  # a read that began before a seek must not move the position after it

    async def _fetch(self, limit: int) -> Page:
        seeks = self._seeks
        loop = asyncio.get_running_loop()
        deadline = loop.time() + POLL_S
        async with self._thread_wait() as on_thread:
            while True:
                entries, nxt = await self.conn.call(
                    self.conn.ctx.broker.read_waiting,
                    self.topic,
                    self.position,
                    limit,
                    read_compacted=self.read_compacted,
                    timeout_s=POLL_S if on_thread else 0,
                    whole=True,
                )
                remaining = deadline - loop.time()
                if entries or self.closed or remaining <= 0 or on_thread:
                    break
                await self._wait(Position(nxt.ledger_id, nxt.entry_id - 1), remaining)
        # The rest of a batch the page ends inside (its members are one entry to the client).
        while entries and type(entries[-1]) is Entry and (rest := rest_of_batch(entries[-1])):
            more, after = await self.conn.call(
                self.conn.ctx.broker.read_waiting,
                self.topic,
                nxt,
                rest,
                read_compacted=self.read_compacted,
                timeout_s=0,
            )
            if not more:
                break
            entries, nxt = entries + more, after
        if not self.closed and seeks == self._seeks:
            self.position = nxt
        return Page(entries)

    async def ack(
        self, ids: list[Position], *, cumulative: bool, batches: list[tuple[Position, int]]
    ) -> None:
        # Nothing is stored; a reader reads in order, so the furthest entry acknowledged is
        # where its mark-delete position is.
        if ids and (furthest := max(ids)) > self.mark:
            self.mark = furthest

    async def redeliver(self, ids: list[Position]) -> None:
        return None  # a reader reads on; nothing is pending on the broker's side

    async def seek(self, *, message_id: str | None, publish_time: int | None) -> None:
        target = await self.conn.call(reader_target, self.conn, self.topic, message_id, publish_time)
        self._seeks += 1
        self.position = target
        self.mark = before(target)

    async def mark_delete(self) -> Position:
        return self.mark


def reader_target(
    conn: PulsarConnection, topic: TopicName, message_id: str | None, publish_time: int | None
) -> Position:
    """Where a reader starts or seeks to: the position a start names (``earliest``, ``latest``
    or ``"L:E"``), or the first message at or after a publish time."""
    broker = conn.ctx.broker
    managed = broker.topic(topic)
    if publish_time is not None:
        return managed.ledger.find_by_publish_time(publish_time)
    assert message_id is not None
    return broker.resolve_start(managed, message_id)
