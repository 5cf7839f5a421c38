"""Durable subscriptions: cursors with a mark-delete position, individual acks and properties,
and the in-memory delivery state of their consumers, of Pulsar's four subscription types.

A subscription's type is fixed by its first consumer and holds while it has consumers (then
the next first consumer chooses again), as in Pulsar. Exclusive has one consumer; Failover
has several, of which one is active (the first by priority level, then name) and the others
wait; both deliver through the rewinding cursor below. Shared and Key_Shared deliver to
several consumers through ``service.dispatchers.Dispatcher``.

As in Pulsar, ``readCompacted`` belongs to the consumer, chosen when it attaches: the
subscription holds only the position and the acknowledgements, which consumers of either
kind share. A readCompacted consumer reads the compacted ledger up to the horizon, then the
log; another reads the whole log after the same position.

Invariants of a subscription:
- every id at or before ``mark_delete`` is consumed; ``acked`` holds the ids beyond it that
  were acknowledged individually; both are persisted before an ack is answered;
- every id the reader can see in ``(mark_delete, read_pos)`` is either in ``acked`` or in
  ``pending`` (delivered, not yet acknowledged), so the mark-delete position can advance to
  the greatest acked id below the smallest pending one;
- ``pending`` is in id order (deliveries read forward from ``read_pos``, and a rewind empties
  it), so its first key is its smallest and a cumulative ack removes a prefix;
- redelivery (explicit, ack timeout, a new consumer, a restart) rewinds ``read_pos`` to just
  after ``mark_delete``; reading skips ids in ``acked``, so acknowledged messages never come back.

Shared and Key_Shared keep ``pending`` in no particular order and redeliver single messages
(``Dispatcher.replay``); the mark-delete position then advances below ``Dispatcher.floor``.

Delivery keeps no object per message beyond its ``pending`` entry: a consumer reads pages of
thousands, and this bookkeeping ran on every one of them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from typing import NamedTuple, overload

from sqlalchemy import delete, insert, select, update

from ledger.checksums import IntegrityError
from ledger.entry import BatchEntry, Entry, LedgerItem, Position
from service import models
from service.clock import now_ms
from service.compacted_view import RetiredView
from service.dead_letters import DeadLetterPolicy, make_policy, write_dead_letters
from service.dispatchers import Dispatcher, read_positions, rest_of_batch
from service.errors import Conflict, InvalidInput, NotFound, NotOwner, TooLarge, Unavailable
from service.names import TopicName
from service.negative_acks import DEFAULT_DELAY_MS, NegativeAcks
from service.pending_runs import Runs, members_of
from service.subscription_types import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, SUBSCRIPTION_TYPES
from service.topics import EARLIEST, LATEST, Broker, ManagedTopic

COMPACTION_CURSOR = "__compaction"
RESERVED_PREFIX = "__"
NOTHING = Position(-1, -1)
MAX_WAIT_MS = 30_000
# A receive that waits on a subscription with several consumers looks again this often: what
# it waits for may come from another consumer (a close, an ack, a redelivery), not the log.
_SHARED_POLL_S = 0.05

log = logging.getLogger(__name__)


def before(pos: Position) -> Position:
    """The mark-delete position that makes ``pos`` the next message to read."""
    return Position(pos.ledger_id, pos.entry_id - 1)


def check_subscription_name(name: str) -> str:
    if not name or len(name) > 256 or any(c in name for c in "/\\\x00") or name in (".", ".."):
        raise InvalidInput(f"invalid subscription name {name!r}")
    return name


@dataclass
class ConsumerInfo:
    consumer_id: str
    name: str
    ack_timeout_ms: int
    read_compacted: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    subscription_type: str = EXCLUSIVE
    priority_level: int = 0
    negative_ack_redelivery_delay_ms: int = DEFAULT_DELAY_MS
    dead_letter: DeadLetterPolicy | None = None
    seq: int = 0  # attach order, the last tie-break of Failover's order


@dataclass
class ConsumerStats:
    consumer_id: str
    name: str
    read_compacted: bool
    priority_level: int
    unacked: int
    # Key_Shared: the consumer's hash ranges, (start, end) inclusive.
    key_hash_ranges: list[tuple[int, int]] | None = None


class Delivered(NamedTuple):
    """One delivered message and how often the subscription delivered it before."""

    entry: Entry
    redelivery_count: int


class Delivery(Sequence[Delivered]):
    """A page of messages delivered to a consumer, in id order.

    Kept as columns (the entries, and their redelivery counts when any is above zero) so that
    a page of thousands builds no object per message; indexing yields ``Delivered``.
    """

    __slots__ = ("entries", "redelivery_counts", "_rewinds", "_by")

    def __init__(self, entries: list[Entry], redelivery_counts: list[int] | None = None) -> None:
        self.entries = entries
        #: None when every message is delivered for the first time.
        self.redelivery_counts = redelivery_counts
        self._by: Subscription | None = None
        self._rewinds = 0

    def given_back(self) -> bool:
        """Whether the subscription gave these messages back since it delivered them (every
        unacknowledged message, ``Subscription.rewind``): they will be delivered again, so a
        consumer that holds them unsent must drop them."""
        return self._by is not None and self._by.rewinds != self._rewinds

    def __len__(self) -> int:
        return len(self.entries)

    @overload
    def __getitem__(self, i: int) -> Delivered: ...
    @overload
    def __getitem__(self, i: slice) -> list[Delivered]: ...
    def __getitem__(self, i: int | slice) -> Delivered | list[Delivered]:
        if isinstance(i, slice):
            return list(self)[i]
        counts = self.redelivery_counts
        return Delivered(self.entries[i], counts[i] if counts is not None else 0)

    def __iter__(self) -> Iterator[Delivered]:
        counts = self.redelivery_counts
        if counts is None:
            return (Delivered(e, 0) for e in self.entries)
        return (Delivered(e, n) for e, n in zip(self.entries, counts, strict=True))

    def __repr__(self) -> str:
        return f"Delivery({len(self.entries)} messages)"


_Key = tuple[int, int]  # a position as a plain tuple: equal to, and hashed as, its Position


class Subscription:
    """One durable cursor and the state of its delivery. Thread-safe."""

    def __init__(
        self,
        *,
        cursor_id: int,
        name: str,
        topic: ManagedTopic,
        mark_delete: Position,
        acked: set[Position],
    ) -> None:
        self.cursor_id = cursor_id
        self.name = name
        self.topic = topic
        self.mark_delete = mark_delete
        self.acked = acked
        self.read_pos = mark_delete.next()
        # Delivered, not acknowledged: position -> times delivered before this delivery. A
        # batch delivered whole is one key, its first member's (see ``runs``).
        self.pending: dict[_Key, int] = {}
        # The keys of ``pending`` that stand for a whole batch, and their members.
        self.runs = Runs()
        # Delivered and then rewound, not yet consumed: position -> times delivered so far.
        self.redelivered: dict[_Key, int] = {}
        # Pages delivered under an ack timeout, oldest first: (deadline, their positions).
        self.timeouts: deque[tuple[float, list[_Key]]] = deque()
        # Exclusive: its consumer; Failover: the active one; Shared, Key_Shared: None.
        self.consumer: ConsumerInfo | None = None
        # Set by the first consumer, None again when the last one leaves.
        self.type: str | None = None
        # Every consumer of a Failover, Shared or Key_Shared subscription (not Exclusive's).
        self.consumers: dict[str, ConsumerInfo] = {}
        self.dispatcher: Dispatcher | None = None  # Shared and Key_Shared
        self.nacks = NegativeAcks()
        # How the last consumer attached read (in memory): the backlog is counted as it sees
        # the log, so a readCompacted consumer that consumed everything has no backlog.
        self.read_compacted = False
        self.lock = threading.RLock()
        # Whether the database holds individual acks for this cursor (else a write skips them).
        self.stored_acks = bool(acked)
        # How often every delivery was given back (``rewind``): see ``Delivery.given_back``.
        self.rewinds = 0

    def rewind(self) -> None:
        """Deliver every unacknowledged message again, in order."""
        with self.lock:
            redelivered = self.redelivered
            runs = self.runs
            for pos, count in self.pending.items():
                if pos in runs.lengths:
                    redelivered.update(dict.fromkeys(runs.members(pos), count + 1))
                else:
                    redelivered[pos] = count + 1
            self.pending.clear()
            runs.clear()
            self.rewinds += 1
            self.timeouts.clear()
            self.nacks.clear()
            if self.dispatcher is not None:
                self.dispatcher.reset()
            self.read_pos = self.mark_delete.next()

    def was_delivered(self, pos: Position) -> bool:
        return self.is_pending(pos) or pos in self.redelivered or pos in self.acked

    def is_pending(self, pos: _Key) -> bool:
        """Whether ``pos`` was delivered and is not acknowledged (a member of a whole batch
        delivered included)."""
        return pos in self.pending or self.runs.of(pos) is not None

    def unacked(self) -> int:
        """Messages delivered and not acknowledged (every member of a batch delivered whole)."""
        return len(self.pending) + self.runs.extra

    def next_ack_deadline(self) -> float | None:
        return self.timeouts[0][0] if self.timeouts else None

    def expire_ack_timeouts(self) -> None:
        """Rewind when a page delivered under an ack timeout still has a message pending past
        its deadline. Pages are checked oldest first, each once its deadline has passed."""
        now = time.monotonic()
        while self.timeouts and self.timeouts[0][0] <= now:
            _, positions = self.timeouts[0]
            if any(p in self.pending for p in positions):
                self.rewind()
                return
            self.timeouts.popleft()

    def ack_upto(self, upto: Position) -> None:
        """Consume every id up to ``upto`` (a cumulative ack)."""
        self.mark_delete = max(self.mark_delete, upto)
        pending, runs = self.pending, self.runs
        if not pending:
            return
        last = next(reversed(pending))
        if last <= upto and (not runs or runs.end(last) <= upto):  # the usual case: a page's end
            pending.clear()
            runs.clear()
            return
        for pos in list(takewhile(lambda p: p <= upto, pending)):
            count = pending.pop(pos)
            if pos in runs.lengths:
                end = runs.end(pos)
                runs.drop(pos)
                if end > upto:  # a batch acknowledged up to a member: the rest stays pending
                    rest = (upto[0], upto[1] + 1)
                    self.pending = pending = {rest: count, **pending}
                    if end > rest:
                        runs.add(rest, end[1] - upto[1])
                        acked = sum(1 for m in runs.members(rest) if m in self.acked)
                        if acked:
                            runs.acked[rest] = acked

    def consumer_count(self) -> int:
        if self.type == EXCLUSIVE:
            return 1 if self.consumer is not None else 0
        return len(self.consumers)

    def ack_member(self, pos: Position) -> None:
        """Acknowledge one delivered message beyond the mark-delete position (Exclusive,
        Failover): a member of a batch delivered whole counts towards its batch, which is
        consumed once every member is."""
        if pos in self.acked:
            return  # again: a client's ack set names every acknowledged member of a batch each time
        runs = self.runs
        if runs:
            first = pos if pos in runs.lengths else (None if pos in self.pending else runs.of(pos))
            if first is not None:
                self.acked.add(pos)
                done = runs.acked.get(first, 0) + 1
                if done == runs.lengths[first]:
                    runs.drop(first)
                    del self.pending[first]
                else:
                    runs.acked[first] = done
                return
        self.acked.add(pos)
        self.pending.pop(pos, None)

    def ack_batch(self, first: Position, n: int) -> None:
        """Acknowledge the ``n`` members of a batch delivered whole (Exclusive, Failover);
        member by member when it is not pending as one (a part acknowledged, or given back)."""
        runs, pending = self.runs, self.pending
        if runs.lengths.get(first) != n or first in runs.acked:
            for pos in members_of(first, n):
                if pos > self.mark_delete:
                    self.ack_member(pos)
            return
        floor = next(iter(pending))
        runs.drop(first)
        del pending[first]
        if floor == first:
            # The oldest delivery: every id before it is acknowledged (the invariant), so the
            # mark-delete position moves to the batch's last member at once.
            self.mark_delete = max(self.mark_delete, Position(first.ledger_id, first.entry_id + n - 1))
        else:  # acknowledged before an older one: kept as individual acks until that one is
            self.acked.update(members_of(first, n))

    def advance_mark_delete(self) -> None:
        if self.dispatcher is not None:
            floor = self.dispatcher.floor(self)
        else:
            floor = next(iter(self.pending)) if self.pending else self.read_pos
        if self.acked:
            below = [a for a in self.acked if a < floor]
            if below:
                self.mark_delete = max(self.mark_delete, max(below))
            self.acked = {a for a in self.acked if a > self.mark_delete}
        if self.redelivered:
            self.redelivered = {p: n for p, n in self.redelivered.items() if p > self.mark_delete}


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
        with self.db.session() as s:
            cursors = s.scalars(
                select(models.Cursor).where(
                    models.Cursor.topic_id == topic.topic_id, models.Cursor.name != COMPACTION_CURSOR
                )
            ).all()
            for c in cursors:
                acks = s.execute(
                    select(models.CursorAck.ledger_id, models.CursorAck.entry_id).where(
                        models.CursorAck.cursor_id == c.id
                    )
                ).all()
                topic.subscriptions[c.name] = Subscription(
                    cursor_id=c.id,
                    name=c.name,
                    topic=topic,
                    mark_delete=Position(c.mark_delete_ledger, c.mark_delete_entry),
                    acked={Position(lid, eid) for lid, eid in acks},
                )

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
            with self.db.session() as s:
                row = models.Cursor(
                    topic_id=topic.topic_id,
                    name=sub,
                    mark_delete_ledger=md.ledger_id,
                    mark_delete_entry=md.entry_id,
                    created_at=now_ms(),
                )
                s.add(row)
                s.flush()
                cursor_id = row.id
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
        with self.db.session() as s:
            s.execute(delete(models.Cursor).where(models.Cursor.id == state.cursor_id))

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
    ) -> ConsumerInfo:
        """Attach a consumer of ``subscription_type``. The first consumer fixes the type; one of
        another type gets 409 while the subscription has consumers, and so does a second
        Exclusive consumer. The consumer reads the compacted view or the whole log
        (``read_compacted``, Exclusive and Failover only) from the subscription's position; a
        subscription's first consumer (and Failover's new active one) gets every
        unacknowledged message again. ``dead_letter`` is ``(maxRedeliverCount, topic or None)``."""
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
                state.dispatcher.add_consumer(info.consumer_id)  # 409 when no hash range is left
            state.consumers[info.consumer_id] = info
            state.type = subscription_type
            if subscription_type == FAILOVER:
                self._elect(state)
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
            state.dispatcher.remove_consumer(state, c.consumer_id)
        if not state.consumers:  # the last one: the next first consumer chooses the type again
            state.consumer = None
            state.type = None
            state.dispatcher = None
            state.rewind()
        elif state.type == FAILOVER:
            self._elect(state)

    @staticmethod
    def _elect(state: Subscription) -> None:
        """Failover: the first consumer by priority level (lower first), name, attach order is
        the active one; when that changes, the new one gets every unacknowledged message."""
        best = min(state.consumers.values(), key=lambda c: (c.priority_level, c.name, c.seq), default=None)
        if best is not state.consumer:
            state.consumer = best
            if best is not None:
                state.read_compacted = best.read_compacted
            state.rewind()

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
        while True:
            with state.lock:
                consumer = self._consumer(state, consumer_id)
                if state.nacks:
                    self._expire_nacks(state, time.monotonic())
                seen = state.topic.ledger.last_position() or NOTHING
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
                            self._deliver(state, consumer, limit if whole else min(limit, room), whole)
                            if room > 0
                            else Delivery([])
                        )
                    else:
                        out = Delivery([])  # a Failover consumer that is not the active one
                    # An ack timeout due before the deadline must wake us: it makes messages due.
                    due = state.next_ack_deadline()
                else:
                    dispatcher.expire_ack_timeouts(state, time.monotonic())
                    out = self._deliver_shared(state, dispatcher, consumer, limit, max_unacked)
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
            state.topic.ledger.wait_for_entries(seen, remaining)

    def _deliver_shared(
        self,
        state: Subscription,
        dispatcher: Dispatcher,
        consumer: ConsumerInfo,
        limit: int,
        max_unacked: int,
    ) -> Delivery:
        room = max_unacked - dispatcher.unacked(consumer.consumer_id) if max_unacked else limit
        if room <= 0:
            return Delivery([])
        policy = consumer.dead_letter
        if policy is not None and dispatcher.replay:
            over = dispatcher.over_redelivered(state, policy.max_redeliver_count, 1000)
            if over:
                try:
                    self._dead_letter(state, dispatcher, policy, over)
                except (NotOwner, Unavailable, TooLarge) as e:
                    # The dead letter topic cannot take them now (another instance owns it, it
                    # pushes back, or a record outgrew the size limit): they stay waiting for
                    # redelivery and go there at a later receive. This consumer's receive must
                    # not fail, nor be redirected, for the dead letter topic's sake.
                    log.warning(
                        "dead letters of %s/%s not written to %s yet: %s",
                        state.topic.name,
                        state.name,
                        policy.topic,
                        e,
                    )
        entries, counts = dispatcher.deliver(state, consumer.consumer_id, min(limit, room))
        if entries:
            if consumer.ack_timeout_ms:
                dispatcher.timeouts[consumer.consumer_id].append(
                    (time.monotonic() + consumer.ack_timeout_ms / 1000, [(e[0], e[1]) for e in entries])
                )
            state.topic.messages_out.add(len(entries))
        return Delivery(entries, counts if any(counts) else None)

    def _dead_letter(
        self, state: Subscription, dispatcher: Dispatcher, policy: DeadLetterPolicy, positions: list[_Key]
    ) -> None:
        """Write the messages to the dead letter topic, then acknowledge them here (in that
        order: a crash between the two writes one twice, never loses one)."""
        got = read_positions(state.topic.ledger, positions)
        entries = [got[p] for p in positions if p in got]
        if entries:
            write_dead_letters(self.broker, state.topic.name, policy.topic, entries)
        for p in positions:
            dispatcher.acknowledged(state, p)
            state.redelivered.pop(p, None)
            if p > state.mark_delete:
                state.acked.add(Position(*p))
        state.advance_mark_delete()
        self._persist(state)

    def _expire_nacks(self, state: Subscription, now: float) -> None:
        due = state.nacks.pop_due(now)
        if not due:
            return
        dispatcher = state.dispatcher
        if dispatcher is None:
            # Exclusive and Failover redeliver every unacknowledged message, in order (Pulsar's
            # client turns a negative ack there into redeliverUnacknowledgedMessages()).
            if any(state.is_pending(pos) for pos, _ in due):
                state.rewind()
            return
        by_consumer: dict[str, list[_Key]] = {}
        for pos, consumer_id in due:
            by_consumer.setdefault(consumer_id, []).append(pos)
        for consumer_id, positions in by_consumer.items():
            dispatcher.redeliver(state, consumer_id, positions)

    def _deliver(self, state: Subscription, consumer: ConsumerInfo, limit: int, whole: bool) -> Delivery:
        out: list[LedgerItem] = []
        got = 0  # messages in ``out``
        counts: list[int] = []
        delivered: list[_Key] = []
        pending, redelivered, runs = state.pending, state.redelivered, state.runs
        while True:
            # Never stop inside a Pulsar batch (see ``dispatchers.rest_of_batch``).
            rest = rest_of_batch(out[-1]) if out and type(out[-1]) is Entry else 0
            if got >= limit and not rest:
                break
            want = max(limit - got, rest)
            if whole and _reads_whole(state):
                items, nxt = self.broker.read_batches_at(
                    state.topic, state.read_pos, want, consumer.read_compacted
                )
                if not items:
                    break
                for item in items:
                    key = (item[0], item[1])
                    pending[key] = 0
                    if type(item) is BatchEntry:
                        n = item.batch.count
                        runs.add(key, n)
                        got += n
                    else:
                        got += 1
                    delivered.append(key)
                out.extend(items)
                counts.extend([0] * len(items))
                state.read_pos = nxt
                continue
            entries, nxt = self.broker.read_at(state.topic, state.read_pos, want, consumer.read_compacted)
            if not entries:
                break
            positions: list[_Key] = [e[:2] for e in entries]
            if state.acked or positions[0] <= state.mark_delete:
                md, acked = state.mark_delete, state.acked
                keep = [i for i, p in enumerate(positions) if p > md and p not in acked]
                entries = [entries[i] for i in keep]
                positions = [positions[i] for i in keep]
            if redelivered:
                page = [redelivered.get(p, 0) for p in positions]
                pending.update(zip(positions, page, strict=True))
            else:
                page = [0] * len(positions)
                pending.update(dict.fromkeys(positions, 0))
            out.extend(entries)
            got += len(entries)
            counts.extend(page)
            delivered.extend(positions)
            state.read_pos = nxt
        if consumer.ack_timeout_ms and delivered:
            state.timeouts.append((time.monotonic() + consumer.ack_timeout_ms / 1000, delivered))
        if got:
            state.topic.messages_out.add(got)
        return Delivery(out, counts if any(counts) else None)  # type: ignore[arg-type]  # entries unless ``whole``

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
            self._persist(state)

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
                self._expire_nacks(state, now)

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
            self._persist(state)

    def _persist(self, state: Subscription) -> None:
        # Committed before the ack returns, so a crash of the service never loses it; not
        # waiting for the disk (a lost machine can cost a redelivery, as in Pulsar and Kafka).
        # Plain statements, not the ORM: this runs once per acknowledgement request.
        acked = sorted(state.acked)
        with self.db.session(synced=False) as s:
            done = s.execute(
                update(models.Cursor)
                .where(models.Cursor.id == state.cursor_id)
                .values(
                    mark_delete_ledger=state.mark_delete.ledger_id,
                    mark_delete_entry=state.mark_delete.entry_id,
                )
                .execution_options(synchronize_session=False)
            )
            if done.rowcount == 0:  # type: ignore[attr-defined]
                raise NotFound(f"subscription {state.name!r} was deleted")
            if acked or state.stored_acks:
                s.execute(delete(models.CursorAck).where(models.CursorAck.cursor_id == state.cursor_id))
            if acked:
                s.execute(
                    insert(models.CursorAck),
                    [
                        {"cursor_id": state.cursor_id, "ledger_id": p.ledger_id, "entry_id": p.entry_id}
                        for p in acked
                    ],
                )
        state.stored_acks = bool(acked)

    # ---------------------------------------------------------------- stats

    def backlog(self, state: Subscription) -> tuple[int, int]:
        """Messages (and bytes) the subscription has yet to acknowledge, as its consumer (the
        last one attached) reads the topic: the compacted view or the whole log."""
        return backlog_of(state.topic, state.mark_delete, state.read_compacted, len(state.acked))

    def stats(self, name: TopicName) -> list[SubscriptionStats]:
        topic = self.broker.topic(name)
        out = []
        for _, st in sorted(topic.subscriptions.items()):
            with st.lock:
                entries, size = self.backlog(st)
                dispatcher = st.dispatcher
                consumers: list[ConsumerStats] = []
                if st.type == EXCLUSIVE and st.consumer is not None:
                    c = st.consumer
                    consumers.append(
                        ConsumerStats(c.consumer_id, c.name, c.read_compacted, c.priority_level, st.unacked())
                    )
                for c in st.consumers.values():
                    if dispatcher is not None:
                        unacked = dispatcher.unacked(c.consumer_id)
                    else:
                        unacked = st.unacked() if c is st.consumer else 0
                    ranges = None
                    if st.type == KEY_SHARED and dispatcher is not None:
                        ranges = dispatcher.ranges(c.consumer_id)
                    consumers.append(
                        ConsumerStats(
                            c.consumer_id, c.name, c.read_compacted, c.priority_level, unacked, ranges
                        )
                    )
                out.append(
                    SubscriptionStats(
                        name=st.name,
                        type=st.type,
                        backlog=entries,
                        backlog_bytes=size,
                        unacked=st.unacked(),
                        mark_delete=st.mark_delete if st.mark_delete != NOTHING else None,
                        consumers=consumers,
                        active_consumer=st.consumer.name if st.type == FAILOVER and st.consumer else None,
                    )
                )
        return out


def _reads_whole(state: Subscription) -> bool:
    """Whether the next read of an Exclusive or Failover subscription may deliver stored batches
    whole: nothing at or after its read position was acknowledged or delivered before (those
    go member by member, to leave the acknowledged out and count the redeliveries)."""
    pos = state.read_pos
    if pos <= state.mark_delete:
        return False
    if state.acked and max(state.acked) >= pos:
        return False
    return not state.redelivered or max(state.redelivered) < pos


@dataclass
class SubscriptionStats:
    name: str
    type: str | None  # None while no consumer is attached
    backlog: int
    backlog_bytes: int
    unacked: int
    mark_delete: Position | None
    consumers: list[ConsumerStats]
    active_consumer: str | None = None  # Failover's active consumer


def backlog_of(
    topic: ManagedTopic, mark_delete: Position, read_compacted: bool, acked: int = 0
) -> tuple[int, int]:
    """Entries after ``mark_delete`` (as a reader of that kind sees them) and their bytes."""
    start = mark_delete.next()
    while True:
        view = topic.view if read_compacted else None
        if view is None or start > view.horizon:
            n, size = topic.ledger.backlog(start)
            break
        try:
            with view.lease():
                c = view.ledger.count_from(start)
                c_size = view.ledger.size_bytes * c // view.ledger.entries if view.ledger.entries else 0
        except RetiredView:
            continue
        except IntegrityError:
            # A damaged deletion vector (counting reads them): a stats call is no place to drop
            # the ledger -- the next compacted read or scrub does that -- so count as the log does.
            n, size = topic.ledger.backlog(start)
            break
        n, size = topic.ledger.backlog(view.horizon.next())
        n, size = n + c, size + c_size
        break
    return max(0, n - acked), size
