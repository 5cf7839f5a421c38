"""What a compaction round does with damage (README, "Integrity and repair"): a damaged
compacted ledger is dropped (the cursor no longer names it, its row says what was found,
reads of the compacted view answer 503) so that a repair round rebuilds it from the original
ledgers; a damaged original ledger is marked damaged and stops rounds until an operator
accepts the loss; a damaged local copy is only dropped. Damage found by a round's Spark tasks
reaches here as text inside Spark's exception (:meth:`RoundDamage.damage_in`). Each finding
becomes the round's one-line ``lastError``."""

from __future__ import annotations

import logging

from sqlalchemy import select

from ledger.checksums import IntegrityError
from ledger.entry import Position
from service import models
from service.clock import now_ms
from service.compacted_view import CompactedView
from service.compaction_cursor import COMPACTED_LEDGER_PROPERTY
from service.cursor_store import COMPACTION_CURSOR
from service.integrity import (
    COMPACTED,
    Finding,
    compacted_damage_line,
    find_damage,
    finding_of,
    names_file,
    skip_damaged_path,
)
from service.managed_topic import DroppedView, ManagedTopic
from service.metrics import ServiceMetrics
from service.topics import Broker

log = logging.getLogger(__name__)


class RoundDamaged(Exception):
    """A round met a damaged file; ``str()`` is the one line its ``lastError`` shows."""


class RoundDamage:
    """What a round does with the damage it meets (see the module's docstring)."""

    def __init__(self, *, broker: Broker, metrics: ServiceMetrics | None = None) -> None:
        self.broker = broker
        self.metrics = metrics
        self.db = broker.db

    def drop_damaged_view(
        self,
        topic: ManagedTopic,
        error: IntegrityError,
        *,
        ledger_id: int | None,
        view: CompactedView | None = None,
    ) -> str:
        """Forget a damaged compacted ledger: the cursor no longer names it (so a restart does
        not load it again), its row says what was found, reads of the compacted view answer
        503 until a repair round commits. Returns the finding's line."""
        detail = f"{error.check} failed: {error.detail}"
        line = compacted_damage_line(topic.name, error, ledger_id)
        log.error("%s; dropping it and rebuilding from the original ledgers", line)
        horizon = view.horizon if view is not None else Position(2**62, 0)
        with self.db.session() as s:
            cursor = s.scalar(
                select(models.Cursor).where(
                    models.Cursor.topic_id == topic.topic_id, models.Cursor.name == COMPACTION_CURSOR
                )
            )
            if cursor is not None:
                if view is None and cursor.mark_delete_ledger >= 0:
                    horizon = Position(cursor.mark_delete_ledger, cursor.mark_delete_entry)
                prop = s.get(models.CursorProperty, (cursor.id, COMPACTED_LEDGER_PROPERTY))
                if prop is not None:
                    s.delete(prop)
                cursor.mark_delete_ledger = cursor.mark_delete_entry = -1
            if ledger_id is not None:
                row = s.get(models.Ledger, ledger_id)
                if row is not None:
                    row.state = models.DELETED
                    row.damage, row.damaged_at = detail, now_ms()
        topic.repair = DroppedView(ledger_id=ledger_id or -1, horizon=horizon, finding=detail)
        if topic.view is view and view is not None:
            topic.view = None
            view.retire()
        if self.metrics is not None:
            self.metrics.integrity.damage_found(COMPACTED, error.check)
        return line

    @staticmethod
    def damage_in(e: BaseException) -> Finding | None:
        """The damaged file a failed round's error names (its Spark tasks raise
        ``IntegrityError``, which reaches here as text inside Spark's exception)."""
        seen: set[int] = set()
        exc: BaseException | None = e
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            if isinstance(exc, IntegrityError):
                return finding_of(exc)
            found = find_damage(str(exc))
            if found is not None:
                return found
            exc = exc.__cause__ or exc.__context__
        return None

    def damaged_round(self, topic: ManagedTopic, finding: Finding, previous: CompactedView | None) -> str:
        """What a round whose Spark work met damage records: the ledger marked damaged, or the
        compacted ledger dropped for a rebuild; returns the round's one-line ``lastError``. A
        damaged local copy is only dropped: the next round reads the ledger's object."""
        copies = self.broker.resources.copies
        if copies is not None and copies.holds(finding.path):
            copies.drop(finding.path)
            return (
                f"{finding.line(topic.name)} (a local copy of the ledger's object: dropped, the next "
                "round reads the object)"
            )
        if finding.kind == COMPACTED:
            # A file of the previous compacted ledger: in its own directory, or an older
            # layer's that its manifest names where an earlier round wrote it.
            if previous is not None and (
                finding.ledger_id == previous.ledger_id or names_file(previous.files, finding.path)
            ):
                self.drop_damaged_view(topic, finding.error(), ledger_id=previous.ledger_id, view=previous)
                return self.repair_line(topic, finding.error(), previous.ledger_id)
            return finding.line(topic.name)  # the ledger this round was writing: discarded anyway
        damaged = topic.ledger.damaged(finding.ledger_id, finding.error())
        if self.metrics is not None:
            self.metrics.integrity.damage_found("original", finding.check)
        return (
            f"{damaged.reason}; compaction stops until the loss is accepted "
            f"({skip_damaged_path(topic.name, finding.ledger_id)})"
        )

    @staticmethod
    def repair_line(topic: ManagedTopic, e: IntegrityError, ledger_id: int | None = None) -> str:
        line = compacted_damage_line(topic.name, e, ledger_id)
        return f"{line}; it was dropped and a repair round rebuilds it from the original ledgers"
