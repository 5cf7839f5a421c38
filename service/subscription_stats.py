"""What subscriptions report: each one's backlog (as its consumer reads the topic), its
consumers and the messages they hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.checksums import IntegrityError
from ledger.entry import Position
from service.compacted_view import RetiredView
from service.managed_topic import ManagedTopic
from service.publishers import ClientInfo
from service.subscription_types import EXCLUSIVE, FAILOVER, KEY_SHARED
from service.subscriptions import NOTHING, Subscription


@dataclass
class ConsumerStats:
    consumer_id: str
    name: str
    read_compacted: bool
    priority_level: int
    unacked: int
    # Key_Shared: the consumer's hash ranges, (start, end) inclusive.
    key_hash_ranges: list[tuple[int, int]] | None = None
    client: ClientInfo = field(default_factory=ClientInfo)


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


def subscription_backlog(state: Subscription) -> tuple[int, int]:
    """Messages (and bytes) the subscription has yet to acknowledge, as its consumer (the
    last one attached) reads the topic: the compacted view or the whole log."""
    return backlog_of(state.topic, state.mark_delete, state.read_compacted, len(state.acked))


def subscription_stats(topic: ManagedTopic) -> list[SubscriptionStats]:
    """The stats of each subscription of ``topic``, by name."""
    out = []
    for _, st in sorted(topic.subscriptions.items()):
        with st.lock:
            entries, size = subscription_backlog(st)
            dispatcher = st.dispatcher
            consumers: list[ConsumerStats] = []
            if st.type == EXCLUSIVE and st.consumer is not None:
                c = st.consumer
                consumers.append(
                    ConsumerStats(
                        c.consumer_id,
                        c.name,
                        c.read_compacted,
                        c.priority_level,
                        st.unacked(),
                        client=c.client,
                    )
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
                        c.consumer_id, c.name, c.read_compacted, c.priority_level, unacked, ranges, c.client
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
