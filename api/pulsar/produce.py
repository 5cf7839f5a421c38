"""Producers: PRODUCER, SEND and CLOSE_PRODUCER.

Each producer writes through one task: the SENDs that arrive while a write is in flight are
appended together in the next ``Broker.produce`` call (a group commit under the fsync policy),
and their receipts go back in the order the client sent them.

A batched SEND is stored whole, as sent (``ledger.entry.StoredBatch``: one write-ahead frame for
all its members); the event loop never looks at its members. They are checked in bulk on the
worker thread that writes them, and a batch that does not decode gets its SEND_ERROR there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.chunks import ChunkAssembly, chunk_record
from api.pulsar.connection import BrokerContext, Handler, PulsarConnection
from api.pulsar.errors import ProtocolClose, ProtocolError, server_error
from api.pulsar.framing import Frame
from api.pulsar.messages import check_batch, id_data, is_batch, to_batch, to_records
from api.pulsar.non_persistent import NonPersistentProducer
from api.pulsar.non_persistent import producer as non_persistent_producer
from api.pulsar.schemas import producer_schema
from ledger.entry import Entry, Position, Record, StoredBatch, record_size
from service.authorization import Rule
from service.backlog_quota_checks import producer_refusal
from service.chunked import fields_of
from service.clock import now_ms
from service.deduplication import ProducerSequences
from service.errors import Conflict, ServiceError, TopicTerminated
from service.names import TopicName
from service.non_persistent import is_non_persistent
from service.publishers import ClientInfo, Publisher
from service.subscription_service import RESERVED_PREFIX
from service.topic_reads import EARLIEST

log = logging.getLogger(__name__)

# Sends one producer may have waiting for their write before the connection stops reading.
MAX_PENDING_SENDS = 10_000
_names = itertools.count()
# Pulsar's ProducerAccessMode names, as its stats write them.
_MODES = {
    pb.Shared: "Shared",
    pb.Exclusive: "Exclusive",
    pb.WaitForExclusive: "WaitForExclusive",
    pb.ExclusiveWithFencing: "ExclusiveWithFencing",
}


@dataclass(slots=True)
class _Send:
    sequence_id: int
    highest_sequence_id: int
    item: Record | StoredBatch  # one message, or a whole batch


def _highest(s: _Send) -> int:
    """The last sequence id a send covers (a batch's last member's, numbered from its first as
    the clients number them: they do not all set ``highest_sequence_id``)."""
    item = s.item
    last = item.sequence_id + item.count - 1 if type(item) is StoredBatch else item.sequence_id or 0  # type: ignore[union-attr]
    return max(s.sequence_id, s.highest_sequence_id, last)


def _partial_chunk(s: _Send) -> bool:
    """Whether a send is a chunk of a chunked message other than its last (chunks share their
    message's sequence id: only its last one counts for deduplication, as in Pulsar; its record
    has no sequence id, see ``service.chunked``)."""
    item = s.item
    return type(item) is Record and item.sequence_id is None and fields_of(item.properties) is not None


class WireProducer:
    """A producer of one connection, writing to one topic. With deduplication on
    (``sequences``), a send whose sequence id is not above the highest stored from this
    producer's name is not stored again: its receipt names no message (-1:-1), as Pulsar's."""

    def __init__(
        self,
        conn: PulsarConnection,
        producer_id: int,
        name: TopicName,
        producer_name: str,
        mode: int,
        sequences: ProducerSequences | None = None,
    ) -> None:
        self.conn = conn
        self.producer_id = producer_id
        self.topic = name
        self.name = producer_name
        self.mode = mode
        self.sequences = sequences
        # The version of the topic's schema this producer declared (None: raw bytes).
        self.schema_version: bytes | None = None
        # Whether the producer declared it encrypts (``api.pulsar.encryption``): then every
        # message must carry its encryption keys, as Pulsar's broker requires.
        self.encrypted = False
        # Who sent it and when (the topic's stats), and the topic epoch it holds once ready.
        self.client = ClientInfo()
        self.epoch = 0
        self.pending: list[_Send] = []
        self.closed = False
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        # Set once the producer sends a chunk: its writes then follow its chunked messages.
        self.chunks: ChunkAssembly | None = None

    def start(self) -> None:
        """Write what is sent, once the producer has its access to the topic."""
        self._task = asyncio.get_running_loop().create_task(self._write())

    @property
    def ready(self) -> bool:
        """Whether the producer has its access to the topic (a WaitForExclusive one may wait)."""
        return self._task is not None

    async def add(self, send: _Send) -> None:
        self.pending.append(send)
        self._idle.clear()
        self._wake.set()
        if len(self.pending) >= MAX_PENDING_SENDS:
            self._room.clear()
            await self._room.wait()

    async def _write(self) -> None:
        conn = self.conn
        while True:
            if not self.pending:
                self._idle.set()
                if self.closed:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            batch, self.pending = self.pending, []
            self._room.set()
            if self.sequences is not None:
                batch = self._new_sends(batch)
                if not batch:
                    continue
            try:
                batch, refused, positions = await conn.call(self._store, batch)
            except Exception as e:
                if not isinstance(e, (ServiceError, ProtocolError)):
                    log.exception("writing to %s failed", self.topic)
                code = server_error(e, not_found=pb.TopicNotFound)
                for s in batch:
                    self._send_error(s, code, str(e))
                continue
            for s, error in refused:
                self._send_error(s, error.code, str(error))
            if self.sequences is not None:
                stored = batch if self.chunks is None else [s for s in batch if not _partial_chunk(s)]
                self.sequences.stored(self.name, (_highest(s) for s in stored))
            for s, at in zip(batch, positions, strict=True):
                # A batch's receipt names its first member's entry: the client numbers the rest.
                conn.send(
                    pb.BaseCommand.SEND_RECEIPT,
                    producer_id=self.producer_id,
                    sequence_id=s.sequence_id,
                    message_id=id_data(at),
                    highest_sequence_id=s.highest_sequence_id,
                )

    def _store(
        self, sends: list[_Send]
    ) -> tuple[list[_Send], list[tuple[_Send, ProtocolError]], list[Position]]:
        """On a worker thread: check the batches' members (in bulk), then write every send that
        passed in one append; returns those, the refused ones with why, and the stored ids."""
        limit = self.conn.ctx.settings.max_message_size
        good: list[_Send] = []
        refused: list[tuple[_Send, ProtocolError]] = []
        for s in sends:
            if type(s.item) is StoredBatch and s.item.size < 0:
                try:
                    check_batch(s.item, limit)
                except ProtocolError as e:
                    refused.append((s, e))
                    continue
            good.append(s)
        if not good:
            return good, refused, []
        if self.chunks is not None:
            return good, refused, self._store_chunked(good, self.chunks)
        return good, refused, self.conn.ctx.broker.produce(self.topic, [s.item for s in good])

    def _store_chunked(self, sends: list[_Send], chunks: ChunkAssembly) -> list[Position]:
        """Write ``sends`` of a producer that sends chunked messages: as one append, except
        that the last chunk of a message whose earlier chunks are in ``sends`` waits for them
        to be written, then reads them back to become the message's record
        (``ChunkAssembly.complete``)."""
        broker = self.conn.ctx.broker
        positions: list[Position] = []
        run: list[_Send] = []
        followed: set[int] = set()  # the sends of ``run`` that are chunks ``chunks`` follows

        def write() -> None:
            if not run:
                return
            at = broker.produce(self.topic, [s.item for s in run])
            for s, p in zip(run, at, strict=True):
                if id(s) in followed:
                    chunks.stored(p)
            positions.extend(at)
            run.clear()
            followed.clear()

        def read(at: Position) -> Entry | None:
            entries, _ = broker.read_at(broker.topic(self.topic), at, 1, False)
            return entries[0] if entries else None

        for s in sends:
            item = s.item
            fields = fields_of(item.properties) if type(item) is Record and item.properties else None
            if fields is None:
                run.append(s)
                continue
            if followed and fields.chunk_id == 0:
                write()  # the chunks of a message left unfinished go before a new one's
            last = chunks.take(fields)
            if fields.chunk_id < fields.num_chunks - 1 and chunks.uuid is not None:
                followed.add(id(s))
            if last:
                write()  # the earlier chunks first: stored, with their ids
                chunks.complete(item, fields, read)  # type: ignore[arg-type]
            run.append(s)
        write()
        return positions

    def _send_error(self, s: _Send, code: int, message: str) -> None:
        self.conn.send(
            pb.BaseCommand.SEND_ERROR,
            producer_id=self.producer_id,
            sequence_id=s.sequence_id,
            error=code,
            message=message,
        )

    def _new_sends(self, batch: list[_Send]) -> list[_Send]:
        """The sends of ``batch`` not stored before (Pulsar's rule: a sequence id above the
        highest stored); the others get their receipt now."""
        assert self.sequences is not None
        last = self.sequences.last(self.name)
        fresh: list[_Send] = []
        for s in batch:
            if self.chunks is not None and _partial_chunk(s):
                fresh.append(s)
                continue
            if s.sequence_id <= last:
                self.conn.send(
                    pb.BaseCommand.SEND_RECEIPT,
                    producer_id=self.producer_id,
                    sequence_id=s.sequence_id,
                    message_id=id_data(Position(-1, -1)),
                    highest_sequence_id=s.highest_sequence_id,
                )
                continue
            fresh.append(s)
            last = max(last, _highest(s))
        return fresh

    async def flush(self) -> None:
        await self._idle.wait()

    def close(self) -> None:
        """Stop once what is pending is written (a lost connection's sends are still stored,
        as their receipts may simply not have reached the client), and give up the topic."""
        self._stop()
        self.conn.ctx.access.release(self.topic, self)
        self.conn.ctx.broker.publishers.remove(self.topic, self)

    def fence(self) -> None:
        """An ExclusiveWithFencing producer took the topic: close this one on the client's side."""
        self._stop()
        self.conn.ctx.broker.publishers.remove(self.topic, self)
        if self.conn.producers.get(self.producer_id) is self:
            del self.conn.producers[self.producer_id]
            self.conn.closed_producers[self.producer_id] = True
            self.conn.send(pb.BaseCommand.CLOSE_PRODUCER, producer_id=self.producer_id, request_id=0)

    def _stop(self) -> None:
        self.closed = True
        self._wake.set()
        if self._task is None:
            self._idle.set()


def disconnect_producers(ctx: BrokerContext, name: TopicName) -> None:
    """Close every producer of ``name`` on its client's side (CLOSE_PRODUCER): the client
    connects it again, and is checked again as it does (a backlog quota)."""
    for conn in list(ctx.connections):
        for producer_id, prod in list(conn.producers.items()):
            if isinstance(prod, WireProducer) and prod.topic == name and not prod.closed:
                del conn.producers[producer_id]
                conn.closed_producers[producer_id] = True
                prod.close()
                conn.send(pb.BaseCommand.CLOSE_PRODUCER, producer_id=producer_id, request_id=0)


def _admit(conn: PulsarConnection, name: TopicName) -> None:
    """Refuse a producer of a terminated topic (TopicTerminatedError), or of one over a
    backlog quota whose policy holds or refuses producers (ProducerBlockedQuotaExceeded*)."""
    ctx = conn.ctx
    topic = ctx.broker.topic(name)
    if topic.ledger.terminated is not None:
        raise TopicTerminated(f"topic {name} is terminated: it takes no more messages")
    if ctx.quotas is not None:
        refusal = producer_refusal(topic, ctx.quotas.effective(name), now_ms())
        if refusal is not None:
            raise refusal


async def producer(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.producer
    request_id = req.request_id
    conn.closed_producers.pop(req.producer_id, None)
    existing = conn.producers.get(req.producer_id)
    if existing is not None:

        async def answer() -> None:
            again(conn, existing, request_id)

        await conn.request(request_id, answer)
        return
    if is_non_persistent(req.topic):
        await non_persistent_producer(conn, frame)
        return

    async def work() -> None:
        name = await conn.use_topic(req.topic, Rule.PRODUCE, create=True)
        await conn.call(_admit, conn, name)
        initial = req.initial_subscription_name if req.HasField("initial_subscription_name") else ""
        if initial:
            # As Pulsar's broker: the role must also be allowed to subscribe, to create it.
            conn.authorize(Rule.CONSUME, name)
        ctx = conn.ctx
        producer_name = req.producer_name if req.HasField("producer_name") and req.producer_name else None
        producer_name = producer_name or f"compactor-{next(_names)}"
        schema_version = await producer_schema(conn, name, req.schema if req.HasField("schema") else None)
        if initial:  # once the schema is accepted, before the producer is (Pulsar's order)
            await conn.call(initial_subscription, conn, name, initial)
        sequences = await conn.call(_sequences, conn, name)
        prod = WireProducer(conn, req.producer_id, name, producer_name, req.producer_access_mode, sequences)
        prod.schema_version = schema_version
        prod.encrypted = req.encrypted
        prod.client = conn.client_info(req.metadata)
        got = ctx.access.acquire(name, prod, epoch=req.topic_epoch if req.HasField("topic_epoch") else None)
        conn.producers[req.producer_id] = prod
        if isinstance(got, asyncio.Future):
            # WaitForExclusive behind another producer: the client waits for a second answer.
            conn.send(
                pb.BaseCommand.PRODUCER_SUCCESS,
                request_id=request_id,
                producer_name=producer_name,
                schema_version=schema_version or b"",
                producer_ready=False,
            )
            asyncio.get_running_loop().create_task(_when_granted(prod, got, request_id))
            return
        _ready(prod, request_id, got)

    await conn.request(request_id, work, not_found=pb.TopicNotFound, conflict=pb.ProducerBusy)


def again(conn: PulsarConnection, existing: WireProducer | NonPersistentProducer, request_id: int) -> None:
    """A PRODUCER for an id the connection has: the client's own producer, asked again after a
    reconnection or a timeout. As Pulsar's ServerCnx.handleProducer: one created is created
    again (the same name, the same answer); one still waiting for its topic (WaitForExclusive)
    is ServiceNotReady, and the client retries."""
    if isinstance(existing, NonPersistentProducer):
        existing.answer(request_id)
        return
    if not existing.ready:
        raise ProtocolError(pb.ServiceNotReady, "Producer is already present on the connection")
    _success(existing, request_id, existing.epoch)


def initial_subscription(conn: PulsarConnection, name: TopicName, subscription: str) -> None:
    """Create ``subscription`` at the earliest position unless the topic has it (a producer's
    ``initial_subscription_name``, as a dead letter topic's producer sends it): the messages
    are kept for it from the first one. The service always allows a subscription to be made
    on first use (Pulsar's ``allowAutoSubscriptionCreation``, true by default)."""
    if subscription.startswith(RESERVED_PREFIX):
        raise ProtocolError(pb.NotAllowedError, f"subscription name {subscription!r} is reserved")
    subs = conn.ctx.subscriptions
    if subscription in subs.names(name):
        return
    with contextlib.suppress(Conflict):  # made meanwhile by a consumer or another producer
        subs.create(name, subscription, initial_position=EARLIEST)


def _sequences(conn: PulsarConnection, name: TopicName) -> ProducerSequences | None:
    """The topic's deduplication state when its policy turns deduplication on, else None."""
    if not conn.ctx.policies.effective(name).deduplicationEnabled:
        return None
    return conn.ctx.broker.producer_sequences(name)


def _ready(prod: WireProducer, request_id: int, epoch: int) -> None:
    prod.start()
    prod.epoch = epoch
    prod.conn.ctx.broker.publishers.add(
        prod.topic, prod, Publisher(prod.producer_id, prod.name, _MODES.get(prod.mode, "Shared"), prod.client)
    )
    _success(prod, request_id, epoch)


def _success(prod: WireProducer, request_id: int, epoch: int) -> None:
    prod.conn.send(
        pb.BaseCommand.PRODUCER_SUCCESS,
        request_id=request_id,
        producer_name=prod.name,
        # Where a deduplicating producer resumes (-1 without deduplication, as Pulsar).
        last_sequence_id=prod.sequences.last(prod.name) if prod.sequences is not None else -1,
        # Empty without a schema, as Pulsar's broker sends it: the Java client reads it unguarded.
        schema_version=prod.schema_version or b"",
        topic_epoch=epoch,
        producer_ready=True,
    )


async def _when_granted(prod: WireProducer, granted: asyncio.Future[int], request_id: int) -> None:
    try:
        epoch = await granted
    except asyncio.CancelledError:
        return  # closed while it waited
    if prod.closed or prod.conn.closed:
        prod.conn.ctx.access.release(prod.topic, prod)
        return
    _ready(prod, request_id, epoch)


async def send(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.send
    prod: WireProducer | NonPersistentProducer | None = conn.producers.get(req.producer_id)
    if prod is None or prod.closed:
        if req.producer_id in conn.closed_producers:
            return  # sent before the client heard its CLOSE_PRODUCER: it sends it again
        # Pulsar closes a connection that sends for a producer it does not have.
        raise ProtocolClose(f"SEND for unknown producer {req.producer_id}")
    if frame.metadata is None:
        raise ProtocolClose("SEND without a payload")
    if isinstance(prod, NonPersistentProducer):
        prod.publish(frame)  # handed to the consumers connected now, stored nowhere
        return
    limit = conn.ctx.settings.max_message_size
    try:
        md = frame.metadata
        item: Record | StoredBatch
        if prod.encrypted and not md.encryption_keys:
            raise ProtocolError(pb.MetadataError, "the producer is encrypted; the message is not")
        if is_batch(md):
            # Its members lie within its uncompressed payload, which may not expand past the
            # limit: checked with them, off the event loop.
            item = to_batch(md, frame.raw_metadata, frame.payload)
        elif md.num_chunks_from_msg > 1:
            # A chunk of a chunked message: stored as sent (``api.pulsar.chunks``).
            item = chunk_record(md, frame.payload, limit, conn.ctx.settings.max_chunked_message_size)
            if prod.chunks is None:
                prod.chunks = ChunkAssembly()
        else:
            (item,) = to_records(md, frame.payload, limit)
            size = record_size(item.key, item.value, item.properties)
            if size > limit:
                raise ProtocolError(pb.NotAllowedError, f"message is {size} bytes; the limit is {limit}")
    except ProtocolError as e:
        conn.send(
            pb.BaseCommand.SEND_ERROR,
            producer_id=req.producer_id,
            sequence_id=req.sequence_id,
            error=e.code,
            message=str(e),
        )
        return
    await prod.add(_Send(req.sequence_id, req.highest_sequence_id, item))


async def close_producer(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.close_producer
    prod: WireProducer | NonPersistentProducer | None = conn.producers.pop(req.producer_id, None)
    if prod is not None:
        prod.close()
        await prod.flush()
    conn.send(pb.BaseCommand.SUCCESS, request_id=req.request_id)


HANDLERS: dict[int, Handler] = {
    pb.BaseCommand.PRODUCER: producer,
    pb.BaseCommand.SEND: send,
    pb.BaseCommand.CLOSE_PRODUCER: close_producer,
}
