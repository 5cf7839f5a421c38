"""The managed ledger of a topic: its ordered original ledgers, the last one open for appends.

Invariants:
- at most one ledger of a topic is OPEN, and it is the one with the highest id;
- a CLOSED ledger has a sealed Parquet file and no write-ahead file (once recovery has run);
- an entry is readable only once it is acknowledged (durable under the fsync policy);
- entry ids of a ledger run 0..n-1, and ``n <= max_entries_per_ledger``.

Roll-over switches appends to a new ledger at once (its metadata row committed and its
write-ahead file created first) and seals the old one in the background, so producers never
wait for Parquet: fsync and close the old write-ahead file, write the Parquet file (staged,
fsynced, read back, then renamed into place or uploaded to the ledger storage,
``ledger.storage``), mark the ledger CLOSED in the metadata, and only then remove the
write-ahead file. Until it is CLOSED the old ledger is read from its write-ahead
file (opened per read: a ledger waiting to be sealed holds no descriptor). Every crash point
recovers (see ``recover``): a ledger left OPEN behind a newer one is sealed at start-up.

Bounds (shared by every topic, see :class:`LedgerResources`): sealed ledgers are read through
one LRU of open files; a produce that will roll ledgers over reserves room in the seal backlog
before it writes anything, and is refused (503, nothing written) when none comes in time; the
records kept in memory for sealing have one byte budget. A sealing that fails is retried with
back-off, and the ledger stays readable from its write-ahead file meanwhile.

Integrity (README, "Integrity and repair"): sealing reads the Parquet file back and compares
it with the write-ahead records before the write-ahead file goes, and records the file's
CRC32C in the metadata; a mismatch keeps the write-ahead file and retries. A read that meets a
damaged row group marks the ledger damaged in the metadata and raises ``DamagedData`` naming
the topic, the ledger and the check; its other row groups stay readable. Once an operator
accepts the loss (:meth:`ManagedLedger.accept_damage`), reads skip the lost entries, as
Pulsar's ``autoSkipNonRecoverableData`` does, and compactions read a verified copy of the
intact rows.

Where its jobs live: :class:`ManagedLedger` (here) opens the log and appends, rolls over and
closes; its state and lock are ``service.ledger_state``; sealing (ahead of the roll-over, after
it, retried) is ``service.sealing``; reads and waits ``service.ledger_reads``; the sealed
ledgers' files and integrity ``service.sealed_ledger_files``; recovery at start-up
``service.ledger_recovery``; the ledger infos and rows ``service.ledger_info``; what every
managed ledger shares ``service.ledger_resources``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy.orm import Session

from ledger.entry import Appended, Position, entry_count
from ledger.open_log import OpenLog
from ledger.storage import StoragePath, as_storage_path
from service import models
from service.clock import now_ms
from service.db import Database
from service.errors import TopicTerminated, is_descriptor_exhaustion
from service.ledger_info import new_ledger_row, refresh_open
from service.ledger_reads import LedgerReads
from service.ledger_recovery import recover_ledgers
from service.ledger_resources import LedgerResources, open_log
from service.sealing import Ahead, Sealing
from service.settings import Settings

log = logging.getLogger(__name__)


# In memory only: closed for appends, sealing in the background (OPEN in the metadata).
SEALING = "SEALING"


class ManagedLedger(Sealing, LedgerReads):
    """Appends, roll-over and reads of one topic's original log. Thread-safe.

    Its state and lock are :class:`service.ledger_state.LedgerState`'s; its jobs come from
    :class:`service.sealing.Sealing` and :class:`service.ledger_reads.LedgerReads` (with
    :class:`service.sealed_ledger_files.SealedLedgerFiles`), all on that one state and lock."""

    # ---------------------------------------------------------------- opening

    @classmethod
    def create(
        cls,
        *,
        topic_id: int,
        root: Path,
        db: Database,
        settings: Settings,
        shared: LedgerResources,
        store: StoragePath | None = None,
    ) -> ManagedLedger:
        """Open a brand-new topic's log with its first (empty) ledger."""
        if shared.wal is None:
            root.mkdir(parents=True, exist_ok=True)
        with db.session() as s:
            info = new_ledger_row(s, topic_id)
        wal = open_log(shared, root, info, settings, None, new=True)
        return cls(
            topic_id=topic_id,
            root=root,
            db=db,
            settings=settings,
            ledgers=[info],
            wal=wal,
            shared=shared,
            store=store,
        )

    @classmethod
    def recover(
        cls,
        *,
        topic_id: int,
        root: Path,
        db: Database,
        settings: Settings,
        shared: LedgerResources,
        epoch: int = 0,
        fence: Callable[[Session], None] | None = None,
        store: StoragePath | None = None,
    ) -> ManagedLedger:
        """Open an existing topic's log after a clean stop or a crash at any point.

        A ledger left open by an owner of an older ``epoch`` (a takeover) is never appended to:
        it is sealed with the whole records its write-ahead file holds now, and a new ledger of
        this epoch is opened after it. So bytes a fenced-off owner writes late land beyond the
        sealed end of its own ledger, and are never read as this owner's."""
        store = store if store is not None else as_storage_path(root)
        infos, wal = recover_ledgers(
            topic_id=topic_id,
            root=root,
            db=db,
            settings=settings,
            shared=shared,
            epoch=epoch,
            fence=fence,
            store=store,
        )
        return cls(
            topic_id=topic_id,
            root=root,
            db=db,
            settings=settings,
            ledgers=infos,
            wal=wal,
            shared=shared,
            epoch=epoch,
            fence=fence,
            store=store,
        )

    # ---------------------------------------------------------------- writing

    def append(self, records: Sequence[Appended], sizes: Sequence[int] | None = None) -> list[Position]:
        """Append records (and whole Pulsar batches); returns each one's id (a batch's first
        entry) once every one is acknowledged (durable). ``sizes``: each one's payload bytes
        (``record_size``; a batch's ``size``), when the caller has them.

        A batch that fills ledgers first reserves room for their sealing; if the seal backlog
        stays full for ``seal_wait_ms`` it raises ``SealBacklogFull`` with nothing written.
        """
        reserved = [0]  # places in the seal backlog held for this batch's roll-overs, not spent yet
        try:
            while True:
                with self._lock:
                    self._check_open()
                    if self.terminated is not None:
                        raise TopicTerminated(f"topic {self.name} is terminated: it takes no more messages")
                    # More roll-overs than a topic may have waiting are counted when they happen.
                    wanted = min(self._roll_overs_for(records), self._backlog.per_topic)
                    if wanted <= reserved[0]:
                        wal, token, positions = self._append_locked(records, reserved, sizes)
                        break
                # Waits without the lock: the sealer needs it to finish the seals we wait for.
                reserved[0] += self._backlog.reserve(
                    self.topic_id, wanted - reserved[0], self._settings.seal_wait_ms / 1000
                )
        finally:
            self._backlog.release(self.topic_id, reserved[0])  # reserved room this batch did not use
        # Outside the lock, so that concurrent producers share one fsync (group commit).
        wal.sync(token)
        with self._lock:
            if wal is self._wal:
                refresh_open(self._current, wal)
            self._appended.notify_all()
            self._wake_watchers_locked()
        return positions

    def terminate(self) -> Position:
        """Take no more appends (Pulsar's terminate); returns the last entry written, which every
        append in flight has (entry -1 of the open ledger when the log has none). Again on a
        terminated log: the same position."""
        with self._lock:
            self._check_open()
            if self.terminated is None:
                written = self._wal.written_entries
                last = Position(self._current.ledger_id, written - 1) if written else None
                for info in reversed(self._ledgers[:-1]):
                    if last is not None:
                        break
                    if info.entries:
                        last = Position(info.ledger_id, info.entries - 1)
                self.terminated = last or Position(self._current.ledger_id, -1)
            return self.terminated

    def _append_locked(
        self, records: Sequence[Appended], reserved: list[int], sizes: Sequence[int] | None = None
    ) -> tuple[OpenLog, int, list[Position]]:
        """Write the records, rolling over full ledgers (each spends a place of ``reserved[0]``);
        returns the last write-ahead log written, the token to sync, and the ids."""
        positions: list[Position] = []
        if self._current.entries and now_ms() - self._current.created_at >= self._settings.max_ledger_age_ms:
            self._roll_over_counted(reserved)
        i = 0
        wal, token = self._wal, -1
        while i < len(records):
            if self._full():  # a roll-over after the last batch failed: the ledger is still full
                self._roll_over_counted(reserved)
            room = self._settings.max_entries_per_ledger - self._wal.written_entries
            # A Pulsar batch is one entry to the client: never split over two ledgers (the
            # ledger takes the whole batch beyond its entry limit).
            end, counts = i, []
            while end < len(records) and (room > 0 or end == i):
                n = entry_count(records[end])
                counts.append(n)
                room -= n
                end += 1
            chunk = records[i:end]
            size_before = self._wal.written_size_bytes
            first, token = self._wal.append(chunk, None if sizes is None else sizes[i:end])
            added = sum(counts)
            self.entries_added += added
            self.bytes_added += self._wal.written_size_bytes - size_before
            self._remember(chunk, added)
            wal = self._wal
            ledger_id = self._current.ledger_id
            for n in counts:
                positions.append(Position(ledger_id, first))
                first += n
            i = end
            if self._full():
                try:
                    self._roll_over_counted(reserved)
                except OSError as e:
                    if i < len(records) or not is_descriptor_exhaustion(e):
                        raise
                    # The batch is written: acknowledge it; the next append rolls over.
                    self._shared.exhaustion.note(f"rolling over ledger {ledger_id}", e)
        return wal, token, positions

    def _full(self) -> bool:
        return (
            self._wal.written_entries >= self._settings.max_entries_per_ledger
            or self._wal.written_size_bytes >= self._settings.max_ledger_size_bytes
        )

    def _roll_overs_for(self, records: Sequence[Appended]) -> int:
        """How many ledgers ``records`` fill (by entries; size and age are not foreseen, and
        are counted when they happen)."""
        n = sum(map(entry_count, records))
        room = self._settings.max_entries_per_ledger - self._wal.written_entries
        if n < room:
            return 0
        return 1 + (n - max(room, 0)) // self._settings.max_entries_per_ledger

    def _roll_over_counted(self, reserved: list[int] | None = None) -> None:
        """Roll over, spending one reserved place in the seal backlog (or counting one more)."""
        self._roll_over_locked()
        if reserved and reserved[0]:
            reserved[0] -= 1
        else:
            self._backlog.force(self.topic_id)

    def roll_over(self, timeout: float = 600.0) -> Position | None:
        """Close the open ledger if it has entries and wait until every closed ledger is
        sealed (compaction reads sealed files); returns the last position of the log."""
        with self._lock:
            self._check_open()
            if self._wal.written_entries:
                self._roll_over_counted()
            # Taken now: producers go on appending (and rolling over) while we wait.
            last = self.last_position()
            if last is not None:
                self.wait_sealed(timeout, upto=last.ledger_id)
            return last

    def _roll_over_locked(self) -> None:
        old, wal = self._current, self._wal
        # Written entries durable first (object storage may be away: then nothing changes).
        wal.flush()
        with self._db.session() as s:
            if self.fence is not None:
                self.fence(s)
            successor = new_ledger_row(s, self.topic_id, self.epoch)
        # The successor's file before any state changes: if it cannot be created (out of
        # descriptors), the full ledger stays the open one and nothing was rolled over.
        try:
            new_wal = open_log(self._shared, self.root, successor, self._settings, self.fence, new=True)
        except BaseException:
            self._drop_ledger_row(successor.ledger_id)
            raise
        # Every written entry becomes durable and readable now: the ledger is complete before
        # readers move past it to the next one. Closing also frees its descriptor while it
        # waits to be sealed.
        wal.close()
        refresh_open(old, wal)
        cache, cache_bytes = self._cache, self._cache_bytes
        ahead = Ahead(self._seal_writer, self._cache_start, self._cache_entries)
        old.state = SEALING
        self._sealing[old.ledger_id] = wal
        self._ledgers.append(successor)
        self._wal = new_wal
        self._cache, self._cache_bytes, self._cache_entries = [], 0, 0
        self._seal_writer, self._cache_start, self._presealed, self._presealing = None, 0, 0, False
        self._sealer.submit(self._seal_in_background, old, wal, cache, cache_bytes, ahead)

    def _drop_ledger_row(self, ledger_id: int) -> None:
        """A successor row whose file could not be created: mark it DELETED (best effort; an
        OPEN row left behind is sealed empty at the next start)."""
        try:
            with self._db.session() as s:
                row = s.get(models.Ledger, ledger_id)
                if row is not None:
                    row.state = models.DELETED
        except Exception:  # noqa: BLE001 - the original error is the one to report
            log.exception("could not drop ledger row %s", ledger_id)

    def close(self) -> None:
        """Stop accepting appends and release files (the open ledger stays OPEN on disk)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._appended.notify_all()
            self._wake_watchers_locked()
            self._sealed_cv.notify_all()
            for wal in [self._wal, *self._sealing.values()]:
                if self._shared.wal is None:
                    wal.close()
                    continue
                try:  # what was written is stored, if the store answers; nothing else was acknowledged
                    wal.close()
                except Exception as e:  # noqa: BLE001
                    log.warning("%s: closing ledger %s: %s", self.name, wal.ledger_id, e)
                wal.discard()  # its chunks stay: the next owner reads the ledger back from them
            self._backlog.forget(self.topic_id)
            self._backlog.refund_cache(self._cache_bytes)
            self._cache, self._cache_bytes, self._cache_entries = None, 0, 0
            writer, self._seal_writer = self._seal_writer, None
        if writer is not None:
            writer.abandon()  # its ledger stays OPEN: the next start seals it from its file
        root = self.root
        self._files.discard(lambda key: key[0] == root)
