"""Topic termination's record in the metadata (Pulsar's terminate): the id of a terminated
topic's last message, written once, read back by whichever instance loads the topic next, so
a terminated topic stays so across restarts and owners.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import update
from sqlalchemy.orm import Session

from ledger.entry import Position
from service import models
from service.db import Database


def load(db: Database, topic_id: int) -> Position | None:
    """The topic's terminated position, None while it takes writes."""
    with db.session() as s:
        row = s.get(models.Topic, topic_id)
        if row is None or row.terminated_ledger is None or row.terminated_entry is None:
            return None
        return Position(row.terminated_ledger, row.terminated_entry)


def store(db: Database, topic_id: int, last: Position, fence: Callable[[Session], None] | None) -> None:
    """Record the termination (``fence``: refused once this instance's lease on it moved)."""
    with db.session() as s:
        if fence is not None:
            fence(s)
        s.execute(
            update(models.Topic)
            .where(models.Topic.id == topic_id, models.Topic.terminated_ledger.is_(None))
            .values(terminated_ledger=last.ledger_id, terminated_entry=last.entry_id)
        )
