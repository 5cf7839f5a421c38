"""Consumers and readers: SUBSCRIBE, FLOW, ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES, SEEK,
GET_LAST_MESSAGE_ID, UNSUBSCRIBE and CLOSE_CONSUMER, over the same topics, subscriptions, cursors
and dispatchers as REST.

Pulsar pushes: a consumer grants permits (FLOW) and the broker sends that many messages. Each
consumer has one delivery task that asks for up to its permits (a read on a worker thread) and
writes them as MESSAGE frames. When there is nothing to send, it waits for the topic's next
append. Up to a quarter of the worker threads, consumers wait on a worker thread, inside the read
(the shortest way from an append to the consumer); the others wait on the event loop, holding no
thread (``ManagedLedger.on_entry_after``, their own redelivery requests and acks, and on
subscriptions that others share a short poll for messages given back), so that a client of a
topic of hundreds of partitions, which waits on each one, cannot take every thread.

- A durable subscription's consumer (``WireConsumer``) receives through
  ``SubscriptionService.receive``: the subscription's position, acknowledgements and dispatcher
  are the ones REST consumers share. Ack timeouts and negative-ack delays are the client's (it
  sends REDELIVER with the ids when due), so the service's own are off for these consumers.
- A non-durable subscription (``WireReader``: Pulsar's readers) keeps its position on the
  connection and reads the log (or the compacted view) with ``Broker.read_waiting``, as Pulsar's
  non-durable cursor does: nothing of it is stored.

A SEEK is answered as Pulsar's broker answers it: the position is reset, the consumer is closed
from the broker's side (CLOSE_CONSUMER), then SUCCESS; the client subscribes again, at the new
position, with fresh permits, and nothing sent before the seek reaches the application.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import cast

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.connection import BoundedDict, Handler, PulsarConnection
from api.pulsar.errors import ProtocolError
from api.pulsar.framing import Frame, command, encode_payload
from api.pulsar.messages import (
    EARLIEST_ID,
    LATEST_ID,
    batch_message,
    entry_id_data,
    entry_metadata,
    id_data,
    position,
    stored_metadata,
)
from api.pulsar.schemas import consumer_schema
from ledger.entry import BatchEntry, Entry, LedgerItem, Position, StoredBatch
from service.authorization import Rule
from service.dispatchers import rest_of_batch
from service.errors import Conflict, NotFound, NotOwner, OwnershipLost, ServiceError, Unavailable
from service.names import TopicName
from service.pending_runs import members_of
from service.subscription_types import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED
from service.subscriptions import before
from service.topic_reads import EARLIEST, LATEST

log = logging.getLogger(__name__)
_tuple_new = tuple.__new__

_TYPES = {
    pb.CommandSubscribe.Exclusive: EXCLUSIVE,
    pb.CommandSubscribe.Shared: SHARED,
    pb.CommandSubscribe.Failover: FAILOVER,
    pb.CommandSubscribe.Key_Shared: KEY_SHARED,
}
# Messages asked for at once, and how long one ask waits for the first.
_PAGE = 1000
# Messages a consumer that reads ahead asks for at once: a read costs much the same for a
# batch as for ten (a sealed ledger's read ~0.5 us a message in pages of 1,000, ~0.35 in 4,000).
_READ_AHEAD_PAGE = 4 * _PAGE
_POLL_S = 1.0
# How often a waiting consumer of a subscription others share looks for messages given back
# to it (a negative ack, a consumer gone), which no append announces.
_SHARED_POLL_S = 0.05
# Batches a consumer remembers sending until they are acknowledged (the oldest forgotten first:
# an ack of a forgotten batch then acknowledges the batch's first member only).
_MAX_BATCHES = 100_000


@dataclass(frozen=True)
class _Page:
    entries: Sequence[LedgerItem]
    redelivery_counts: list[int] | None = None
    # Whether the page was given back since it was delivered (``Delivery.given_back``).
    given_back: Callable[[], bool] | None = None


class WireSubscriber:
    """What durable consumers and readers share: permits, the delivery task, closing."""

    def __init__(
        self,
        conn: PulsarConnection,
        consumer_id: int,
        topic: TopicName,
        subscription: str,
        read_compacted: bool,
    ) -> None:
        self.conn = conn
        self.consumer_id = consumer_id
        self.topic = topic
        self.subscription = subscription
        self.read_compacted = read_compacted
        self.permits = 0
        # Whether the next page is read while the client holds no permits, to be sent the
        # moment its FLOW comes (never for a subscription others share: the messages would
        # wait here while another consumer could take them).
        self.read_ahead = True
        self.closed = False
        # Batches sent and not yet acknowledged whole: (ledger, batch entry) -> members sent, or
        # how many when the batch went whole (a ``BatchEntry``: acknowledged as one).
        self.batches: dict[Position, list[Position] | int] = BoundedDict(_MAX_BATCHES)
        self._permitted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._nudged = asyncio.Event()

    def nudge(self) -> None:
        """Cut a wait short: something may be there to send (a redelivery asked for)."""
        self._nudged.set()

    async def _wait(self, after: Position, timeout_s: float) -> None:
        """Until the topic has an entry after ``after``, the consumer is nudged or closed, or
        ``timeout_s`` passes; on the event loop, holding no worker thread."""
        if self.closed or timeout_s <= 0:
            return
        topic = self.conn.ctx.broker.served(self.topic)
        loop = asyncio.get_running_loop()
        appended = loop.create_future()

        def done() -> None:
            if not appended.done():
                appended.set_result(None)

        def wake() -> None:  # from the appending thread, under the ledger's lock: no blocking
            loop.call_soon_threadsafe(done)

        cancel = topic.ledger.on_entry_after(after, wake) if topic is not None else None
        nudged = loop.create_task(self._nudged.wait())
        try:
            await asyncio.wait({appended, nudged}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            nudged.cancel()
            self._nudged.clear()
            if cancel is not None:
                cancel()

    @contextlib.asynccontextmanager
    async def _thread_wait(self) -> AsyncIterator[bool]:
        """Whether this fetch may wait on a worker thread (a slot of the shared few is free),
        holding the slot while it does."""
        ctx = self.conn.ctx
        if ctx.thread_waits >= ctx.max_thread_waits:
            yield False
            return
        ctx.thread_waits += 1
        try:
            yield True
        finally:
            ctx.thread_waits -= 1

    def _last_position(self) -> Position:
        topic = self.conn.ctx.broker.served(self.topic)
        last = topic.ledger.last_position() if topic is not None else None
        return last or Position(-1, -1)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._deliver())

    def grant(self, permits: int) -> None:
        self.permits += permits
        if self.permits > 0:
            self._permitted.set()

    async def _fetch(self, limit: int) -> _Page:
        raise NotImplementedError

    async def _idle(self) -> None:
        """Called while the consumer has no permits for a while."""

    async def _deliver(self) -> None:
        conn = self.conn
        idle_s = max(0.05, conn.ctx.settings.consumer_timeout_ms / 3000)
        loop = asyncio.get_running_loop()
        # The next page, read while the previous one was written or the client had no permits:
        # a FLOW is then answered at once, not after a read on a worker thread.
        ahead: asyncio.Task[_Page] | None = None
        # Reading ahead, a page of several FLOWs' worth, sent as permits come: the page and the
        # index of its next item.
        held: tuple[_Page, int] | None = None
        try:
            while not self.closed:
                # The next read starts once the page held is half sent, to be there when it ends.
                if (
                    ahead is None
                    and (self.permits > 0 or self.read_ahead)
                    and (held is None or 2 * held[1] >= len(held[0].entries))
                ):
                    ahead = loop.create_task(self._fetch(self._page_size()))
                if self.permits <= 0:
                    self._permitted.clear()
                    try:
                        await asyncio.wait_for(self._permitted.wait(), idle_s)
                    except TimeoutError:
                        await self._idle()
                    continue
                if held is not None:
                    page, at = held
                    held = None
                    if page.given_back is not None and page.given_back():
                        continue  # given back meanwhile (a redelivery): it comes again, counted
                    spent, at = self._send(page, at, self.permits)
                    self.permits -= spent
                    if at < len(page.entries):
                        held = (page, at)
                    await conn.drained()
                    continue
                assert ahead is not None
                try:
                    page = await ahead
                except OwnershipLost:
                    raise
                except Unavailable as busy:
                    # For a while (a compacted ledger being rebuilt, a backlog of seals): ask again
                    # after the pause the service names, as a REST client retries.
                    log.info("consumer %s of %s waits: %s", self.consumer_id, self.topic, busy)
                    await asyncio.sleep(min(max(busy.retry_after, 0.1), 5))
                    continue
                finally:
                    ahead = None
                if self.closed:
                    return  # what was fetched goes back with the detach, or was only read
                if self.read_ahead:
                    held = (page, 0)
                    continue
                self.permits -= self._send(page, 0, None)[0]
                await conn.drained()
        except (NotFound, NotOwner, OwnershipLost):
            # The subscription or the topic went away under us, or to another instance: Pulsar
            # closes the consumer on its side and tells the client, which looks the topic up
            # and subscribes again (and learns why).
            self._closed_by_broker()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("delivering to consumer %s of %s failed", self.consumer_id, self.topic)
            self._closed_by_broker()  # never a consumer that silently stops receiving
        finally:
            if ahead is not None:  # the consumer is closed: a page read for it goes back with it
                ahead.cancel()
                ahead.add_done_callback(_retrieve)

    def _page_size(self) -> int:
        """Messages to ask for: what the client's permits allow (never more: on a subscription
        others share, what one consumer takes the others cannot have); reading ahead, several
        FLOWs' worth (:data:`_READ_AHEAD_PAGE`)."""
        return _READ_AHEAD_PAGE if self.read_ahead else min(self.permits, _PAGE)

    def _send(self, page: _Page, start: int, permits: int | None) -> tuple[int, int]:
        """Write ``page``'s items from ``start`` on as MESSAGE frames, the members of one
        stored batch as one batch message (see ``messages.batch_message``), while ``permits``
        last (all of them when None); returns the permits spent (a batch's whole size for a
        batch, as the client counts it) and the index of the first item not sent."""
        entries, counts = page.entries, page.redelivery_counts
        spent = 0
        i = start
        while i < len(entries) and (permits is None or spent < permits):
            item = entries[i]
            if isinstance(item, BatchEntry):
                # A batch whole, as stored: no object per member (acknowledged as one).
                batch = item.batch
                first = _tuple_new(Position, item[:2])
                self.batches[first] = batch.count
                cmd = command(
                    pb.BaseCommand.MESSAGE,
                    consumer_id=self.consumer_id,
                    message_id=id_data(first),
                    redelivery_count=counts[i] if counts else 0,
                )
                self.conn.write(encode_payload(cmd, stored_metadata(batch), batch.payload))
                spent += batch.count
                i += 1
                continue
            e = item
            if e.batch_index is None:
                cmd = command(
                    pb.BaseCommand.MESSAGE,
                    consumer_id=self.consumer_id,
                    message_id=id_data(e.position),
                    redelivery_count=counts[i] if counts else 0,
                )
                self.conn.write(encode_payload(cmd, entry_metadata(e), e.value or b""))
                spent += 1
                i += 1
                continue
            start = e.entry_id - e.batch_index
            j = i + 1
            while (
                j < len(entries)
                and isinstance(m := entries[j], Entry)
                and m.batch_index is not None
                and m.ledger_id == e.ledger_id
                and m.entry_id - m.batch_index == start
            ):
                j += 1
            members = cast(list[Entry], entries[i:j])
            first = Position(e.ledger_id, start)
            stored = self._stored(first) if len(members) == e.batch_size else None
            ack_set: list[int]
            if stored is not None:
                # Every member goes: the batch as its producer sent it (compressed as it came).
                mid, metadata, payload, ack_set = id_data(first), stored_metadata(stored), stored.payload, []
            else:
                mid, metadata, payload, ack_set = batch_message(members)
            # Each member's position, as Position.__new__ makes it, without its Python call.
            self.batches[first] = [_tuple_new(Position, m[:2]) for m in members]
            cmd = command(
                pb.BaseCommand.MESSAGE,
                consumer_id=self.consumer_id,
                message_id=mid,
                redelivery_count=max(counts[i:j]) if counts else 0,
                ack_set=ack_set,
            )
            self.conn.write(encode_payload(cmd, metadata, payload))
            spent += e.batch_size or len(members)
            i = j
        return spent, i

    def _stored(self, first: Position) -> StoredBatch | None:
        topic = self.conn.ctx.broker.served(self.topic)
        return topic.ledger.stored_batch(first) if topic is not None else None

    def positions(
        self, ids: Sequence[pb.MessageIdData], *, cumulative: bool, expand: bool = False
    ) -> tuple[list[Position], list[tuple[Position, int]]]:
        """The stored positions a client's ids name, and the batches sent whole that they name
        whole, ``(first member, members)`` (every member of those, with ``expand``). A batch
        named whole (no batch index: every member acknowledged) is the members this consumer
        was sent; with an ``ack_set`` (batch-index acknowledgement), the members whose bit is
        clear."""
        out: list[Position] = []
        whole: list[tuple[Position, int]] = []
        for data in ids:
            pos = position(data)
            members = self.batches.get(pos) if data.batch_index < 0 else None
            if members is None:
                out.append(pos)
                continue
            if type(members) is int:
                n = members
                if not data.ack_set and not cumulative and not expand:
                    del self.batches[pos]
                    whole.append((pos, n))
                    continue
                members = members_of(pos, n)
            assert isinstance(members, list)
            if data.ack_set:
                acked = [m for m in members if not _bit(data.ack_set, m.entry_id - pos.entry_id)]
                out.extend(acked[-1:] if cumulative else acked)
            else:
                del self.batches[pos]
                out.extend(members[-1:] if cumulative else members)
        return out, whole

    def _closed_by_broker(self) -> None:
        if not self.closed:
            self.close()
            self.conn.consumers.pop(self.consumer_id, None)
            self.conn.send(pb.BaseCommand.CLOSE_CONSUMER, consumer_id=self.consumer_id, request_id=0)

    def close(self) -> None:
        self.closed = True
        self._permitted.set()
        self._nudged.set()

    async def wait_closed(self) -> None:
        """Until what ``close`` started is done (a consumer detached from its subscription)."""

    async def ack(
        self, ids: list[Position], *, cumulative: bool, batches: list[tuple[Position, int]]
    ) -> None:
        raise NotImplementedError

    async def redeliver(self, ids: list[Position]) -> None:
        raise NotImplementedError

    async def seek(self, *, message_id: str | None, publish_time: int | None) -> None:
        raise NotImplementedError

    async def mark_delete(self) -> Position:
        raise NotImplementedError


class WireConsumer(WireSubscriber):
    """A consumer of a durable subscription, attached as REST consumers are."""

    def __init__(
        self,
        conn: PulsarConnection,
        consumer_id: int,
        topic: TopicName,
        subscription: str,
        service_id: str,
        read_compacted: bool,
        shared: bool = False,
    ) -> None:
        super().__init__(conn, consumer_id, topic, subscription, read_compacted)
        self.service_id = service_id
        self.read_ahead = not shared
        self._detached: asyncio.Future[None] | None = None
        # Exclusive: only appends and its own redeliveries bring it messages.
        self._poll_s = _SHARED_POLL_S if shared else _POLL_S

    async def _fetch(self, limit: int) -> _Page:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _POLL_S
        async with self._thread_wait() as on_thread:
            while True:
                # Before the read: an append after it ends a wait on the loop.
                seen = None if on_thread else self._last_position()
                delivered = await self.conn.call(
                    self.conn.ctx.subscriptions.receive,
                    self.topic,
                    self.subscription,
                    self.service_id,
                    max_messages=limit,
                    timeout_ms=int(_POLL_S * 1000) if on_thread else 0,
                    whole=True,
                )
                remaining = deadline - loop.time()
                if delivered.entries or self.closed or remaining <= 0 or seen is None:
                    return _Page(delivered.entries, delivered.redelivery_counts, delivered.given_back)
                await self._wait(seen, min(remaining, self._poll_s))

    async def _idle(self) -> None:
        # No permits for a while (the application is not receiving): stay attached.
        await self.conn.call(
            self.conn.ctx.subscriptions.touch, self.topic, self.subscription, self.service_id
        )

    def close(self) -> None:
        """Detach from the subscription: what was delivered and not acknowledged goes to the
        subscription's other consumers, or to the next one."""
        if self.closed:
            return
        super().close()
        subs = self.conn.ctx.subscriptions
        topic, sub, sid = self.topic, self.subscription, self.service_id

        def detach() -> None:
            with contextlib.suppress(ServiceError):  # already gone with its subscription or topic
                subs.detach(topic, sub, sid)

        self._detached = asyncio.get_running_loop().run_in_executor(None, detach)

    async def wait_closed(self) -> None:
        if self._detached is not None:
            await self._detached

    async def ack(
        self, ids: list[Position], *, cumulative: bool, batches: list[tuple[Position, int]]
    ) -> None:
        subs = self.conn.ctx.subscriptions
        await self.conn.call(
            subs.ack,
            self.topic,
            self.subscription,
            self.service_id,
            ids,
            cumulative=cumulative,
            batches=batches,
        )
        self.nudge()  # a consumer at its bound of unacknowledged messages may receive again

    async def redeliver(self, ids: list[Position]) -> None:
        subs = self.conn.ctx.subscriptions
        if ids:
            await self.conn.call(subs.negative_ack, self.topic, self.subscription, self.service_id, ids)
        else:
            await self.conn.call(subs.redeliver, self.topic, self.subscription, self.service_id)
        self.nudge()

    async def seek(self, *, message_id: str | None, publish_time: int | None) -> None:
        await self.conn.call(
            self.conn.ctx.subscriptions.seek,
            self.topic,
            self.subscription,
            message_id=message_id,
            publish_time=publish_time,
            consumer_id=self.service_id,
        )

    async def mark_delete(self) -> Position:
        return await self.conn.call(self.conn.ctx.subscriptions.mark_delete, self.topic, self.subscription)


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
        self._seeks = 0  # a read that began before a seek must not move the position after it

    async def _fetch(self, limit: int) -> _Page:
        seeks = self._seeks
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _POLL_S
        async with self._thread_wait() as on_thread:
            while True:
                entries, nxt = await self.conn.call(
                    self.conn.ctx.broker.read_waiting,
                    self.topic,
                    self.position,
                    limit,
                    read_compacted=self.read_compacted,
                    timeout_s=_POLL_S if on_thread else 0,
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
        return _Page(entries)

    async def ack(
        self, ids: list[Position], *, cumulative: bool, batches: list[tuple[Position, int]]
    ) -> None:
        return None  # a non-durable cursor keeps no acknowledgements

    async def redeliver(self, ids: list[Position]) -> None:
        return None  # a reader reads on; nothing is pending on the broker's side

    async def seek(self, *, message_id: str | None, publish_time: int | None) -> None:
        target = await self.conn.call(_reader_target, self.conn, self.topic, message_id, publish_time)
        self._seeks += 1
        self.position = target

    async def mark_delete(self) -> Position:
        return before(self.position)


def _last_message(conn: PulsarConnection, topic: TopicName, read_compacted: bool) -> pb.MessageIdData:
    """The wire id of the topic's last message (-1:-1 when it has none): a batch member's names
    its batch and index, as the client's received ids do, or ``has_message_available`` would
    compare an entry with a batch and wait for a message that never comes."""
    broker = conn.ctx.broker
    last = broker.last_message_id(topic, read_compacted=read_compacted)
    if last is None:
        return id_data(Position(-1, -1))
    entries, _ = broker.read_at(broker.topic(topic), last, 1, read_compacted)
    if entries and entries[0].position == last:
        return entry_id_data(entries[0])
    return id_data(last)


def _retrieve(task: asyncio.Task[_Page]) -> None:
    """Take a dropped read's outcome, so that its error is not reported as never retrieved."""
    if not task.cancelled():
        task.exception()


def _bit(words: Sequence[int], i: int) -> bool:
    """Bit ``i`` of a wire bit set (int64 words, least significant bit first); past its end, set."""
    return i // 64 >= len(words) or bool((words[i // 64] >> (i % 64)) & 1)


def _reader_target(
    conn: PulsarConnection, topic: TopicName, message_id: str | None, publish_time: int | None
) -> Position:
    broker = conn.ctx.broker
    managed = broker.topic(topic)
    if publish_time is not None:
        return managed.ledger.find_by_publish_time(publish_time)
    assert message_id is not None
    return broker.resolve_start(managed, message_id)


def _start_of(data: pb.MessageIdData | None, initial: str) -> str:
    """A SUBSCRIBE's or SEEK's message id as the service names a start: ``earliest``,
    ``latest`` or ``"L:E"``."""
    if data is None:
        return initial
    pos = position(data)
    if pos == EARLIEST_ID or pos.ledger_id < 0:
        return EARLIEST
    if pos == LATEST_ID:
        return LATEST
    return f"{pos.ledger_id}:{max(pos.entry_id, 0)}"


async def subscribe(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.subscribe
    request_id = req.request_id

    async def work() -> None:
        if req.consumer_id in conn.consumers:
            raise ProtocolError(
                pb.ConsumerBusy, f"consumer id {req.consumer_id} is in use on this connection"
            )
        name = await conn.use_topic(req.topic, Rule.CONSUME, create=req.force_topic_creation)
        await consumer_schema(conn, name, req.schema if req.HasField("schema") else None)
        ctx = conn.ctx
        initial = EARLIEST if req.initialPosition == pb.CommandSubscribe.Earliest else LATEST
        consumer: WireSubscriber
        if not req.durable:
            # A reader that the broker closed for its seek comes back at the seek's position.
            resumed = ctx.reader_positions.pop((name, req.subscription), None)
            if resumed is not None:
                start = resumed
            else:
                where = _start_of(req.start_message_id if req.HasField("start_message_id") else None, initial)
                start = await conn.call(_reader_target, conn, name, where, None)
            consumer = WireReader(conn, req.consumer_id, name, req.subscription, start, req.read_compacted)
        else:
            subs = ctx.subscriptions
            with contextlib.suppress(Conflict):  # it exists: the consumer attaches at its position
                await conn.call(subs.create, name, req.subscription, initial_position=initial)
            info = await conn.call(
                subs.attach,
                name,
                req.subscription,
                consumer_name=req.consumer_name or None,
                read_compacted=req.read_compacted,
                subscription_type=_TYPES[req.subType],
                priority_level=req.priority_level,
                negative_ack_redelivery_delay_ms=0,
            )
            consumer = WireConsumer(
                conn,
                req.consumer_id,
                name,
                req.subscription,
                info.consumer_id,
                req.read_compacted,
                shared=_TYPES[req.subType] != EXCLUSIVE,
            )
        conn.consumers[req.consumer_id] = consumer
        consumer.start()
        conn.send(pb.BaseCommand.SUCCESS, request_id=request_id)

    await conn.request(request_id, work, not_found=pb.TopicNotFound, conflict=pb.ConsumerBusy)


def _consumer(conn: PulsarConnection, consumer_id: int) -> WireSubscriber | None:
    c = conn.consumers.get(consumer_id)
    return None if c is None or c.closed else c


async def flow(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.flow
    c = _consumer(conn, req.consumer_id)
    if c is not None:  # a flow racing a close is dropped, as Pulsar does
        c.grant(req.messagePermits)


async def ack(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.ack
    c = _consumer(conn, req.consumer_id)
    error: ServiceError | None = None
    if c is not None and req.message_id:
        try:
            cumulative = req.ack_type == pb.CommandAck.Cumulative
            ids, whole = c.positions(req.message_id, cumulative=cumulative)
            await c.ack(ids, cumulative=cumulative, batches=whole)
        except ServiceError as e:
            # Pulsar ignores an ack it cannot apply (an id already acknowledged, or unknown).
            log.debug("ack from consumer %s ignored: %s", req.consumer_id, e)
            error = e
    if req.HasField("request_id"):
        fields: dict[str, object] = {"consumer_id": req.consumer_id, "request_id": req.request_id}
        if c is None:
            fields.update(error=pb.ConsumerNotFound, message=f"consumer {req.consumer_id} not found")
        elif error is not None:
            fields.update(error=pb.NotAllowedError, message=str(error))
        conn.send(pb.BaseCommand.ACK_RESPONSE, **fields)


async def redeliver(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.redeliverUnacknowledgedMessages
    c = _consumer(conn, req.consumer_id)
    if c is None:
        return
    try:
        await c.redeliver(c.positions(req.message_ids, cumulative=False, expand=True)[0])
    except ServiceError as e:
        log.debug("redelivery for consumer %s ignored: %s", req.consumer_id, e)


async def seek(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.seek
    c = _consumer(conn, req.consumer_id)

    async def work() -> None:
        if c is None:
            raise ProtocolError(pb.ConsumerNotFound, f"consumer {req.consumer_id} not found")
        if req.HasField("message_publish_time"):
            await c.seek(message_id=None, publish_time=req.message_publish_time)
        elif req.HasField("message_id"):
            await c.seek(message_id=_start_of(req.message_id, EARLIEST), publish_time=None)
        else:
            raise ProtocolError(pb.NotAllowedError, "a seek needs a message id or a publish time")
        # As Pulsar's broker: the consumer is closed, the client subscribes again at the new
        # position (a reader's is kept for it), then the seek is answered.
        conn.consumers.pop(req.consumer_id, None)
        c.close()
        if isinstance(c, WireReader):
            conn.ctx.reader_positions[(c.topic, c.subscription)] = c.position
        conn.send(pb.BaseCommand.CLOSE_CONSUMER, consumer_id=req.consumer_id, request_id=0)
        conn.send(pb.BaseCommand.SUCCESS, request_id=req.request_id)

    await conn.request(req.request_id, work, not_found=pb.TopicNotFound)


async def last_message_id(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.getLastMessageId
    c = _consumer(conn, req.consumer_id)

    async def work() -> None:
        if c is None:
            raise ProtocolError(pb.ConsumerNotFound, f"consumer {req.consumer_id} not found")
        last = await conn.call(_last_message, conn, c.topic, c.read_compacted)
        mark = await c.mark_delete()
        conn.send(
            pb.BaseCommand.GET_LAST_MESSAGE_ID_RESPONSE,
            request_id=req.request_id,
            last_message_id=last,
            consumer_mark_delete_position=id_data(mark),
        )

    await conn.request(req.request_id, work, not_found=pb.TopicNotFound)


async def consumer_stats(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.consumerStats
    c = _consumer(conn, req.consumer_id)
    if c is None:
        conn.send(
            pb.BaseCommand.CONSUMER_STATS_RESPONSE,
            request_id=req.request_id,
            error_code=pb.ConsumerNotFound,
            error_message=f"consumer {req.consumer_id} not found",
        )
        return
    conn.send(
        pb.BaseCommand.CONSUMER_STATS_RESPONSE,
        request_id=req.request_id,
        availablePermits=max(c.permits, 0),
        address=conn.peer,
        type="Reader" if isinstance(c, WireReader) else "Consumer",
    )


async def unsubscribe(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.unsubscribe
    c = _consumer(conn, req.consumer_id)

    async def work() -> None:
        if c is None:
            raise ProtocolError(pb.ConsumerNotFound, f"consumer {req.consumer_id} not found")
        if isinstance(c, WireConsumer):
            subs = conn.ctx.subscriptions
            others = await conn.call(lambda: subs.get(c.topic, c.subscription).consumer_count() - 1)
            if others and not req.force:
                raise ProtocolError(pb.ConsumerBusy, f"subscription {c.subscription!r} has other consumers")
            conn.consumers.pop(req.consumer_id, None)
            c.closed = True  # the subscription goes, and its consumers with it
            await conn.call(subs.delete, c.topic, c.subscription)
        else:
            conn.consumers.pop(req.consumer_id, None)
            c.close()
        conn.send(pb.BaseCommand.SUCCESS, request_id=req.request_id)

    await conn.request(req.request_id, work, not_found=pb.SubscriptionNotFound, conflict=pb.ConsumerBusy)


async def close_consumer(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.close_consumer
    c = conn.consumers.pop(req.consumer_id, None)
    if c is not None:
        c.close()
        # Answered once the consumer is gone, as Pulsar does: a client that subscribes again
        # right after (an Exclusive subscription) must find the subscription free.
        with contextlib.suppress(Exception):
            await c.wait_closed()
    conn.send(pb.BaseCommand.SUCCESS, request_id=req.request_id)


HANDLERS: dict[int, Handler] = {
    pb.BaseCommand.SUBSCRIBE: subscribe,
    pb.BaseCommand.FLOW: flow,
    pb.BaseCommand.ACK: ack,
    pb.BaseCommand.REDELIVER_UNACKNOWLEDGED_MESSAGES: redeliver,
    pb.BaseCommand.SEEK: seek,
    pb.BaseCommand.GET_LAST_MESSAGE_ID: last_message_id,
    pb.BaseCommand.CONSUMER_STATS: consumer_stats,
    pb.BaseCommand.UNSUBSCRIBE: unsubscribe,
    pb.BaseCommand.CLOSE_CONSUMER: close_consumer,
}
