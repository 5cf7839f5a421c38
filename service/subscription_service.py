"""The verbs of durable subscriptions and their consumers: creating and deleting subscriptions,
attaching consumers of Pulsar's four subscription types, receiving, acknowledging, negative
acknowledgements, redelivery and seeks.

A subscription's type is fixed by its first consumer and holds while it has consumers (then
the next first consumer chooses again), as in Pulsar. Exclusive has one consumer; Failover
has several, of which one is active (chosen as Pulsar chooses it: ``service.failover``) and the
others wait, each told when it becomes or stops being the active one; both deliver through the
rewinding cursor of ``service.subscriptions``. Shared and Key_Shared deliver to several
consumers through ``service.dispatchers.Dispatcher``; a Shared subscription gives messages to
the consumers of the highest priority level that can take them first (``deliveries``).

Whatever gives messages back to be delivered again (a negative acknowledgement, a redelivery, a
consumer gone, a new active consumer) wakes the topic's waiting receives at once
(``ManagedLedger.wake``): they would otherwise see it only at their next poll.

As in Pulsar, ``readCompacted`` belongs to the consumer, chosen when it attaches: the
subscription holds only the position and the acknowledgements, which consumers of either
kind share. A readCompacted consumer reads the compacted ledger up to the horizon, then the
log; another reads the whole log after the same position.

The subscription's state is ``service.subscriptions.Subscription``; the pages it delivers are
made in ``service.deliveries``, and its cursor is written by ``service.cursor_store``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence

from ledger.entry import Position
from service.cursor_store import (
    COMPACTION_CURSOR,
    delete_cursor,
    insert_cursor,
    load_subscriptions,
    save_cursor,
)
from service.dead_letters import make_policy
from service.deliveries import Delivery, deliver_in_order, deliver_shared, expire_nacks
from service.dispatchers import Dispatcher
from service.errors import Conflict, InvalidInput, NotFound
from service.failover import active_index
from service.managed_topic import ManagedTopic
from service.names import TopicName, partition_of
from service.negative_acks import DEFAULT_DELAY_MS
from service.pending_runs import members_of
from service.publishers import ClientInfo
from service.subscription_stats import SubscriptionStats, subscription_backlog, subscription_stats
from service.subscription_types import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, SUBSCRIPTION_TYPES
from service.subscriptions import NOTHING, ConsumerInfo, Subscription, before
from service.topic_reads import EARLIEST, LATEST
from service.topics import Broker

RESERVED_PREFIX = "__"
MAX_WAIT_MS = 30_000
# A receive that waits on a subscription with several consumers looks again this often: what
# it waits for may come from another consumer (a close, an ack, a redelivery), not the log.
_SHARED_POLL_S = 0.05


def check_subscription_name(name: str) -> str:
    if not name or len(name) > 256 or any(c in name for c in "/\\\x00") or name in (".", ".."):
        raise InvalidInput(f"invalid subscription name {name!r}")
    return name


class SubscriptionService:
    """The verbs of subscriptions and consumers, over the broker's topics."""

    def __init__(self, *, broker: Broker, consumer_timeout_ms: int = 30_000) -> None:
        self.broker = broker
        self.db = broker.db
        self.consumer_timeout_s = consumer_timeout_ms / 1000
        self._lock = threading.Lock()  # creation and deletion of subscriptions
        self._seq = 0  # consumers attached, for Failover's order

    # ---------------------------------------------------------------- loading

    def start(self) -> None:
        """Load every durable subscription of each topic as it is loaded; reading resumes just
        after its mark-delete position."""
        self.broker.on_load(self._load_topic)

    def _load_topic(self, topic: ManagedTopic) -> None:
        load_subscriptions(self.db, topic)

    # ---------------------------------------------------------------- admin

    def create(self, name: TopicName, sub: str, *, initial_position: str = LATEST) -> None:
        check_subscription_name(sub)
        if sub.startswith(RESERVED_PREFIX):
            raise Conflict(f"subscription name {sub!r} is reserved")
        if initial_position not in (EARLIEST, LATEST):
            raise InvalidInput("initialPosition must be 'earliest' or 'latest'")
        topic = self.broker.topic(name)
        with self._lock:
            if sub in topic.subscriptions:
                raise Conflict(f"subscription {sub!r} already exists on {name}")
            md = NOTHING if initial_position == EARLIEST else before(topic.ledger.end_position())
            cursor_id = insert_cursor(self.db, topic, sub, md)
            topic.subscriptions[sub] = Subscription(
                cursor_id=cursor_id,
                name=sub,
                topic=topic,
                mark_delete=md,
                acked=set(),
            )

    def delete(self, name: TopicName, sub: str) -> None:
        if sub == COMPACTION_CURSOR:
            raise Conflict("the __compaction cursor belongs to the compactor and cannot be deleted")
        state = self.get(name, sub)
        with self._lock:
            state.topic.subscriptions.pop(sub, None)
        delete_cursor(self.db, state)

    def names(self, name: TopicName) -> list[str]:
        return sorted(self.broker.topic(name).subscriptions)

    def get(self, name: TopicName, sub: str) -> Subscription:
        state = self.broker.topic(name).subscriptions.get(sub)
        if state is None:
            if sub == COMPACTION_CURSOR:
                raise Conflict("the __compaction cursor belongs to the compactor; clients cannot use it")
            raise NotFound(f"subscription {sub!r} not found on {name}")
        return state

    # ---------------------------------------------------------------- consumers

    def attach(
        self,
        name: TopicName,
        sub: str,
        *,
        consumer_name: str | None = None,
        ack_timeout_ms: int = 0,
        read_compacted: bool = False,
        subscription_type: str = EXCLUSIVE,
        priority_level: int = 0,
        negative_ack_redelivery_delay_ms: int = DEFAULT_DELAY_MS,
        dead_letter: tuple[int, str | None] | None = None,
        client: ClientInfo | None = None,
        permits_of: Callable[[], int] | None = None,
        on_active_change: Callable[[bool], None] | None = None,
    ) -> ConsumerInfo:
        """Attach a consumer of ``subscription_type``. The first consumer fixes the type; one of
        another type gets 409 while the subscription has consumers, and so does a second
        Exclusive consumer. The consumer reads the compacted view or the whole log
        (``read_compacted``, Exclusive and Failover only) from the subscription's position; a
        subscription's first consumer (and Failover's new active one) gets every
        unacknowledged message again. ``dead_letter`` is ``(maxRedeliverCount, topic or None)``;
        ``client`` is what stats show of the consumer's client."""
        if ack_timeout_ms < 0:
            raise InvalidInput("ackTimeoutMs must be >= 0")
        if negative_ack_redelivery_delay_ms < 0:
            raise InvalidInput("negativeAckRedeliveryDelayMs must be >= 0")
        if subscription_type not in SUBSCRIPTION_TYPES:
            raise InvalidInput(f"subscriptionType must be one of {', '.join(SUBSCRIPTION_TYPES)}")
        multi = subscription_type in (SHARED, KEY_SHARED)
        if read_compacted and multi:
            # Pulsar's words (PersistentTopic.subscribe).
            raise InvalidInput("readCompacted only allowed on failover or exclusive subscriptions")
        policy = None
        if dead_letter is not None:
            if not multi:
                raise InvalidInput(
                    "a dead letter policy needs a Shared or Key_Shared subscription (as in Pulsar: the "
                    "others redeliver every unacknowledged message, in order)"
                )
            policy = make_policy(name, sub, dead_letter[0], dead_letter[1])
        state = self.get(name, sub)
        with state.lock:
            current = self._live_type(state)
            if current == EXCLUSIVE:
                assert state.consumer is not None
                raise Conflict(
                    f"subscription {sub!r} already has an active consumer ({state.consumer.name}); "
                    "it is exclusive"
                )
            if current is not None and current != subscription_type:
                raise Conflict(
                    f"Subscription is of different type: {sub!r} has {current} consumers, "
                    f"not {subscription_type}"
                )
            self._seq += 1
            info = ConsumerInfo(
                consumer_id=uuid.uuid4().hex,
                name=consumer_name or "consumer",
                ack_timeout_ms=ack_timeout_ms,
                read_compacted=read_compacted,
                subscription_type=subscription_type,
                priority_level=priority_level,
                negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                dead_letter=policy,
                seq=self._seq,
                client=client or ClientInfo(),
                permits_of=permits_of,
                on_active_change=on_active_change,
            )
            if subscription_type == EXCLUSIVE:
                state.consumer = info
                state.type = EXCLUSIVE
                state.read_compacted = read_compacted
                state.rewind()  # a new consumer gets every unacknowledged message
                return info
            if current is None:  # the first consumer: start from the subscription's position
                state.consumer = None
                state.consumers = {}
                state.dispatcher = Dispatcher(key_shared=subscription_type == KEY_SHARED) if multi else None
                state.rewind()
                state.read_compacted = False
            if state.dispatcher is not None:
                # 409 when no hash range is left
                state.dispatcher.add_consumer(info.consumer_id, priority_level)
            state.consumers[info.consumer_id] = info
            state.type = subscription_type
            if subscription_type == FAILOVER:
                self._elect(state, joined=info)
            return info

    def _live_type(self, state: Subscription) -> str | None:
        """The subscription's type as its live consumers fix it; consumers silent for the
        consumer timeout are detached first (their messages go to the others)."""
        now = time.monotonic()
        if state.type == EXCLUSIVE:
            c = state.consumer
            if c is None or now - c.last_seen >= self.consumer_timeout_s:
                if c is not None:
                    state.consumer = None
                    state.rewind()
                state.type = None
        elif state.type is not None:
            self._sweep(state, now)
        return state.type

    def _sweep(self, state: Subscription, now: float) -> None:
        for c in list(state.consumers.values()):
            if now - c.last_seen >= self.consumer_timeout_s:
                self._remove(state, c)

    def _remove(self, state: Subscription, c: ConsumerInfo) -> None:
        """Detach a consumer of a Failover, Shared or Key_Shared subscription."""
        state.consumers.pop(c.consumer_id, None)
        if state.dispatcher is not None:
            state.dispatcher.remove_consumer(state, c.consumer_id, c.priority_level)
            state.topic.ledger.wake()  # its messages go to the others now
        if not state.consumers:  # the last one: the next first consumer chooses the type again
            state.consumer = None
            state.type = None
            state.dispatcher = None
            state.rewind()
        elif state.type == FAILOVER:
            self._elect(state)

    @staticmethod
    def _elect(state: Subscription, joined: ConsumerInfo | None = None) -> None:
        """Failover: choose the active consumer as Pulsar does (``service.failover``); when it
        changes, it gets every unacknowledged message, and every consumer is told whether it is
        the active one (Pulsar's ACTIVE_CONSUMER_CHANGE); else a consumer that ``joined`` is
        told that it is not."""
        ordered = sorted(state.consumers.values(), key=lambda c: (c.priority_level, c.name, c.seq))
        best = None
        if ordered:
            of = partition_of(state.topic.name)
            best = ordered[
                active_index(
                    str(state.topic.name),
                    -1 if of is None else of[1],
                    [c.priority_level for c in ordered],
                    [c.name for c in ordered],
                )
            ]
        if best is not state.consumer:
            state.consumer = best
            if best is not None:
                state.read_compacted = best.read_compacted
            state.rewind()
            state.topic.ledger.wake()  # the new active consumer may be waiting
            told = ordered if best is not None else []
        else:
            told = [joined] if joined is not None else []
        for c in told:
            if c.on_active_change is not None:
                c.on_active_change(c is best)

    def detach(self, name: TopicName, sub: str, consumer_id: str) -> None:
        state = self.get(name, sub)
        with state.lock:
            c = self._consumer(state, consumer_id)
            if state.type == EXCLUSIVE:
                state.consumer = None
                state.type = None
                state.rewind()
            else:
                self._remove(state, c)

    def mark_delete(self, name: TopicName, sub: str) -> Position:
        """The subscription's mark-delete position: every message up to it is acknowledged."""
        state = self.get(name, sub)
        with state.lock:
            return state.mark_delete

    def touch(self, name: TopicName, sub: str, consumer_id: str) -> None:
        """Keep a consumer attached while it receives nothing: a consumer of Pulsar's binary
        protocol lives as long as its connection, and may hold no permits for a while."""
        state = self.get(name, sub)
        with state.lock:
            self._consumer(state, consumer_id)

    def _consumer(self, state: Subscription, consumer_id: str) -> ConsumerInfo:
        if state.type != EXCLUSIVE and state.type is not None:
            return self._member(state, consumer_id)
        c = state.consumer
        if c is None or c.consumer_id != consumer_id:
            raise NotFound(f"consumer {consumer_id!r} is not attached to subscription {state.name!r}")
        now = time.monotonic()
        if now - c.last_seen >= self.consumer_timeout_s:
            state.consumer = None
            state.type = None
            state.rewind()
            raise NotFound(
                f"consumer {consumer_id!r} expired after {self.consumer_timeout_s:g} s without a call"
            )
        c.last_seen = now
        return c

    def _member(self, state: Subscription, consumer_id: str) -> ConsumerInfo:
        now = time.monotonic()
        c = state.consumers.get(consumer_id)
        self._sweep(state, now)
        if c is None:
            raise NotFound(f"consumer {consumer_id!r} is not attached to subscription {state.name!r}")
        if c.consumer_id not in state.consumers:
            raise NotFound(
                f"consumer {consumer_id!r} expired after {self.consumer_timeout_s:g} s without a call"
            )
        c.last_seen = now
        return c

    def receive(
        self,
        name: TopicName,
        sub: str,
        consumer_id: str,
        *,
        max_messages: int = 100,
        timeout_ms: int = 0,
        whole: bool = False,
    ) -> Delivery:
        """Deliver up to ``max_messages``; waits up to ``timeout_ms`` for the first one.
        ``whole``: an Exclusive or Failover consumer receives the log's stored batches whole
        (:class:`BatchEntry`, acknowledged with ``ack(batches=...)``) where nothing in them was
        acknowledged or delivered before; every other message comes as an entry."""
        if max_messages < 1:
            raise InvalidInput("maxMessages must be at least 1")
        if timeout_ms < 0:
            raise InvalidInput("timeoutMs must be >= 0")
        state = self.get(name, sub)
        limit = min(max_messages, self.broker.settings.max_read_messages)
        max_unacked = self.broker.settings.max_unacked_messages_per_consumer
        deadline = time.monotonic() + min(timeout_ms, MAX_WAIT_MS) / 1000
        try:
            return self._receive(state, consumer_id, limit, max_unacked, deadline, whole)
        finally:
            # A REST consumer can take messages while one of its receives waits (its permits).
            consumer = state.consumers.get(consumer_id)
            if consumer is not None and consumer.permits_of is None:
                consumer.permits = 0

    def _receive(
        self,
        state: Subscription,
        consumer_id: str,
        limit: int,
        max_unacked: int,
        deadline: float,
        whole: bool,
    ) -> Delivery:
        while True:
            with state.lock:
                consumer = self._consumer(state, consumer_id)
                if consumer.permits_of is None:
                    consumer.permits = limit
                if state.nacks:
                    expire_nacks(state, time.monotonic())
                ledger = state.topic.ledger
                seen = ledger.last_position() or NOTHING
                wakes = ledger.wakes
                dispatcher = state.dispatcher
                if dispatcher is None:
                    state.expire_ack_timeouts()
                    if consumer is state.consumer:
                        # Pending deliveries are memory the consumer holds on the server: past the
                        # bound it gets nothing more until it acknowledges. Counted in deliveries (a
                        # batch delivered whole is one, as it is one pending key): Pulsar does not
                        # bound these consumers at all, and a stream of batches must not be held to
                        # the acks of a client that sends them every 100 ms.
                        room = max_unacked - len(state.pending) if max_unacked else limit
                        out = (
                            deliver_in_order(
                                self.broker, state, consumer, limit if whole else min(limit, room), whole
                            )
                            if room > 0
                            else Delivery([])
                        )
                    else:
                        out = Delivery([])  # a Failover consumer that is not the active one
                    # An ack timeout due before the deadline must wake us: it makes messages due.
                    due = state.next_ack_deadline()
                else:
                    dispatcher.expire_ack_timeouts(state, time.monotonic())
                    out = deliver_shared(self.broker, state, dispatcher, consumer, limit, max_unacked)
                    due = dispatcher.next_ack_deadline()
                if state.nacks:
                    nack_due = state.nacks.next_deadline()
                    due = nack_due if due is None or (nack_due is not None and nack_due < due) else due
                shared_wait = state.type != EXCLUSIVE
                out._by, out._rewinds = state, state.rewinds
            now = time.monotonic()
            remaining = deadline - now
            if out or remaining <= 0:
                return out
            if due is not None:
                remaining = min(remaining, max(0.0, due - now) + 0.001)
            if shared_wait:
                remaining = min(remaining, _SHARED_POLL_S)
            ledger.wait_for_entries(seen, remaining, wakes)

    def ack(
        self,
        name: TopicName,
        sub: str,
        consumer_id: str,
        ids: list[Position],
        *,
        cumulative: bool,
        batches: Sequence[tuple[Position, int]] = (),
    ) -> None:
        """Acknowledge delivered messages; persisted before it returns. 400 for an id never
        delivered. ``batches`` names batches delivered whole, ``(first member, members)``:
        each acknowledges every member (a cumulative ack, up to its last)."""
        if not ids and not batches:
            raise InvalidInput("messageIds must not be empty")
        state = self.get(name, sub)
        with state.lock:
            self._consumer(state, consumer_id)
            for pos in ids:
                if pos > state.mark_delete and not state.was_delivered(pos):
                    raise InvalidInput(f"message {pos} was not delivered to this subscription")
            for first, n in batches:
                last = Position(first.ledger_id, first.entry_id + n - 1)
                if last > state.mark_delete and not state.was_delivered(last):
                    raise InvalidInput(f"message {last} was not delivered to this subscription")
            dispatcher = state.dispatcher
            if batches and (dispatcher is not None or cumulative):
                ids = ids + [m for f, n in batches for m in members_of(f, n)]
                batches = ()
            if dispatcher is not None:
                if cumulative:  # Pulsar's client refuses it the same way
                    raise InvalidInput(
                        "Cannot use cumulative acks on a non-exclusive/non-failover subscription"
                    )
                for pos in ids:
                    if pos > state.mark_delete:
                        state.acked.add(pos)
                        dispatcher.acknowledged(state, pos)
            elif cumulative:
                state.ack_upto(max(ids))
            else:
                for pos in ids:
                    if pos > state.mark_delete:
                        state.ack_member(pos)
                for first, n in batches:
                    state.ack_batch(first, n)
            state.advance_mark_delete()
            save_cursor(self.db, state)

    def negative_ack(self, name: TopicName, sub: str, consumer_id: str, ids: list[Position]) -> None:
        """Have the messages delivered again once the consumer's negative-ack delay has passed
        (Exclusive, Failover: every unacknowledged message, as Pulsar). 400 for an id never delivered."""
        if not ids:
            raise InvalidInput("messageIds must not be empty")
        state = self.get(name, sub)
        with state.lock:
            consumer = self._consumer(state, consumer_id)
            for pos in ids:
                if pos > state.mark_delete and not state.was_delivered(pos):
                    raise InvalidInput(f"message {pos} was not delivered to this subscription")
            held = [(p[0], p[1]) for p in ids if state.is_pending(p)]
            if not held:
                return  # acknowledged or redelivered already
            now = time.monotonic()
            state.nacks.add(held, consumer_id, now + consumer.negative_ack_redelivery_delay_ms / 1000)
            if consumer.negative_ack_redelivery_delay_ms == 0:
                # Given back now (a Pulsar client's: it kept the delay itself): whichever consumer
                # takes them must not wait for its next poll to see them.
                expire_nacks(state, now)
                state.topic.ledger.wake()

    def redeliver(self, name: TopicName, sub: str, consumer_id: str) -> None:
        """Deliver again every message delivered and not acknowledged (Shared, Key_Shared: those
        delivered to this consumer)."""
        state = self.get(name, sub)
        with state.lock:
            self._consumer(state, consumer_id)
            if state.dispatcher is not None:
                state.dispatcher.redeliver(state, consumer_id)
            else:
                state.rewind()
            state.topic.ledger.wake()

    def seek(
        self,
        name: TopicName,
        sub: str,
        *,
        message_id: str | None = None,
        publish_time: int | None = None,
        consumer_id: str | None = None,
    ) -> None:
        """Reset the cursor: the next message delivered is the first at or after the target."""
        if (message_id is None) == (publish_time is None):
            raise InvalidInput("give exactly one of messageId and publishTime")
        state = self.get(name, sub)
        topic = state.topic
        if publish_time is not None:
            if publish_time < 0:
                raise InvalidInput("publishTime must be >= 0")
            target = topic.ledger.find_by_publish_time(publish_time)
        else:
            assert message_id is not None
            target = self.broker.resolve_start(topic, message_id)
        with state.lock:
            if consumer_id is not None:
                self._consumer(state, consumer_id)
            state.mark_delete = before(target)
            state.acked = set()
            state.rewind()
            state.redelivered = {}  # counts start again from the new position
            save_cursor(self.db, state)

    # ---------------------------------------------------------------- stats

    def backlog(self, state: Subscription) -> tuple[int, int]:
        """Messages (and bytes) the subscription has yet to acknowledge, as its consumer (the
        last one attached) reads the topic: the compacted view or the whole log."""
        return subscription_backlog(state)

    def stats(self, name: TopicName) -> list[SubscriptionStats]:
        return subscription_stats(self.broker.topic(name))
