"""The cursors' rows in the metadata database: each subscription's mark-delete position and
individual acks, loaded with its topic and written before an ack is answered.
"""

from __future__ import annotations

from sqlalchemy import delete, insert, select, update

from ledger.entry import Position
from service import models
from service.clock import now_ms
from service.db import Database
from service.errors import NotFound
from service.managed_topic import ManagedTopic
from service.subscriptions import Subscription

#: The compactor's own cursor on each topic (``service.compaction``), no client's subscription.
COMPACTION_CURSOR = "__compaction"


def load_subscriptions(db: Database, topic: ManagedTopic) -> None:
    """Load every durable subscription of ``topic`` (not the compactor's cursor) into
    ``topic.subscriptions``; reading resumes just after its mark-delete position."""
    with db.session() as s:
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


def insert_cursor(db: Database, topic: ManagedTopic, sub: str, md: Position) -> int:
    """A new cursor row for subscription ``sub``, at mark-delete position ``md``; its id."""
    with db.session() as s:
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
    return cursor_id


def delete_cursor(db: Database, state: Subscription) -> None:
    """The subscription's cursor row, and its acks with it."""
    with db.session() as s:
        s.execute(delete(models.Cursor).where(models.Cursor.id == state.cursor_id))


def save_cursor(db: Database, state: Subscription) -> None:
    """Write the subscription's mark-delete position and individual acks."""
    # Committed before the ack returns, so a crash of the service never loses it; not
    # waiting for the disk (a lost machine can cost a redelivery, as in Pulsar and Kafka).
    # Plain statements, not the ORM: this runs once per acknowledgement request.
    acked = sorted(state.acked)
    with db.session(synced=False) as s:
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
