"""Automatic compaction and retention, checked every ``compactionMonitorIntervalSeconds``.

Each tick, for every topic, in order:
1. retention: delete sealed original ledgers the policy lets go (see ``apply_retention``);
2. compaction: start a round when a rule of the effective policy fires (see ``due``), at most
   as many at once as the compaction pool has workers, never two on one topic.
"""

from __future__ import annotations

import logging

from ledger.entry import Position
from service.clock import now_ms
from service.compaction import CompactionService
from service.errors import Conflict, NotFound
from service.managed_topic import ManagedTopic
from service.metrics import ServiceMetrics
from service.names import TopicName, partition_of
from service.periodic import Periodic
from service.policies import Policy, PolicyStore
from service.topics import Broker

log = logging.getLogger(__name__)

THRESHOLD, DIRTY_RATIO, MAX_LAG = "threshold", "dirtyRatio", "maxCompactionLag"


def due(topic: ManagedTopic, policy: Policy, now: int) -> str | None:
    """Which rule, if any, says ``topic`` needs compacting now.

    - ``threshold`` (Pulsar): the ``__compaction`` cursor's backlog in bytes exceeds it;
    - ``dirtyRatio`` (Kafka's min.cleanable.dirty.ratio): uncompacted messages / (messages in the
      compacted ledger + uncompacted messages) reaches it;
    - ``maxCompactionLag`` (Kafka): the oldest uncompacted message is older than it.
    Nothing is due while every uncompacted message is younger than ``minCompactionLagMs``.
    """
    view = topic.view
    start = view.horizon.next() if view is not None else Position(0, 0)
    dirty, dirty_bytes = topic.ledger.backlog(start)
    if dirty == 0:
        return None
    oldest, _ = topic.ledger.read(start, 1)
    if not oldest:
        return None
    age = now - oldest[0].publish_time
    if policy.minCompactionLagMs and age < policy.minCompactionLagMs:
        return None
    if policy.compactionThreshold and dirty_bytes > policy.compactionThreshold:
        return THRESHOLD
    if policy.minCleanableDirtyRatio is not None:
        clean = view.ledger.entries if view is not None else 0
        if dirty / (clean + dirty) >= policy.minCleanableDirtyRatio:
            return DIRTY_RATIO
    if policy.maxCompactionLagMs is not None and age > policy.maxCompactionLagMs:
        return MAX_LAG
    return None


def apply_retention(topic: ManagedTopic, policy: Policy, now: int) -> list[int]:
    """Delete the oldest sealed original ledgers that are past ``retentionTimeMs`` or keep the
    log over ``retentionSizeBytes``, and that may go: every entry in them is at or before the
    compaction horizon (the compacted ledger keeps each key's latest value) and consumed by
    every durable subscription. Returns the deleted ledger ids."""
    if policy.retentionTimeMs is None and policy.retentionSizeBytes is None:
        return []
    view = topic.view
    if view is None:
        return []  # nothing is compacted: the original log is the only copy
    floor = view.horizon
    for sub in list(topic.subscriptions.values()):
        floor = min(floor, sub.mark_delete)
    ledgers = topic.ledger.ledgers()
    total = sum(i.file_bytes for i in ledgers)
    doomed: set[int] = set()
    for info in ledgers[:-1]:  # never the open ledger
        if info.state != "CLOSED" or not info.entries or Position(info.ledger_id, info.entries - 1) > floor:
            break
        too_old = (
            policy.retentionTimeMs is not None
            and info.last_publish_time is not None
            and info.last_publish_time < now - policy.retentionTimeMs
        )
        too_big = policy.retentionSizeBytes is not None and total > policy.retentionSizeBytes
        if not (too_old or too_big):
            break
        doomed.add(info.ledger_id)
        total -= info.file_bytes
    if doomed:
        log.info("retention: deleting ledgers %s of %s", sorted(doomed), topic.name)
        topic.ledger.delete_ledgers(doomed)
    return sorted(doomed)


class CompactionScheduler(Periodic):
    """The background thread that applies retention and starts due compactions."""

    thread_name = "compaction-scheduler"

    def __init__(
        self,
        *,
        broker: Broker,
        compaction: CompactionService,
        policies: PolicyStore,
        interval_s: float,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        super().__init__(interval_s)
        self.broker = broker
        self.metrics = metrics
        self.compaction = compaction
        self.policies = policies

    def tick(self) -> list[tuple[str, str]]:
        """One pass over every topic; returns the (topic, rule) rounds it started. The
        partitions of a partitioned topic due in one pass start together, their Spark work
        in one job (``CompactionService.trigger_many``)."""
        started: list[tuple[str, str]] = []
        now = now_ms()
        partitions: dict[TopicName, list[tuple[TopicName, str]]] = {}
        for topic in self.broker.topics():
            if self._stop.is_set():
                break
            try:
                policy = self.policies.effective(topic.name)
                apply_retention(topic, policy, now)
                if self.compaction.running() >= self.compaction.workers:
                    continue
                rule = due(topic, policy, now)
                if rule is None:
                    continue
                owner = partition_of(topic.name)
                if owner is not None:
                    partitions.setdefault(owner[0], []).append((topic.name, rule))
                    continue
                self.compaction.trigger(topic.name, trigger=rule)
                self._started(started, topic.name, rule)
            except (Conflict, NotFound):
                continue  # already compacting, or deleted meanwhile
        for due_now in partitions.values():
            if self._stop.is_set() or self.compaction.running() >= self.compaction.workers:
                break
            # One trigger for the group: the rule of its first partition (each was due by its own).
            try:
                skipped = self.compaction.trigger_many([n for n, _ in due_now], trigger=due_now[0][1])
            except (Conflict, NotFound):
                continue
            for n, rule in due_now:
                if n not in skipped.busy and n not in skipped.elsewhere:
                    self._started(started, n, rule)
        return started

    def _started(self, started: list[tuple[str, str]], name: TopicName, rule: str) -> None:
        started.append((str(name), rule))
        if self.metrics is not None:
            self.metrics.scheduler_decisions.labels(rule).inc()
