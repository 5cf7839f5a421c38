"""Snapshots of a topic's internals, for the admin API and the scheduler, and of the service's
bounded resources, for stats and ``/health``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import select

from ledger import row_group_cache
from ledger.entry import Position
from ledger.file_cache import FileCacheStats
from ledger.row_group_cache import RowGroupCacheStats
from service import models
from service.ledger_info import LedgerInfo
from service.names import TopicName
from service.resources import DEGRADED_FOR_S, DescriptorLimit, descriptor_limit, open_descriptors
from service.seal_backlog import SealBacklogStats
from service.topics import Broker


@dataclass
class CursorStats:
    name: str
    mark_delete: Position | None
    properties: dict[str, int]


@dataclass
class CompactedLedgerStats:
    ledger_id: int = -1
    entries: int = -1
    size: int = -1
    checksum: str | None = None


@dataclass
class InternalStats:
    """Pulsar's ``internalStats``: the ledgers, the cursors, the compacted ledger, the horizon."""

    ledgers: list[LedgerInfo]
    last_confirmed: Position | None
    cursors: list[CursorStats]
    compacted_ledger: CompactedLedgerStats = field(default_factory=CompactedLedgerStats)
    horizon: Position | None = None
    # "compacted ledger N dropped: <finding>" while a damaged compacted ledger is rebuilt.
    repair: str | None = None
    # Pulsar's managed ledger state: "Terminated" once the topic is, else "LedgerOpened".
    state: str = "LedgerOpened"

    @property
    def entries(self) -> int:
        return sum(i.entries for i in self.ledgers)

    @property
    def size(self) -> int:
        return sum(i.size_bytes for i in self.ledgers)


def internal_stats(broker: Broker, name: TopicName) -> InternalStats:
    topic = broker.topic(name)
    ledgers = topic.ledger.ledgers()
    with broker.db.session() as s:
        cursor_rows = s.scalars(
            select(models.Cursor).where(models.Cursor.topic_id == topic.topic_id).order_by(models.Cursor.name)
        ).all()
        props: dict[int, dict[str, int]] = {}
        for p in s.scalars(
            select(models.CursorProperty).where(
                models.CursorProperty.cursor_id.in_([c.id for c in cursor_rows])
            )
        ):
            props.setdefault(p.cursor_id, {})[p.name] = p.value
        cursors = [
            CursorStats(
                name=c.name,
                mark_delete=Position(c.mark_delete_ledger, c.mark_delete_entry)
                if c.mark_delete_ledger >= 0
                else None,
                properties=props.get(c.id, {}),
            )
            for c in cursor_rows
        ]
    stats = InternalStats(ledgers=ledgers, last_confirmed=topic.ledger.last_position(), cursors=cursors)
    if topic.ledger.terminated is not None:
        stats.state = "Terminated"
    view = topic.compacted_view()
    if view is not None:
        stats.horizon = view.horizon
        if view.ledger is not None:
            stats.compacted_ledger = CompactedLedgerStats(
                view.ledger_id, view.ledger.entries, view.ledger.size_bytes, view.checksum
            )
    if topic.repair is not None:
        stats.repair = (
            f"compacted ledger {topic.repair.ledger_id} dropped: {topic.repair.finding}; rebuilding"
        )
    return stats


@dataclass
class ResourceStats:
    """The service's bounded resources: descriptors, the seal backlog, the open-file cache,
    the cache of hot row groups."""

    open_descriptors: int | None
    descriptor_limit: DescriptorLimit
    seal_backlog: SealBacklogStats
    ledger_files: FileCacheStats
    row_groups: RowGroupCacheStats
    seal_failures: int
    descriptor_exhaustions: int


def resource_stats(broker: Broker) -> ResourceStats:
    shared = broker.resources
    return ResourceStats(
        open_descriptors=open_descriptors(),
        descriptor_limit=descriptor_limit(),
        seal_backlog=shared.backlog.stats(),
        ledger_files=shared.files.stats(),
        row_groups=row_group_cache.shared().stats(),
        seal_failures=sum(t.ledger.seal_failures for t in broker.topics()),
        descriptor_exhaustions=shared.exhaustion.count,
    )


#: /health reports open descriptors above this share of the limit.
DESCRIPTORS_HIGH = 0.9


def health_problems(broker: Broker) -> list[str]:
    """Why the service is degraded now (empty when it is fine): descriptors ran out or are
    nearly all used, produce requests were refused by the seal backlog, seals are failing."""
    problems: list[str] = []
    shared = broker.resources
    exhausted = shared.exhaustion.recent()
    if exhausted:
        problems.append(exhausted)
    limit = descriptor_limit().soft
    used = open_descriptors()
    if used is not None and limit > 0 and used >= DESCRIPTORS_HIGH * limit:
        problems.append(f"{used} of {limit} file descriptors open")
    refused = shared.backlog.last_refused
    if refused is not None and time.monotonic() - refused <= DEGRADED_FOR_S:
        b = shared.backlog.stats()
        problems.append(
            f"produce refused {time.monotonic() - refused:.0f} s ago: the seal backlog is full "
            f"({b.pending} ledgers waiting, limit {b.limit})"
        )
    failing = sum(t.ledger.seal_failures for t in broker.topics())
    if failing:
        problems.append(f"{failing} ledgers failed to seal; retrying")
    return problems
