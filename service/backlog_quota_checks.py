"""Backlog quotas enforced, as Pulsar's ``BacklogQuotaManager`` and ``PersistentTopic`` do.

A topic is over a quota when a durable subscription's backlog is larger than the quota's
``limitSize`` (``destination_storage``: bytes, as the subscription's stats count them), or when
its oldest unacknowledged message (the one after its mark-delete position) is older than
``limitTime`` seconds (``message_age``). Past a quota:

- ``producer_request_hold`` / ``producer_exception``: a producer connecting is refused (Pulsar's
  ``ProducerBlockedQuotaExceededError`` / ``...Exception``), and the check, every
  ``backlogQuotaCheckIntervalInSeconds``, disconnects the topic's producers (they reconnect and
  are refused: a held client keeps its sends queued and retries, the other fails them) and
  refuses REST produce requests (503 with Retry-After for hold, 409 for exception) until a
  later check finds the topic under its quotas again (only the check: a topic's state for REST
  never goes stale when checks are off);
- ``consumer_backlog_eviction``: the check moves the cursors of the subscriptions over the quota
  forward (their oldest messages are skipped, as acknowledged), to 90 % of ``limitSize`` (as
  Pulsar does) or past the messages older than ``limitTime``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ledger.entry import Position
from service.backlog_quotas import (
    CONSUMER_BACKLOG_EVICTION,
    DESTINATION_STORAGE,
    MESSAGE_AGE,
    PRODUCER_EXCEPTION,
    BacklogQuota,
    BacklogQuotaStore,
)
from service.clock import now_ms
from service.cursor_store import COMPACTION_CURSOR, save_cursor
from service.db import Database
from service.errors import NotFound, ProducerBlocked, ProducerHeld, ServiceError
from service.managed_topic import ManagedTopic
from service.names import TopicName
from service.periodic import Periodic
from service.subscription_stats import subscription_backlog
from service.subscriptions import Subscription, before
from service.topics import Broker

log = logging.getLogger(__name__)

# Eviction by size leaves this share of the quota (Pulsar's reduction factor).
EVICTION_FACTOR = 0.9


@dataclass(frozen=True)
class Exceeded:
    """A quota the topic is over, and why (for the producer's error and the log)."""

    kind: str
    quota: BacklogQuota
    reason: str

    def refusal(self) -> ServiceError:
        """The error a producer gets for it."""
        if self.quota.policy == PRODUCER_EXCEPTION:
            return ProducerBlocked(self.reason)
        return ProducerHeld(self.reason, retry_after=1)


def _subscriptions(topic: ManagedTopic) -> list[Subscription]:
    return [s for name, s in list(topic.subscriptions.items()) if name != COMPACTION_CURSOR]


def _oldest_unacked(topic: ManagedTopic, sub: Subscription) -> int | None:
    """The publish time of the first message after the subscription's mark-delete position."""
    entries, _ = topic.ledger.read(sub.mark_delete.next(), 1)
    return entries[0].publish_time if entries else None


def exceeded(topic: ManagedTopic, quotas: dict[str, BacklogQuota], now: int) -> list[Exceeded]:
    """The quotas ``topic`` is over now (none without durable subscriptions: no backlog)."""
    out: list[Exceeded] = []
    subs = _subscriptions(topic)
    size = quotas[DESTINATION_STORAGE]
    if size.limit_size >= 0 and subs:
        worst = max(subs, key=lambda s: subscription_backlog(s)[1])
        backlog = subscription_backlog(worst)[1]
        if backlog > size.limit_size:
            out.append(
                Exceeded(
                    DESTINATION_STORAGE,
                    size,
                    f"backlog quota exceeded on {topic.name}: subscription {worst.name!r} has "
                    f"{backlog} bytes of backlog; the limit is {size.limit_size} ({size.policy})",
                )
            )
    age = quotas[MESSAGE_AGE]
    if age.limit_time > 0 and subs:
        times = [t for t in (_oldest_unacked(topic, s) for s in subs) if t is not None]
        if times and now - min(times) > age.limit_time * 1000:
            out.append(
                Exceeded(
                    MESSAGE_AGE,
                    age,
                    f"backlog quota exceeded on {topic.name}: its oldest unacknowledged message is "
                    f"{(now - min(times)) // 1000} s old; the limit is {age.limit_time} s ({age.policy})",
                )
            )
    return out


def producer_refusal(topic: ManagedTopic, quotas: dict[str, BacklogQuota], now: int) -> ServiceError | None:
    """What a producer connecting to ``topic`` is refused with (None: it is welcome)."""
    blocking = [e for e in exceeded(topic, quotas, now) if e.quota.policy != CONSUMER_BACKLOG_EVICTION]
    return blocking[0].refusal() if blocking else None


def _size_target(topic: ManagedTopic, keep_bytes: int) -> Position | None:
    """The first position from which the log's entries hold at most ``keep_bytes`` (sizes
    prorated inside a ledger, as the backlog counts them); None when the whole log does."""
    remaining = keep_bytes
    for info in reversed(topic.ledger.ledgers()):
        if not info.entries:
            continue
        if info.size_bytes <= remaining:
            remaining -= info.size_bytes
            continue
        fit = remaining * info.entries // info.size_bytes if info.size_bytes else info.entries
        return Position(info.ledger_id, info.entries - fit)
    return None


def _move(db: Database, sub: Subscription, target: Position) -> bool:
    """Skip the subscription's messages before ``target`` (as if acknowledged)."""
    with sub.lock:
        if sub.mark_delete.next() >= target:
            return False
        sub.mark_delete = before(target)
        sub.acked = {p for p in sub.acked if p >= target}
        sub.rewind()
        save_cursor(db, sub)
    return True


def evict(db: Database, topic: ManagedTopic, ex: Exceeded, now: int) -> list[str]:
    """Move the cursors of the subscriptions over ``ex`` forward; returns their names."""
    moved: list[str] = []
    if ex.kind == DESTINATION_STORAGE:
        target = _size_target(topic, int(ex.quota.limit_size * EVICTION_FACTOR))
        if target is None:
            return moved
        for sub in _subscriptions(topic):
            if subscription_backlog(sub)[1] > ex.quota.limit_size and _move(db, sub, target):
                moved.append(sub.name)
    else:
        target = topic.ledger.find_by_publish_time(now - ex.quota.limit_time * 1000)
        for sub in _subscriptions(topic):
            if _move(db, sub, target):
                moved.append(sub.name)
    if moved:
        log.info("%s; evicted the backlog of subscriptions %s up to %s", ex.reason, moved, target)
    return moved


class BacklogQuotaMonitor(Periodic):
    """The background check of every served topic's quotas (Pulsar's backlog quota check)."""

    thread_name = "backlog-quota-check"

    def __init__(self, *, broker: Broker, quotas: BacklogQuotaStore, interval_s: float) -> None:
        super().__init__(interval_s)
        self.broker = broker
        self.quotas = quotas
        # Called with a topic whose producers must go (over a producer_* quota): the binary
        # protocol's listener disconnects them there.
        self.on_blocked: list[Callable[[TopicName], None]] = []

    def tick(self) -> None:
        """One pass over every topic this instance serves."""
        now = now_ms()
        for topic in self.broker.topics():
            if self._stop.is_set():
                return
            try:
                self.check(topic, now)
            except NotFound:
                continue  # deleted meanwhile

    def check(self, topic: ManagedTopic, now: int) -> None:
        quotas = self.quotas.effective(topic.name)
        if all(q.limit_size < 0 and q.limit_time <= 0 for q in quotas.values()):
            topic.quota_refusal = None
            return
        blocking: list[Exceeded] = []
        for ex in exceeded(topic, quotas, now):
            if ex.quota.policy == CONSUMER_BACKLOG_EVICTION:
                evict(self.broker.db, topic, ex, now)
            else:
                blocking.append(ex)
        was = topic.quota_refusal
        topic.quota_refusal = blocking[0].refusal if blocking else None
        if blocking:
            if was is None:
                log.warning("%s; disconnecting its producers", blocking[0].reason)
            for listener in list(self.on_blocked):
                listener(topic.name)
