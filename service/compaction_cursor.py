"""The ``__compaction`` cursor's metadata: its mark-delete is the horizon of the last round
that committed, its property ``CompactedTopicLedger`` the compacted ledger that round wrote.
Read when a topic loads (its compacted view), moved by the one transaction that makes a round
visible (:func:`commit_round`: the new ledger CLOSED, the previous one DELETED, the cursor
moved, the run recorded, all or nothing, and only while this instance owns the topic); and a
new compacted ledger's row, made BUILDING before a round writes anything."""

from __future__ import annotations

from sqlalchemy import select

from compactor import CompactionResult
from ledger import paths
from ledger.entry import Position
from service import models
from service.clock import now_ms
from service.compacted_view import CompactedView
from service.compaction_runs import SUCCESS
from service.cursor_store import COMPACTION_CURSOR
from service.db import Database
from service.managed_topic import ManagedTopic

COMPACTED_LEDGER_PROPERTY = "CompactedTopicLedger"


def load_view(*, db: Database, topic: ManagedTopic) -> int | None:
    """Load the topic's compacted view from its cursor (``topic.view``); returns the id of the
    compacted ledger it names (None: no round committed yet)."""
    with db.session() as s:
        cursor = s.scalar(
            select(models.Cursor).where(
                models.Cursor.topic_id == topic.topic_id, models.Cursor.name == COMPACTION_CURSOR
            )
        )
        if cursor is None:
            return None
        prop = s.get(models.CursorProperty, (cursor.id, COMPACTED_LEDGER_PROPERTY))
        if prop is None or cursor.mark_delete_ledger < 0:
            return None
        horizon = Position(cursor.mark_delete_ledger, cursor.mark_delete_entry)
        ledger_id = prop.value
        row = s.get(models.Ledger, ledger_id)
        checksum = row.checksum if row is not None else None
    topic.view = CompactedView(
        horizon=horizon,
        ledger_id=ledger_id,
        directory=paths.compacted_dir(topic.ledger.store, ledger_id),
        checksum=checksum,
        files=topic.layer_files,
    )
    return ledger_id


def referenced_id(*, db: Database, topic: ManagedTopic) -> int | None:
    """The id of the compacted ledger the topic's cursor names, if any (not read)."""
    with db.session() as s:
        cursor = s.scalar(
            select(models.Cursor).where(
                models.Cursor.topic_id == topic.topic_id, models.Cursor.name == COMPACTION_CURSOR
            )
        )
        prop = s.get(models.CursorProperty, (cursor.id, COMPACTED_LEDGER_PROPERTY)) if cursor else None
        return prop.value if prop is not None else None


def allocate_ledger(*, db: Database, topic: ManagedTopic) -> int:
    """A new compacted ledger's row, BUILDING (before the round's first write: the sweep of
    orphans leaves its files alone); returns its id."""
    with db.session() as s:
        row = models.Ledger(
            topic_id=topic.topic_id,
            kind=models.COMPACTED,
            state=models.BUILDING,
            entries=0,
            size_bytes=0,
            file_bytes=0,
            created_at=now_ms(),
        )
        s.add(row)
        s.flush()
        return row.id


def commit_round(
    *,
    db: Database,
    topic: ManagedTopic,
    run_id: int,
    result: CompactionResult,
    previous: CompactedView | None,
    checksum: str,
) -> None:
    """The one transaction that makes a round visible (only while this instance owns the topic)."""
    with db.session() as s:
        if topic.ledger.fence is not None:
            topic.ledger.fence(s)
        ledger = s.get(models.Ledger, result.ledger_id)
        assert ledger is not None
        ledger.state = models.CLOSED
        ledger.checksum = checksum
        ledger.entries = result.records_kept
        ledger.file_bytes = result.bytes_out
        ledger.size_bytes = result.bytes_out
        ledger.closed_at = now_ms()
        if previous is not None:
            old = s.get(models.Ledger, previous.ledger_id)
            if old is not None:
                old.state = models.DELETED
        cursor = s.scalar(
            select(models.Cursor).where(
                models.Cursor.topic_id == topic.topic_id, models.Cursor.name == COMPACTION_CURSOR
            )
        )
        if cursor is None:
            cursor = models.Cursor(topic_id=topic.topic_id, name=COMPACTION_CURSOR, created_at=now_ms())
            s.add(cursor)
            s.flush()
        cursor.mark_delete_ledger = result.horizon.ledger_id
        cursor.mark_delete_entry = result.horizon.entry_id
        prop = s.get(models.CursorProperty, (cursor.id, COMPACTED_LEDGER_PROPERTY))
        if prop is None:
            s.add(
                models.CursorProperty(
                    cursor_id=cursor.id, name=COMPACTED_LEDGER_PROPERTY, value=result.ledger_id
                )
            )
        else:
            prop.value = result.ledger_id
        run = s.get(models.CompactionRun, run_id)
        assert run is not None
        run.status = SUCCESS
        run.finished_at = now_ms()
        run.horizon_ledger = result.horizon.ledger_id
        run.horizon_entry = result.horizon.entry_id
        run.compacted_ledger_id = result.ledger_id
        run.entries_read = result.entries_read
        run.records_kept = result.records_kept
        run.records_removed = result.records_removed
        run.bytes_in = result.bytes_in
        run.bytes_out = result.bytes_out
        run.phase_one_ms = result.phase_one_ms
        run.phase_two_ms = result.phase_two_ms
