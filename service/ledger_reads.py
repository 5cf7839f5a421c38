"""Reading a topic's original log: snapshots of its ledgers, positions, entries (one by one
or whole batches) across the open ledger, the ledgers waiting to be sealed (read from their
write-ahead logs) and the sealed ones (through the shared LRU of open files), seeking by
publish time, the backlog after a position, and waiting for entries (a blocked thread, or a
callback for a waiter that holds none).

:class:`LedgerReads` is one of the jobs of :class:`service.managed_ledger.ManagedLedger`, on
its state (``service.ledger_state``). A read takes the ledger's lock to choose its ledger and to
read a write-ahead log (a roll-over or a finished sealing would close it), never while it reads
a sealed file: a ledger deleted under it (retention) is skipped, one damaged is recorded
(``SealedLedgerFiles.damaged``). Waiters are woken under the lock by the append that made
entries readable, and by ``close``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from ledger.checksums import IntegrityError
from ledger.entry import Entry, LedgerItem, Position, StoredBatch, item_entries
from ledger.open_log import OpenLog
from service import models
from service.ledger_info import LedgerInfo, refresh_open
from service.sealed_ledger_files import SealedLedgerFiles

log = logging.getLogger(__name__)


class LedgerReads(SealedLedgerFiles):
    """Reads and waits on the original log (see the module's docstring)."""

    # ---------------------------------------------------------------- reading

    def ledgers(self) -> list[LedgerInfo]:
        """A snapshot of the original ledgers, oldest first."""
        with self._lock:
            refresh_open(self._current, self._wal)
            return [LedgerInfo(**{k: getattr(i, k) for k in LedgerInfo.__slots__}) for i in self._ledgers]

    def end_position(self) -> Position:
        """The position ``latest`` names: just after the last acknowledged entry."""
        with self._lock:
            return Position(self._current.ledger_id, self._wal.entries)

    def last_position(self) -> Position | None:
        """The id of the last acknowledged entry, or None for an empty log."""
        with self._lock:
            if self._wal.entries:
                return Position(self._current.ledger_id, self._wal.entries - 1)
            for info in reversed(self._ledgers[:-1]):
                if info.entries:
                    return Position(info.ledger_id, info.entries - 1)
            return None

    def stored_batch(self, at: Position) -> StoredBatch | None:
        """The Pulsar batch whose first entry is at ``at`` as its producer sent it, while its
        ledger's write-ahead log has it at hand (the open ledger's recent batches); else None."""
        with self._lock:
            if at.ledger_id == self._current.ledger_id:
                wal: OpenLog | None = self._wal
            else:
                wal = self._sealing.get(at.ledger_id)
            return wal.stored_batch(at.entry_id) if wal is not None else None

    def read(self, start: Position, max_entries: int) -> tuple[list[Entry], Position]:
        """Acknowledged entries from ``start`` (inclusive) in id order, and where to go on from.

        ``start`` may name any position: one past a ledger's end or a ledger id that does not
        exist (deleted, or a compacted ledger's) moves on to the next ledger's first entry.
        """
        return self._read(start, max_entries, whole=False)  # type: ignore[return-value]

    def read_batches(self, start: Position, max_entries: int) -> tuple[list[LedgerItem], Position]:
        """What :meth:`read` reads, a stored batch as one :class:`BatchEntry` wherever the read
        holds it whole (its members otherwise): what a consumer of the log receives, with no
        object per member. The entries covered may pass ``max_entries`` by the rest of a batch."""
        return self._read(start, max_entries, whole=True)

    def _read(self, start: Position, max_entries: int, *, whole: bool) -> tuple[list[LedgerItem], Position]:
        out: list[LedgerItem] = []
        got = 0  # entries in ``out`` (a whole batch counts its members)
        pos = start
        while got < max_entries:
            with self._lock:
                snapshot = list(self._ledgers)
                info = next((i for i in snapshot if i.ledger_id >= pos.ledger_id), None)
                if info is None:
                    return out, self.end_position() if pos > self.end_position() else pos
                if info.ledger_id > pos.ledger_id:
                    pos = Position(info.ledger_id, 0)
                is_open = info.state == models.OPEN
                wal = self._wal if is_open else self._sealing.get(info.ledger_id)
                if wal is not None:
                    # Under the lock: a roll-over or a finished sealing would close this file.
                    want = max_entries - got
                    chunk = wal.read_batches(pos.entry_id, want) if whole else wal.read(pos.entry_id, want)
                    ledger_entries = wal.entries
            if wal is None:
                skip_to = info.lost.skip(pos.entry_id) if info.lost else None
                if skip_to is not None:  # entries an operator accepted losing: gone, as with a deleted ledger
                    pos = Position(info.ledger_id, skip_to)
                    if pos.entry_id >= info.entries:
                        pos = Position(info.ledger_id + 1, 0)
                    continue
                want = max_entries - got
                if info.lost:
                    want = min(want, info.lost.room(pos.entry_id))
                try:
                    # acquire/release rather than a ``with``: this runs for every page read.
                    slot = self._files.acquire((self.root, info.ledger_id), self._opener(info.ledger_id))
                    try:
                        reader = slot.reader
                        chunk = (
                            reader.read_batches(pos.entry_id, want)
                            if whole
                            else reader.read(pos.entry_id, want)
                        )
                    finally:
                        self._files.release(slot)
                except IntegrityError as e:
                    raise self.damaged(info.ledger_id, e) from e
                except Exception:
                    with self._lock:
                        if info in self._ledgers:
                            raise
                    pos = Position(info.ledger_id + 1, 0)  # deleted by retention under us
                    continue
                ledger_entries = info.entries
            out.extend(chunk)
            if chunk:
                last = chunk[-1]
                if whole:
                    got += sum(map(item_entries, chunk))
                    pos = Position(last.ledger_id, last.entry_id + item_entries(last))
                else:
                    got += len(chunk)
                    pos = last.position.next()
            if pos.entry_id >= ledger_entries:
                if is_open:
                    break
                pos = Position(info.ledger_id + 1, 0)
            elif not chunk:
                break
        return out, pos

    def find_by_publish_time(self, publish_time: int) -> Position:
        """The first entry published at or after ``publish_time``; the end position if none."""
        with self._lock:
            snapshot = list(self._ledgers)
            for info in snapshot:
                wal = self._wal if info.state == models.OPEN else self._sealing.get(info.ledger_id)
                if wal is not None:
                    entry = wal.first_entry_at_or_after(publish_time)
                    if entry < wal.entries or info.state == models.OPEN:
                        return Position(info.ledger_id, entry)
                    continue
                if not info.entries or (info.last_publish_time or 0) < publish_time:
                    continue
                break
            else:
                return self.end_position()
        try:
            with self._sealed_ledger(info.ledger_id) as reader:
                return Position(info.ledger_id, reader.first_entry_at_or_after(publish_time))
        except IntegrityError as e:
            raise self.damaged(info.ledger_id, e) from e

    def backlog(self, start: Position) -> tuple[int, int]:
        """Entries with id >= ``start`` and their payload bytes (prorated inside a ledger)."""
        entries = size = 0
        for info in self.ledgers():
            if info.ledger_id < start.ledger_id or not info.entries:
                continue
            first = start.entry_id if info.ledger_id == start.ledger_id else 0
            n = max(0, info.entries - max(first, 0))
            entries += n
            size += info.size_bytes * n // info.entries
        return entries, size

    def wait_for_entries(self, after: Position, timeout: float, wakes: int | None = None) -> bool:
        """Block until an entry after ``after`` is readable or ``timeout`` seconds pass; or,
        given ``wakes`` (``self.wakes`` read before the caller looked), until ``wake`` is called."""
        with self._appended:
            return self._appended.wait_for(
                lambda: (
                    self._closed
                    or (wakes is not None and self.wakes != wakes)
                    or (self.last_position() or Position(-1, -1)) > after
                ),
                timeout,
            )

    def on_entry_after(
        self, after: Position, callback: Callable[[], None], wakes: int | None = None
    ) -> Callable[[], None]:
        """``wait_for_entries`` for a waiter that holds no thread (the binary protocol's
        consumers, on the event loop): ``callback()`` is called once, now or from the thread
        that appends (or wakes), when an entry after ``after`` is readable, ``wake`` is called
        (``wakes`` as in ``wait_for_entries``) or the ledger closes. It must not block (it runs
        under the ledger's lock). Returns a function that cancels it."""
        with self._lock:
            ready = (
                self._closed
                or (wakes is not None and self.wakes != wakes)
                or (self.last_position() or Position(-1, -1)) > after
            )
            if not ready:
                self._watchers.append(callback)
        if ready:
            callback()

        def cancel() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._watchers.remove(callback)

        return cancel

    def wake(self) -> None:
        """End the waits of the topic's consumers that wait for an append, as an append would:
        messages were given back to be delivered again (a negative acknowledgement, a
        redelivery, a consumer gone), which no append announces. Each looks again once."""
        with self._lock:
            self.wakes += 1
            self._appended.notify_all()
            self._wake_watchers_locked()

    def _wake_watchers_locked(self) -> None:
        if self._watchers:
            watchers, self._watchers = self._watchers, []
            for callback in watchers:
                try:
                    callback()
                except Exception:  # noqa: BLE001 - one waiter's failure must not fail an append
                    log.exception("waking a waiter of %s failed", self.name)
