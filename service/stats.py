"""Snapshots of a topic's internals, for the admin API and the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select

from ledger.entry import Position
from service import models
from service.managed_ledger import LedgerInfo
from service.names import TopicName
from service.topics import Broker


@dataclass
class CursorStats:
    name: str
    mark_delete: Position | None
    properties: dict[str, int]
    read_compacted: bool


@dataclass
class CompactedLedgerStats:
    ledger_id: int = -1
    entries: int = -1
    size: int = -1


@dataclass
class InternalStats:
    """Pulsar's ``internalStats``: the ledgers, the cursors, the compacted ledger, the horizon."""

    ledgers: list[LedgerInfo]
    last_confirmed: Position | None
    cursors: list[CursorStats]
    compacted_ledger: CompactedLedgerStats = field(default_factory=CompactedLedgerStats)
    horizon: Position | None = None

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
                read_compacted=c.read_compacted,
            )
            for c in cursor_rows
        ]
    stats = InternalStats(ledgers=ledgers, last_confirmed=topic.ledger.last_position(), cursors=cursors)
    view = topic.compacted_view()
    if view is not None:
        stats.horizon = view.horizon
        if view.ledger is not None:
            stats.compacted_ledger = CompactedLedgerStats(
                view.ledger_id, view.ledger.entries, view.ledger.size_bytes
            )
    return stats
