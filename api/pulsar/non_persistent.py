"""The binary protocol's side of non-persistent topics (``service.non_persistent``): PRODUCER,
SEND and SUBSCRIBE for a ``non-persistent://`` topic, and the producers and consumers the other
commands then find on the connection.

The command families branch here once, on the topic's domain (PRODUCER, SUBSCRIBE) or on the
producer's or consumer's class (SEND, SEEK, GET_LAST_MESSAGE_ID, UNSUBSCRIBE): the persistent
path pays one type check a SEND. Everything here runs on the event loop, with no worker
thread: a SEND is handed to the consumers connected now and answered at once.

What Pulsar's broker does, this does: the receipt of a SEND and every message delivered name
the id ``0:0`` (nothing is stored: there is no position to name); acks and redelivery requests
are no-ops; a SEEK is answered SUCCESS and changes nothing; readCompacted is refused with
NotAllowed. GET_LAST_MESSAGE_ID is refused with NotAllowed and Pulsar's words (Pulsar's broker
fails it with an exception that drops the whole connection, every other producer and
consumer on it too). Schemas are not registered for these topics (a producer's or consumer's
schema is taken as given), producer access modes are all Shared, and deduplication is off.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.connection import PulsarConnection
from api.pulsar.errors import ProtocolError
from api.pulsar.framing import Frame, command, encode_payload
from api.pulsar.messages import MAX_BATCH_MESSAGES, id_data, partition_index
from ledger.entry import Position
from service.authorization import Rule
from service.errors import ServiceError
from service.names import TopicName
from service.non_persistent import Consumer, Message, Producer, Subscription, Topic, parse
from service.subscription_types import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED

# The id Pulsar's broker gives every message of a non-persistent topic (NonPersistentTopic).
STORED_NOWHERE = Position(0, 0)
# A consumer's connection is behind when this much waits to be written (Pulsar's isWritable).
_WRITE_HIGH_MARK = 4 * 1024 * 1024
_TYPES = {
    pb.CommandSubscribe.Exclusive: EXCLUSIVE,
    pb.CommandSubscribe.Shared: SHARED,
    pb.CommandSubscribe.Failover: FAILOVER,
    pb.CommandSubscribe.Key_Shared: KEY_SHARED,
}
LAST_MESSAGE_ID_REFUSED = "getLastMessageId is not supported on non-persistent topic"


def topic_name(text: str) -> TopicName:
    """The parts of a ``non-persistent://`` name, or Pulsar's InvalidTopicName."""
    try:
        return parse(text)
    except ServiceError as e:
        raise ProtocolError(pb.InvalidTopicName, f"invalid topic name {text!r}: {e}") from None


async def _load(conn: PulsarConnection, text: str, rule: Rule, *, create: bool) -> Topic:
    """The topic a PRODUCER or SUBSCRIBE names, once the role may ``rule`` it and its namespace
    exists; loaded when it is not (if ``create`` and the service allow). The caller attaches
    to it before it awaits anything."""
    name = topic_name(text)
    conn.authorize(rule, name)
    ctx = conn.ctx
    await conn.call(ctx.tenants.require_namespace, tenant=name.tenant, namespace=name.namespace)
    create = create and ctx.settings.allow_auto_topic_creation
    return ctx.non_persistent.open(name, partition=partition_index(name), create=create)


class NonPersistentProducer:
    """A producer of a non-persistent topic: each SEND goes to the consumers at once."""

    def __init__(self, conn: PulsarConnection, producer_id: int, topic: Topic, record: Producer) -> None:
        self.conn = conn
        self.producer_id = producer_id
        self.topic = topic
        self.record = record
        self.closed = False

    def publish(self, frame: Frame) -> None:
        """Answer a SEND and hand it to the consumers (or refuse it, as the persistent path
        refuses the same: too large, a bad batch count, chunked or encrypted)."""
        req = frame.command.send
        md = frame.metadata
        assert md is not None
        limit = self.conn.ctx.settings.max_message_size
        size = len(frame.raw_metadata) + len(frame.payload)
        count = md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1
        if size > limit:
            self._refuse(req, f"Exceed maximum message size: {size} bytes, the limit is {limit}")
        elif not 0 < count <= MAX_BATCH_MESSAGES:
            self._refuse(req, f"a batch of {count} messages")
        elif md.HasField("num_chunks_from_msg") or md.encryption_keys:
            self._refuse(req, "chunked or encrypted messages are not supported")
        else:
            self.conn.send(
                pb.BaseCommand.SEND_RECEIPT,
                producer_id=self.producer_id,
                sequence_id=req.sequence_id,
                message_id=id_data(STORED_NOWHERE),
                highest_sequence_id=req.highest_sequence_id,
            )
            self.topic.publish(self.record, Message(frame.raw_metadata, frame.payload, count, sticky_key(md)))

    def answer(self, request_id: int) -> None:
        """PRODUCER_SUCCESS: the producer is ready (asked again by its client: the same answer)."""
        self.conn.send(
            pb.BaseCommand.PRODUCER_SUCCESS,
            request_id=request_id,
            producer_name=self.record.name,
            last_sequence_id=-1,
            schema_version=b"",
            topic_epoch=0,
            producer_ready=True,
        )

    def _refuse(self, req: pb.CommandSend, message: str) -> None:
        self.conn.send(
            pb.BaseCommand.SEND_ERROR,
            producer_id=self.producer_id,
            sequence_id=req.sequence_id,
            error=pb.NotAllowedError,
            message=message,
        )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.conn.ctx.non_persistent.remove_producer(self.topic, self.record)

    async def flush(self) -> None:
        """Nothing waits to be written: every SEND was handed on when it came."""


def sticky_key(md: pb.MessageMetadata) -> bytes | None:
    """What Key_Shared routes a message by, as Pulsar's ``peekStickyKey``: its ordering key,
    else its partition key (base64-decoded when the client says it is encoded), else none."""
    if md.HasField("ordering_key"):
        return bytes(md.ordering_key)
    if md.HasField("partition_key"):
        if md.partition_key_b64_encoded:
            try:
                return base64.b64decode(md.partition_key, validate=True)
            except (binascii.Error, ValueError):
                return md.partition_key.encode()
        return md.partition_key.encode()
    return None


class NonPersistentConsumer:
    """A consumer of a non-persistent topic: it is sent what is published while it has
    permits (``service.non_persistent.Sink``); it keeps no position."""

    read_compacted = False

    def __init__(
        self,
        conn: PulsarConnection,
        consumer_id: int,
        topic: Topic,
        subscription: Subscription,
        record: Consumer,
    ) -> None:
        self.conn = conn
        self.consumer_id = consumer_id
        self.np_topic = topic
        self.topic = topic.name
        self.np_subscription = subscription
        self.subscription = subscription.name
        self.partition = topic.partition
        self.record = record
        self.permits = 0
        self.closed = False

    # ------------------------------------------------------------------ Sink

    def writable(self) -> bool:
        transport = self.conn.transport
        return (
            not self.closed
            and not self.conn.closed
            and transport is not None
            and transport.get_write_buffer_size() <= _WRITE_HIGH_MARK
        )

    def send(self, message: Message) -> None:
        cmd = command(
            pb.BaseCommand.MESSAGE,
            consumer_id=self.consumer_id,
            message_id=id_data(STORED_NOWHERE, self.partition),
        )
        self.conn.write(encode_payload(cmd, message.metadata, message.payload))
        self.permits -= message.count

    # ------------------------------------------------------------------ what the commands call

    def start(self) -> None:
        """Nothing to start: messages are pushed by the producers' SENDs."""

    def grant(self, permits: int) -> None:
        self.permits += permits

    def positions(
        self, ids: Sequence[pb.MessageIdData], *, cumulative: bool, expand: bool = False
    ) -> tuple[list[Position], list[tuple[Position, int]]]:
        return [], []  # nothing is stored, so nothing is acknowledged

    async def ack(
        self, ids: list[Position], *, cumulative: bool, batches: list[tuple[Position, int]]
    ) -> None:
        """A no-op, as Pulsar's (NonPersistentSubscription.acknowledgeMessage)."""

    async def redeliver(self, ids: list[Position]) -> None:
        """A no-op: what was sent is not kept to be sent again."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.conn.ctx.non_persistent.detach(self.np_topic, self.np_subscription, self.record)

    async def wait_closed(self) -> None:
        """Closing is done when ``close`` returns."""

    def unsubscribe(self) -> None:
        """Remove the subscription (``Conflict`` unless this is its one consumer)."""
        self.conn.ctx.non_persistent.unsubscribe(self.np_topic, self.np_subscription, self.record)
        self.closed = True


async def producer(conn: PulsarConnection, frame: Frame) -> None:
    """PRODUCER for a non-persistent topic."""
    req = frame.command.producer
    request_id = req.request_id

    async def work() -> None:
        if req.producer_id in conn.producers:
            raise ProtocolError(
                pb.ProducerBusy, f"producer id {req.producer_id} is in use on this connection"
            )
        if req.encrypted:
            raise ProtocolError(pb.NotAllowedError, "encrypted messages are not supported")
        topic = await _load(conn, req.topic, Rule.PRODUCE, create=True)
        name = req.producer_name if req.HasField("producer_name") and req.producer_name else None
        name = name or f"compactor-np-{conn.peer}-{req.producer_id}"
        record = Producer(name=name, producer_id=req.producer_id, client=conn.client_info(req.metadata))
        conn.ctx.non_persistent.add_producer(topic, record)
        prod = conn.producers[req.producer_id] = NonPersistentProducer(conn, req.producer_id, topic, record)
        prod.answer(request_id)

    await conn.request(request_id, work, not_found=pb.TopicNotFound, conflict=pb.ProducerBusy)


async def subscribe(conn: PulsarConnection, frame: Frame) -> None:
    """SUBSCRIBE to a non-persistent topic: the consumer receives from now on."""
    req = frame.command.subscribe
    request_id = req.request_id

    async def work() -> None:
        if req.consumer_id in conn.consumers:
            raise ProtocolError(
                pb.ConsumerBusy, f"consumer id {req.consumer_id} is in use on this connection"
            )
        topic = await _load(conn, req.topic, Rule.CONSUME, create=req.force_topic_creation)
        record = Consumer(
            name=req.consumer_name or f"consumer-{req.consumer_id}",
            priority_level=req.priority_level,
            sink=_Pending(),
            client=conn.client_info(req.metadata),
        )
        sub = conn.ctx.non_persistent.subscribe(
            topic,
            req.subscription,
            record,
            subscription_type=_TYPES[req.subType],
            durable=req.durable,
            read_compacted=req.read_compacted,
        )
        consumer = NonPersistentConsumer(conn, req.consumer_id, topic, sub, record)
        record.sink = consumer
        conn.consumers[req.consumer_id] = consumer
        conn.send(pb.BaseCommand.SUCCESS, request_id=request_id)

    await conn.request(request_id, work, not_found=pb.TopicNotFound, conflict=pb.ConsumerBusy)


class _Pending:
    """The sink of a consumer being attached: it takes nothing (no permits yet)."""

    permits = 0

    def writable(self) -> bool:
        return False

    def send(self, message: Message) -> None:
        raise AssertionError("a consumer without permits is sent nothing")
