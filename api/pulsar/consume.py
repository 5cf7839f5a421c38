"""Consumers and readers: SUBSCRIBE, FLOW, ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES, SEEK,
GET_LAST_MESSAGE_ID, UNSUBSCRIBE and CLOSE_CONSUMER, over the same topics, subscriptions, cursors
and dispatchers as REST.

- A durable subscription's consumer (``consumers.WireConsumer``) receives through
  ``SubscriptionService.receive``: the subscription's position, acknowledgements and dispatcher
  are the ones REST consumers share. Ack timeouts and negative-ack delays are the client's (it
  sends REDELIVER with the ids when due), so the service's own are off for these consumers.
- A non-durable subscription (``readers.WireReader``: Pulsar's readers) keeps its position on the
  connection and reads the log (or the compacted view) with ``Broker.read_waiting``, as Pulsar's
  non-durable cursor does: nothing of it is stored.

Both push messages as their client grants permits (``delivery.WireSubscriber``).

A SUBSCRIBE for a consumer id the connection has is answered as Pulsar's ``ServerCnx`` answers
it: SUCCESS while that consumer is there (the client's own, asked for again), and, once the
client closed it (or the broker did, for a seek), a new consumer as soon as the old one has left
its subscription -- never ConsumerBusy for the client's own consumer.

A SEEK is answered as Pulsar's broker answers it: the position is reset, the consumer is closed
from the broker's side (CLOSE_CONSUMER), then SUCCESS; the client subscribes again, at the new
position, with fresh permits, and nothing sent before the seek reaches the application.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.connection import Handler, PulsarConnection
from api.pulsar.consumers import WireConsumer
from api.pulsar.delivery import WireSubscriber
from api.pulsar.errors import ProtocolError
from api.pulsar.framing import Frame
from api.pulsar.messages import EARLIEST_ID, LATEST_ID, entry_id_data, id_data, position
from api.pulsar.non_persistent import LAST_MESSAGE_ID_REFUSED, NonPersistentConsumer
from api.pulsar.non_persistent import subscribe as non_persistent_subscribe
from api.pulsar.readers import WireReader, reader_target
from api.pulsar.schemas import consumer_schema
from ledger.entry import Position
from service.authorization import Rule
from service.errors import Conflict, ServiceError
from service.names import TopicName
from service.non_persistent import is_non_persistent
from service.subscription_types import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED
from service.topic_reads import EARLIEST, LATEST

log = logging.getLogger(__name__)

_TYPES = {
    pb.CommandSubscribe.Exclusive: EXCLUSIVE,
    pb.CommandSubscribe.Shared: SHARED,
    pb.CommandSubscribe.Failover: FAILOVER,
    pb.CommandSubscribe.Key_Shared: KEY_SHARED,
}


def _last_message(
    conn: PulsarConnection, topic: TopicName, read_compacted: bool, partition: int
) -> pb.MessageIdData:
    """The wire id of the topic's last message (-1:-1 when it has none): a batch member's names
    its batch and index, as the client's received ids do, or ``has_message_available`` would
    compare an entry with a batch and wait for a message that never comes. It names the
    topic's partition, as the ids of the messages received do (Pulsar's broker sets it here)."""
    broker = conn.ctx.broker
    last = broker.last_message_id(topic, read_compacted=read_compacted)
    if last is None:
        return id_data(Position(-1, -1), partition)
    entries, _ = broker.read_at(broker.topic(topic), last, 1, read_compacted)
    if entries and entries[0].position == last:
        return entry_id_data(entries[0], partition)
    return id_data(last, partition)


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
    if is_non_persistent(req.topic):
        await non_persistent_subscribe(conn, frame)
        return
    request_id = req.request_id

    async def work() -> None:
        if req.consumer_id in conn.consumers:
            # As Pulsar's ServerCnx.handleSubscribe: the client asks again for a consumer it
            # has (its subscribe timed out, or it reconnects a consumer the broker still holds).
            # Commands of a connection run in order, so it is never still being created here.
            log.info("consumer %s is already subscribed on %s", req.consumer_id, conn.peer)
            conn.send(pb.BaseCommand.SUCCESS, request_id=request_id)
            return
        closing = conn.closing_consumers.get(req.consumer_id)
        if closing is not None:
            # The client reconnects a consumer closed a moment ago (a seek, a close by the
            # broker): attach once the old one has left its subscription, never ConsumerBusy
            # against the client's own consumer.
            with contextlib.suppress(Exception):
                await asyncio.shield(closing)
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
                start = await conn.call(reader_target, conn, name, where, None)
            consumer = WireReader(conn, req.consumer_id, name, req.subscription, start, req.read_compacted)
        else:
            subs = ctx.subscriptions
            with contextlib.suppress(Conflict):  # it exists: the consumer attaches at its position
                await conn.call(subs.create, name, req.subscription, initial_position=initial)
            wire = WireConsumer(
                conn,
                req.consumer_id,
                name,
                req.subscription,
                "",
                req.read_compacted,
                shared=_TYPES[req.subType] != EXCLUSIVE,
            )
            info = await conn.call(
                subs.attach,
                name,
                req.subscription,
                consumer_name=req.consumer_name or None,
                read_compacted=req.read_compacted,
                subscription_type=_TYPES[req.subType],
                # Any int32, as Pulsar takes it (lower first; its Java and Go clients refuse a
                # negative level before sending it, its broker does not).
                priority_level=req.priority_level,
                negative_ack_redelivery_delay_ms=0,
                client=conn.client_info(req.metadata),
                permits_of=wire.available_permits,
                on_active_change=wire.active_changed,
            )
            wire.service_id = info.consumer_id
            consumer = wire
        conn.consumers[req.consumer_id] = consumer
        consumer.start()
        conn.send(pb.BaseCommand.SUCCESS, request_id=request_id)
        if isinstance(consumer, WireConsumer):
            consumer.subscribed()

    await conn.request(request_id, work, not_found=pb.TopicNotFound, conflict=pb.ConsumerBusy)


def _consumer(conn: PulsarConnection, consumer_id: int) -> WireSubscriber | NonPersistentConsumer | None:
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
        if isinstance(c, NonPersistentConsumer):
            # Pulsar's NonPersistentSubscription.resetCursor: done, and nothing changes.
            conn.send(pb.BaseCommand.SUCCESS, request_id=req.request_id)
            return
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
        if isinstance(c, NonPersistentConsumer):
            raise ProtocolError(pb.NotAllowedError, LAST_MESSAGE_ID_REFUSED)
        last = await conn.call(_last_message, conn, c.topic, c.read_compacted, c.partition)
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
        address=conn.address,  # "/ip:port", as Pulsar's stats write it
        type="Reader" if isinstance(c, WireReader) else "Consumer",
    )


async def unsubscribe(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.unsubscribe
    c = _consumer(conn, req.consumer_id)

    async def work() -> None:
        if c is None:
            raise ProtocolError(pb.ConsumerNotFound, f"consumer {req.consumer_id} not found")
        if isinstance(c, NonPersistentConsumer):
            c.unsubscribe()  # Conflict (ConsumerBusy) unless it is the subscription's one consumer
            conn.consumers.pop(req.consumer_id, None)
        elif isinstance(c, WireConsumer):
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
    c: WireSubscriber | NonPersistentConsumer | None = conn.consumers.pop(req.consumer_id, None)
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
