"""A durable subscription: its cursor (a mark-delete position and individual acks) and the
in-memory delivery state of its consumers -- what is pending, redelivered, under an ack timeout.

The verbs over subscriptions are in ``service.subscription_service``, the pages a
subscription delivers are made in ``service.deliveries``, and its cursor's rows are kept by
``service.cursor_store``.

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
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import takewhile

from ledger.entry import Position
from service.dead_letters import DeadLetterPolicy
from service.dispatchers import Dispatcher
from service.managed_topic import ManagedTopic
from service.negative_acks import DEFAULT_DELAY_MS, NegativeAcks
from service.pending_runs import Runs, members_of
from service.publishers import ClientInfo
from service.subscription_types import EXCLUSIVE

NOTHING = Position(-1, -1)


def before(pos: Position) -> Position:
    """The mark-delete position that makes ``pos`` the next message to read."""
    return Position(pos.ledger_id, pos.entry_id - 1)


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
    client: ClientInfo = field(default_factory=ClientInfo)  # who attached it, for stats
    # How many messages the consumer can take now (Pulsar's permits), for the priority levels of
    # a Shared subscription: a Pulsar client's grant (``permits_of``, read from its connection),
    # else ``permits``, which a REST consumer has while one of its receives waits.
    permits: int = 0
    permits_of: Callable[[], int] | None = None
    # Failover: told whether it is the active consumer when that changes (Pulsar's
    # ACTIVE_CONSUMER_CHANGE); called with the subscription's lock held, so it must not block.
    on_active_change: Callable[[bool], None] | None = None

    def available_permits(self) -> int:
        return self.permits_of() if self.permits_of is not None else self.permits


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
