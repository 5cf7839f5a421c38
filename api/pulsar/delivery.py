"""What durable consumers and readers share on the wire (``WireSubscriber``): permits, the
delivery task, MESSAGE frames, and the positions a client's acknowledgements name.

Pulsar pushes: a consumer grants permits (FLOW) and the broker sends that many messages. Each
consumer has one delivery task that asks for up to its permits (a read on a worker thread) and
writes them as MESSAGE frames. When there is nothing to send, it waits for the topic's next
append. Up to a quarter of the worker threads, consumers wait on a worker thread, inside the read
(the shortest way from an append to the consumer); the others wait on the event loop, holding no
thread (``ManagedLedger.on_entry_after``, their own redelivery requests and acks, and on
subscriptions that others share a short poll for messages given back), so that a client of a
topic of hundreds of partitions, which waits on each one, cannot take every thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import cast

from api.pulsar import encryption
from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.bounded import BoundedDict
from api.pulsar.connection import PulsarConnection
from api.pulsar.framing import command, encode_payload
from api.pulsar.messages import (
    batch_message,
    entry_frame,
    entry_metadata,
    id_data,
    partition_index,
    position,
    stored_message,
)
from ledger.entry import ENCRYPTION_PROPERTY, BatchEntry, Entry, LedgerItem, Position, StoredBatch
from service.chunked import CHUNK_PROPERTY
from service.errors import NotFound, NotOwner, OwnershipLost, Unavailable
from service.names import TopicName
from service.pending_runs import members_of

log = logging.getLogger(__name__)
_tuple_new = tuple.__new__

# Messages asked for at once, and how long one ask waits for the first.
_PAGE = 1000
# Messages a consumer that reads ahead asks for at once: a read costs much the same for a
# batch as for ten (a sealed ledger's read ~0.5 us a message in pages of 1,000, ~0.35 in 4,000).
_READ_AHEAD_PAGE = 4 * _PAGE
POLL_S = 1.0
# The CONNECT ``client_version`` of the clients that know no REACHED_END_OF_TOPIC: Go's
# (``Pulsar-Go-v0.19.0``) and the C++ library's, which the Python client is (``Pulsar-CPP-v4.2.0``).
WITHOUT_END_OF_TOPIC = ("Pulsar-Go", "Pulsar-CPP")
# Batches a consumer remembers sending until they are acknowledged (the oldest forgotten first:
# an ack of a forgotten batch then acknowledges the batch's first member only).
_MAX_BATCHES = 100_000


@dataclass(frozen=True)
class Page:
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
        # The partition every id this consumer is sent names (-1 unless the topic is a partition).
        self.partition = partition_index(topic)
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
        # Whether the client was told it read a terminated topic to its end.
        self.reached_end = False

    def nudge(self) -> None:
        """Cut a wait short: something may be there to send (a redelivery asked for)."""
        self._nudged.set()

    async def _wait(self, after: Position, timeout_s: float, wakes: int | None = None) -> None:
        """Until the topic has an entry after ``after``, the consumer is nudged or closed, or
        ``timeout_s`` passes; given ``wakes`` (the ledger's, read before the consumer looked),
        also when messages were given back since (``ManagedLedger.wake``). On the event loop,
        holding no worker thread."""
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

        cancel = topic.ledger.on_entry_after(after, wake, wakes) if topic is not None else None
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

    def _wakes(self) -> int | None:
        """The topic's count of wakes (see ``_wait``), None when it is not served here."""
        topic = self.conn.ctx.broker.served(self.topic)
        return topic.ledger.wakes if topic is not None else None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._deliver())

    def grant(self, permits: int) -> None:
        self.permits += permits
        if self.permits > 0:
            self._permitted.set()

    async def _fetch(self, limit: int) -> Page:
        raise NotImplementedError

    async def _idle(self) -> None:
        """Called while the consumer has no permits for a while."""

    async def _deliver(self) -> None:
        conn = self.conn
        idle_s = max(0.05, conn.ctx.settings.consumer_timeout_ms / 3000)
        loop = asyncio.get_running_loop()
        # The next page, read while the previous one was written or the client had no permits:
        # a FLOW is then answered at once, not after a read on a worker thread.
        ahead: asyncio.Task[Page] | None = None
        # Reading ahead, a page of several FLOWs' worth, sent as permits come: the page and the
        # index of its next item.
        held: tuple[Page, int] | None = None
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
                if not page.entries and not self.reached_end:
                    self._tell_end_of_topic()
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

    def _tell_end_of_topic(self) -> None:
        """A read found nothing more: on a terminated topic whose messages the consumer has all
        consumed, that is its end, and the client is told so once (REACHED_END_OF_TOPIC, as
        Pulsar's dispatchers send it: Java's ``hasReachedEndOfTopic`` turns true). Not to the
        Go and C++ (Python) clients: they know no such command and close their connection on
        it (Pulsar 4.0.7 sends it to them all the same, and they reconnect)."""
        topic = self.conn.ctx.broker.served(self.topic)
        if topic is None or topic.ledger.terminated is None or not self._consumed_all():
            return
        self.reached_end = True
        if not self.conn.client_version.startswith(WITHOUT_END_OF_TOPIC):
            self.conn.send(pb.BaseCommand.REACHED_END_OF_TOPIC, consumer_id=self.consumer_id)

    def _consumed_all(self) -> bool:
        """Whether nothing is left for this consumer (a reader: what it read is consumed)."""
        return True

    def _page_size(self) -> int:
        """Messages to ask for: what the client's permits allow (never more: on a subscription
        others share, what one consumer takes the others cannot have); reading ahead, several
        FLOWs' worth (:data:`_READ_AHEAD_PAGE`)."""
        return _READ_AHEAD_PAGE if self.read_ahead else min(self.permits, _PAGE)

    def _send(self, page: Page, start: int, permits: int | None) -> tuple[int, int]:
        """Write ``page``'s items from ``start`` on as MESSAGE frames, the members of one
        stored batch as one batch message (see ``messages.batch_message``), while ``permits``
        last (all of them when None); returns the permits spent (a batch's whole size for a
        batch, as the client counts it) and the index of the first item not sent."""
        entries, counts = page.entries, page.redelivery_counts
        partition = self.partition
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
                    message_id=id_data(first, partition),
                    redelivery_count=counts[i] if counts else 0,
                )
                self.conn.write(encode_payload(cmd, *stored_message(batch)))
                spent += batch.count
                i += 1
                continue
            e = item
            if e.batch_index is None:
                cmd = command(
                    pb.BaseCommand.MESSAGE,
                    consumer_id=self.consumer_id,
                    message_id=id_data(e.position, partition),
                    redelivery_count=counts[i] if counts else 0,
                )
                if e.properties and (ENCRYPTION_PROPERTY in e.properties or CHUNK_PROPERTY in e.properties):
                    # A chunk of a chunked message (its own bytes and chunk fields), or an
                    # encrypted message (its context and ciphertext).
                    self.conn.write(encode_payload(cmd, *entry_frame(e)))
                else:
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
                metadata, payload = stored_message(stored)
                mid, ack_set = id_data(first, partition), []
            elif e.properties and ENCRYPTION_PROPERTY in e.properties:
                # An encrypted batch: its first member holds the whole ciphertext.
                head = e if e.batch_index == 0 else self._first_member(first)
                mid, metadata, payload, ack_set = encryption.batch_message(members, head, partition)
            else:
                mid, metadata, payload, ack_set = batch_message(members, partition)
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

    def _first_member(self, first: Position) -> Entry:
        """The first member of a stored batch (for an encrypted batch whose read began after it:
        it holds the batch's ciphertext). Read on the event loop: only such a read needs it."""
        broker = self.conn.ctx.broker
        entries, _ = broker.read_at(broker.topic(self.topic), first, 1, False)
        if not entries or type(entries[0]) is not Entry or entries[0].position != first:
            raise NotFound(f"the first message of the encrypted batch at {first} is gone")
        return entries[0]

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


def _retrieve(task: asyncio.Task[Page]) -> None:
    """Take a dropped read's outcome, so that its error is not reported as never retrieved."""
    if not task.cancelled():
        task.exception()


def _bit(words: Sequence[int], i: int) -> bool:
    """Bit ``i`` of a wire bit set (int64 words, least significant bit first); past its end, set."""
    return i // 64 >= len(words) or bool((words[i // 64] >> (i % 64)) & 1)
