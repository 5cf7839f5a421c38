"""The pages a subscription delivers to its consumers: in id order from its cursor (Exclusive,
Failover), or through its dispatcher (Shared, Key_Shared, with their dead letters); and the
negative acknowledgements come due, which give messages back to be delivered again.

Delivery keeps no object per message beyond its ``pending`` entry: a consumer reads pages of
thousands, and this bookkeeping ran on every one of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple, overload

from ledger.entry import BatchEntry, Entry, LedgerItem, Position
from service.cursor_store import save_cursor
from service.dead_letters import DeadLetterPolicy, write_dead_letters
from service.dispatchers import Dispatcher, read_positions, rest_of_batch
from service.errors import NotOwner, TooLarge, Unavailable
from service.subscriptions import ConsumerInfo, Subscription
from service.topics import Broker

log = logging.getLogger(__name__)

_Key = tuple[int, int]  # a position as a plain tuple: equal to, and hashed as, its Position


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


def deliver_in_order(
    broker: Broker, state: Subscription, consumer: ConsumerInfo, limit: int, whole: bool
) -> Delivery:
    """The next page of an Exclusive or Failover subscription's active consumer, read forward
    from the subscription's read position."""
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
            items, nxt = broker.read_batches_at(state.topic, state.read_pos, want, consumer.read_compacted)
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
        entries, nxt = broker.read_at(state.topic, state.read_pos, want, consumer.read_compacted)
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


def deliver_shared(
    broker: Broker,
    state: Subscription,
    dispatcher: Dispatcher,
    consumer: ConsumerInfo,
    limit: int,
    max_unacked: int,
) -> Delivery:
    """The next page of a Shared or Key_Shared consumer, from its subscription's dispatcher;
    with a dead letter policy, messages redelivered too often go to its topic first."""
    room = max_unacked - dispatcher.unacked(consumer.consumer_id) if max_unacked else limit
    if room <= 0:
        return Delivery([])
    if (
        consumer.priority_level > dispatcher.top_level
        and not dispatcher.key_shared
        and _higher_level_can_take(state, dispatcher, consumer.priority_level, max_unacked)
    ):
        return Delivery([])
    policy = consumer.dead_letter
    if policy is not None and dispatcher.replay:
        over = dispatcher.over_redelivered(state, policy.max_redeliver_count, 1000)
        if over:
            try:
                _dead_letter(broker, state, dispatcher, policy, over)
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


def _higher_level_can_take(state: Subscription, dispatcher: Dispatcher, level: int, max_unacked: int) -> bool:
    """Whether a consumer of a priority level above ``level`` can take messages now: it has
    permits and is not held at its bound of unacknowledged messages (Pulsar's
    ``isConsumerAvailable``). Pulsar's Shared dispatcher then gives them to it, round robin
    among its level, and to a lower level only when no consumer above can take any
    (``getNextConsumer``). Key_Shared routes by key alone: its selector knows no levels."""
    for c in state.consumers.values():
        if (
            c.priority_level < level
            and c.available_permits() > 0
            and (not max_unacked or dispatcher.unacked(c.consumer_id) < max_unacked)
        ):
            return True
    return False


def _dead_letter(
    broker: Broker,
    state: Subscription,
    dispatcher: Dispatcher,
    policy: DeadLetterPolicy,
    positions: list[_Key],
) -> None:
    """Write the messages to the dead letter topic, then acknowledge them here (in that
    order: a crash between the two writes one twice, never loses one)."""
    got = read_positions(state.topic.ledger, positions)
    entries = [got[p] for p in positions if p in got]
    if entries:
        write_dead_letters(broker, state.topic.name, policy.topic, entries)
    for p in positions:
        dispatcher.acknowledged(state, p)
        state.redelivered.pop(p, None)
        if p > state.mark_delete:
            state.acked.add(Position(*p))
    state.advance_mark_delete()
    save_cursor(broker.db, state)


def expire_nacks(state: Subscription, now: float) -> None:
    """Give back the negatively acknowledged messages whose delay has passed."""
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
