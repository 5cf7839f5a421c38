"""The write-ahead objects of this instance (``COMPACTOR_WAL=object``): the group committer
of :mod:`ledger.object_wal`, and the index of their chunks in the metadata database.

A flush's chunks are recorded in one transaction that runs each topic's fence first, so a
fenced-off old owner can never record a chunk once a new owner holds the topic: the new
owner's recovery reads exactly the chunks recorded before its takeover, and seals them.

Chunks go once their ledger is sealed (:meth:`ObjectWal.release`), and an object once no
chunk names it. Whatever a crash leaves between those steps (chunks of a sealed ledger, an
object stored by a flush that never committed) goes with :meth:`ObjectWal.sweep`, which
start-up and every scrub run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ledger.object_wal import Chunk, GroupCommitter, ObjectLog
from ledger.storage import Storage
from service import models
from service.clock import now_ms
from service.db import Database
from service.errors import OwnershipLost, Unavailable
from service.settings import Settings

log = logging.getLogger(__name__)

#: Where the write-ahead objects are, under the ledger storage's root.
PREFIX = "wal"
#: An object of another live instance that no chunk names is left alone this long: a flush
#: stores its object before it records the chunks.
ORPHAN_AGE_MS = 10 * 60 * 1000

Fence = Callable[[Session], None]


class ObjectWal:
    """Opens, recovers and retires the object-stored logs of this instance's open ledgers."""

    def __init__(self, *, db: Database, storage: Storage, settings: Settings) -> None:
        self.db = db
        self.storage = storage
        self.instance_id: int | None = None
        self.committer = GroupCommitter(
            storage,
            self._commit,
            prefix=PREFIX,
            flush_ms=settings.wal_flush_ms,
            flush_bytes=settings.wal_flush_bytes,
        )

    def start(self, instance_id: int | None = None) -> None:
        """Start flushing; objects are named after ``instance_id`` (None: a single instance),
        so that the sweep knows whose flush may still be under way."""
        self.instance_id = instance_id
        self.committer.start(f"i{instance_id or 0}-{uuid.uuid4().hex[:12]}")

    def stop(self) -> None:
        self.committer.stop()

    def open(self, ledger_id: int, fence: Fence | None, *, new: bool) -> ObjectLog:
        """Ledger ``ledger_id``'s log: empty when it is ``new``, else as its chunks hold it."""
        if new:
            return self.committer.create(ledger_id, owner=fence)
        with self.db.session() as s:
            rows = s.scalars(
                select(models.WalChunk)
                .where(models.WalChunk.ledger_id == ledger_id)
                .order_by(models.WalChunk.first_entry, models.WalChunk.id)
            ).all()
            chunks = [
                Chunk(r.ledger_id, r.first_entry, r.entries, r.object_key, r.byte_offset, r.byte_length)
                for r in rows
            ]
        return self.committer.recover(ledger_id, chunks, owner=fence)

    def _commit(self, chunks: Sequence[tuple[Chunk, Any]]) -> dict[int, BaseException]:
        try:
            return self._record(chunks)
        except DBAPIError as e:  # the producers waiting get a 503; the next flush tries again
            text = str(e.orig or e).strip()
            first = text.splitlines()[0][:300] if text else type(e).__name__
            raise Unavailable(f"the metadata database does not answer: {first}") from e

    def _record(self, chunks: Sequence[tuple[Chunk, Any]]) -> dict[int, BaseException]:
        refused: dict[int, BaseException] = {}
        now = now_ms()
        with self.db.session() as s:
            for chunk, fence in chunks:
                if fence is not None:
                    try:
                        fence(s)
                    except OwnershipLost as e:
                        refused[chunk.ledger_id] = e
                        continue
                s.add(
                    models.WalChunk(
                        ledger_id=chunk.ledger_id,
                        first_entry=chunk.first_entry,
                        entries=chunk.entries,
                        object_key=chunk.key,
                        byte_offset=chunk.offset,
                        byte_length=chunk.length,
                        created_at=now,
                    )
                )
        return refused

    def release(self, ledger_ids: Iterable[int]) -> None:
        """Forget the chunks of ``ledger_ids`` (sealed, or their topic deleted), and remove
        the objects no chunk names any more. Best effort: the sweep finishes what fails."""
        ids = list(ledger_ids)
        if not ids:
            return
        try:
            with self.db.session() as s:
                keys = set(
                    s.scalars(
                        select(models.WalChunk.object_key)
                        .where(models.WalChunk.ledger_id.in_(ids))
                        .distinct()
                    )
                )
                s.execute(delete(models.WalChunk).where(models.WalChunk.ledger_id.in_(ids)))
            self._remove_unnamed(keys)
        except Exception as e:  # noqa: BLE001 - the scrub's sweep removes them later
            log.warning("removing the write-ahead objects of ledgers %s failed: %s", ids, e)

    def keys_of_topic(self, session: Session, topic_id: int) -> set[str]:
        """The objects holding chunks of a topic's ledgers (before the topic is deleted)."""
        ledgers = select(models.Ledger.id).where(models.Ledger.topic_id == topic_id)
        return set(
            session.scalars(
                select(models.WalChunk.object_key).where(models.WalChunk.ledger_id.in_(ledgers)).distinct()
            )
        )

    def remove_unnamed(self, keys: set[str]) -> None:
        """Remove those of ``keys`` that no chunk names (a deleted topic's objects). Best effort."""
        try:
            self._remove_unnamed(keys)
        except Exception as e:  # noqa: BLE001 - the scrub's sweep removes them later
            log.warning("removing write-ahead objects failed: %s", e)

    def _remove_unnamed(self, keys: set[str]) -> None:
        if not keys:
            return
        with self.db.session() as s:
            named = set(
                s.scalars(
                    select(models.WalChunk.object_key).where(models.WalChunk.object_key.in_(keys)).distinct()
                )
            )
        for key in sorted(keys - named):
            self.storage.delete(key)

    def sweep(self, live: set[int] | None = None, dead_age_ms: int = 0) -> int:
        """Remove the chunks of ledgers that are no longer open, then the write-ahead objects
        no chunk names, unless a flush may still record them: this committer's under way, a
        live instance's (``live``; None: a single instance, no other writes) younger than
        :data:`ORPHAN_AGE_MS`, a dead one's younger than ``dead_age_ms`` (its last lease, in
        case it was only paused). Returns how many objects went."""
        found = self.storage.list(PREFIX)  # before what the index names: see below
        mine, done = self.committer.writer, self.committer.completed
        with self.db.session() as s:
            still_open = select(models.Ledger.id).where(models.Ledger.state == models.OPEN)
            s.execute(delete(models.WalChunk).where(models.WalChunk.ledger_id.not_in(still_open)))
            named = set(s.scalars(select(models.WalChunk.object_key).distinct()))
        now = now_ms()
        removed = 0
        for f in found:
            # Named now, or listed before its flush committed and named in the query above:
            # either way not an orphan. Not named: its flush failed, or has not committed yet.
            if f.key in named:
                continue
            writer, _, name = f.key[len(PREFIX) + 1 :].partition("/")
            age = now - f.mtime_ms if f.mtime_ms is not None else 0
            if writer == mine:
                sequence = name.split(".", 1)[0]
                if sequence.isdigit() and int(sequence) > done:
                    continue  # this process's flush under way
            elif live is not None:
                instance = _instance_of(writer)
                limit = ORPHAN_AGE_MS if instance in live else dead_age_ms
                if age < limit:
                    continue
            self.storage.delete(f.key)
            removed += 1
        if removed:
            log.info("removed %d write-ahead objects no ledger needs", removed)
        return removed


def _instance_of(writer: str) -> int | None:
    head = writer.split("-", 1)[0]
    return int(head[1:]) if head.startswith("i") and head[1:].isdigit() else None
