"""Sealing a topic's ledgers: writing a ledger's Parquet file ahead while it is open, sealing
it after its roll-over, publishing it, and trying a failed sealing again.

Writing ahead (``_preseal``): whenever a whole row group of the open ledger's records is
cached, the sealer thread encodes it into the ledger's staged file, one preseal in flight per
topic, so its row groups are written in order. Sealing after a roll-over runs in two steps on
two threads, each taking ledgers in the order they were rolled over: the sealer writes and
checks the file (:func:`_seal_file`), the publisher publishes it and commits the ledger CLOSED
(:func:`_publish_seal`); only then does the write-ahead log go. A failed attempt is recorded
(``wait_sealed`` raises it) and tried again with back-off; the ledger stays readable from its
write-ahead log meanwhile. :func:`seal` runs both steps inline (recovery at start-up).

:class:`Sealing` is one of the jobs of :class:`service.managed_ledger.ManagedLedger`, on its
state (``service.ledger_state``). What an append calls (``_remember``, which hands the next
whole row groups to the sealer) and ``wait_sealed`` run under the ledger's lock; the sealer's
and publisher's steps run without it and take it only to hand their result back (the cache
trimmed, the ledger's info replaced by its CLOSED one, a failure recorded, the waiters of
``wait_sealed`` notified)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from ledger import paths
from ledger.batches import appended_table
from ledger.entry import Appended, StoredBatch, entry_count
from ledger.open_log import OpenLog
from ledger.parquet_store import ROW_GROUP_SIZE, SealInfo, SealWriter
from ledger.storage import StoragePath
from service import models
from service.clock import now_ms
from service.db import Database
from service.errors import is_descriptor_exhaustion
from service.ledger_info import LedgerInfo
from service.ledger_resources import discard_log, keeper
from service.ledger_state import LedgerState

log = logging.getLogger(__name__)


# A failed sealing is tried again after this many seconds, doubling up to the maximum.
SEAL_RETRY_S = 0.5
SEAL_RETRY_MAX_S = 30.0


class Sealing(LedgerState):
    """Writing ahead, sealing, publishing and retrying (see the module's docstring)."""

    def _remember(self, records: Sequence[Appended], entries: int) -> None:
        if self._cache is None:
            return
        n = sum(
            len(r.payload) if isinstance(r, StoredBatch) else len(r.value or b"") + len(r.key or "")
            for r in records
        )
        if not self._backlog.charge_cache(n):
            # Over the shared budget: this ledger's sealing reads it back from the file instead.
            self._backlog.refund_cache(self._cache_bytes)
            self._cache, self._cache_bytes, self._cache_entries = None, 0, 0
            return
        self._cache.extend(records)
        self._cache_bytes += n
        self._cache_entries += entries
        self._preseal_next_locked()

    def _preseal_next_locked(self) -> None:
        """Hand the cached records of the open ledger's next whole row groups to the sealer
        (one preseal in flight per topic, so its row groups are written in order)."""
        cache = self._cache
        if cache is None or self._presealing or self._closed:
            return
        if self._seal_writer is not None and not self._seal_writer.usable:
            return  # writing ahead failed for this ledger: its roll-over seals it from the start
        ready = (self._cache_start + self._cache_entries - self._presealed) // ROW_GROUP_SIZE * ROW_GROUP_SIZE
        if not ready:
            return
        info = self._current
        if self._seal_writer is None:
            self._seal_writer = SealWriter(
                paths.sealed_path(self.store, info.ledger_id, self.epoch), keep=self._keep_copy
            )
        # The cached items that hold entries presealed .. presealed + ready - 1.
        at, i = self._cache_start, 0
        while at + entry_count(cache[i]) <= self._presealed:
            at += entry_count(cache[i])
            i += 1
        j, end = i, at
        while end < self._presealed + ready:
            end += entry_count(cache[j])
            j += 1
        try:
            self._sealer.submit(
                self._preseal, info.ledger_id, self._seal_writer, cache[i:j], at, self._presealed, ready
            )
        except RuntimeError:  # the sealer was shut down: the service stops
            return
        self._presealing = True
        self._presealed += ready

    def _preseal(
        self, ledger_id: int, writer: SealWriter, items: list[Appended], items_first: int, first: int, n: int
    ) -> None:
        """Write entries ``first .. first + n - 1`` of the open ledger (whole row groups), which
        ``items`` hold from entry ``items_first`` on, to its sealed file ahead of the roll-over;
        on failure the writer is dropped and the roll-over's sealing writes the file from the
        start, as it would have anyway."""
        try:
            if writer.usable and not self._closed:
                writer.write(appended_table(ledger_id, items, items_first).slice(first - items_first, n))
        except Exception as e:  # noqa: BLE001 - sealing at roll-over does the work instead
            if is_descriptor_exhaustion(e):
                self._shared.exhaustion.note(f"writing ledger {ledger_id} ahead of its sealing", e)
            log.warning(
                "writing ledger %s ahead of its sealing failed: %s; it is sealed at roll-over", ledger_id, e
            )
        with self._lock:
            if writer is not self._seal_writer:
                return  # rolled over meanwhile: the roll-over's sealing finishes the file
            self._presealing = False
            if not writer.usable:
                return  # no more ahead of the roll-over for this ledger
            cache = self._cache
            if cache is not None:
                # Written: the roll-over's sealing needs only what comes after (a batch the
                # written rows end inside stays).
                k = 0
                while k < len(cache) and self._cache_start + entry_count(cache[k]) <= writer.rows:
                    self._cache_start += entry_count(cache[k])
                    self._cache_entries -= entry_count(cache[k])
                    k += 1
                del cache[:k]
            self._preseal_next_locked()

    def wait_sealed(self, timeout: float = 600.0, upto: int | None = None) -> None:
        """Block until no ledger (with an id up to ``upto``) is waiting to be sealed; raises if
        a sealing failed. A ledger whose sealing failed before is tried again first."""
        with self._lock:
            for ledger_id in list(self._seal_errors):
                self._retry_seal_locked(ledger_id)

            def done() -> bool:
                return bool(self._seal_errors) or all(upto is not None and i > upto for i in self._sealing)

            if not self._sealed_cv.wait_for(done, timeout):
                raise TimeoutError(f"ledgers {sorted(self._sealing)} were not sealed in {timeout:g} s")
            if self._seal_errors:
                ledger_id, error = next(iter(self._seal_errors.items()))
                raise RuntimeError(f"ledger {ledger_id} could not be sealed: {error}") from error

    def _seal_in_background(
        self,
        info: LedgerInfo,
        wal: OpenLog,
        cache: list[Appended] | None,
        cache_bytes: int = 0,
        ahead: Ahead | None = None,
    ) -> None:
        """The sealer's step of a sealing: the file written and checked. Its publication and
        commit go to the publisher thread, so that the sealer writes the next ledger's file
        while this one uploads (on object storage an upload is most of a sealing's wait)."""
        try:
            if self._closed:
                if ahead is not None and ahead.writer is not None:
                    ahead.writer.abandon()
                return
            # Runs after any preseal of this ledger (the one sealer thread takes them in order;
            # the writer's lock covers other executors): the writer holds entries 0..rows-1.
            writer = ahead.writer if ahead is not None and ahead.writer is not None else None
            start = ahead.cache_start if ahead is not None else 0
            if writer is not None and not writer.usable:
                writer = None
            # The cache serves if it holds every entry the writer does not (records leave it only
            # once written, so a live writer always covers the ones that left).
            written = writer.rows if writer is not None else 0
            cached = ahead.cache_entries if ahead is not None else -1
            if cache is not None and start + cached == wal.written_entries and start <= written:
                entries: Sequence[Appended] = cache
            else:
                entries, start = wal.read_appended(), 0
            finished = _seal_file(
                self.store,
                info,
                entries,
                first_entry=start,
                writer=writer,
                epoch=self.epoch,
                keep=self._keep_copy,
            )
        except Exception as e:
            self._seal_failed(info, e)
            return
        finally:
            # The records go back to the shared budget once the first attempt is over: a retry
            # reads them back from the write-ahead file.
            self._backlog.refund_cache(cache_bytes)
        try:
            # One publisher thread: ledgers are published and committed in the order sealed.
            self._shared.publisher.submit(self._publish_in_background, info, wal, finished)
        except RuntimeError as e:  # the service stops: the next start seals it again
            finished.writer.abandon()
            self._seal_failed(info, e)

    def _publish_in_background(self, info: LedgerInfo, wal: OpenLog, finished: _Finished) -> None:
        """The publisher's step of a sealing: the file published, the ledger marked CLOSED,
        its write-ahead log discarded."""
        try:
            if self._closed:
                finished.writer.abandon()
                return
            closed = _publish_seal(
                self._db, info, wal, finished, fault_hook=self.fault_hook, fence=self.fence, epoch=self.epoch
            )
            with self._lock:
                if closed is not None:
                    for k in LedgerInfo.__slots__:
                        setattr(info, k, getattr(closed, k))
                self._sealing.pop(info.ledger_id, None)
                self._seal_attempts.pop(info.ledger_id, None)
                discard_log(self._shared, wal)
                self._sealed_cv.notify_all()
            self._backlog.release(self.topic_id)
        except Exception as e:
            finished.writer.abandon()  # its staged file, if the publication never began
            self._seal_failed(info, e)

    def _seal_failed(self, info: LedgerInfo, e: Exception) -> None:
        """A sealing attempt failed: recorded (``wait_sealed`` raises it) and tried again with
        back-off; the ledger stays readable from its write-ahead log meanwhile."""
        if self._closed:
            return  # the topic was deleted or the service stopped under it
        if is_descriptor_exhaustion(e):
            self._shared.exhaustion.note(f"sealing ledger {info.ledger_id}", e)
        with self._lock:
            attempt = self._seal_attempts.get(info.ledger_id, 0) + 1
            self._seal_attempts[info.ledger_id] = attempt
            self._seal_errors[info.ledger_id] = e
            self._sealed_cv.notify_all()
        delay = min(SEAL_RETRY_MAX_S, SEAL_RETRY_S * 2 ** (attempt - 1))
        log.exception(
            "sealing ledger %s failed (attempt %d); it stays readable from its write-ahead log, "
            "trying again in %g s",
            info.ledger_id,
            attempt,
            delay,
            exc_info=e,
        )
        timer = threading.Timer(delay, self._retry_seal, args=(info.ledger_id,))
        timer.daemon = True
        timer.start()

    def _retry_seal(self, ledger_id: int) -> None:
        try:
            with self._lock:
                if not self._closed:
                    self._retry_seal_locked(ledger_id)
        except RuntimeError:  # the sealer was shut down: the service stops, recovery seals it
            log.info("not retrying the sealing of ledger %s: the service is stopping", ledger_id)

    def _retry_seal_locked(self, ledger_id: int) -> None:
        """Submit a failed sealing again, once (the retry timer and ``wait_sealed`` both ask)."""
        if self._seal_errors.pop(ledger_id, None) is None:
            return
        info = next(i for i in self._ledgers if i.ledger_id == ledger_id)
        self._sealer.submit(self._seal_in_background, info, self._sealing[ledger_id], None)

    @property
    def _keep_copy(self) -> Callable[[StoragePath, Path], bool] | None:
        return keeper(self._shared)

    @property
    def seal_failures(self) -> int:
        """Ledgers whose last sealing attempt failed (retried with back-off)."""
        with self._lock:
            return len(self._seal_errors)


def seal(
    db: Database,
    store: StoragePath,
    info: LedgerInfo,
    wal: OpenLog,
    entries: Sequence[Appended],
    *,
    first_entry: int = 0,
    writer: SealWriter | None = None,
    fault_hook: Callable[[str], None] | None = None,
    fence: Callable[[Session], None] | None = None,
    epoch: int = 0,
    keep: Callable[[StoragePath, Path], bool] | None = None,
) -> LedgerInfo | None:
    """Write ``entries`` (the ledger's from ``first_entry`` on, in order) as its sealed Parquet
    file, after the rows ``writer`` already wrote (entries 0..``writer.rows``-1, which must
    cover those before ``first_entry``), and mark it CLOSED in the metadata; returns its closed
    description (None if its row is gone: a deleted topic). The caller removes the write-ahead
    file afterwards. ``epoch``: the sealing owner's, which names the file; ``keep``: what
    may take the uploaded file (the local copies). Both steps, one after the other:
    :func:`_seal_file` and :func:`_publish_seal`."""
    finished = _seal_file(
        store, info, entries, first_entry=first_entry, writer=writer, epoch=epoch, keep=keep
    )
    return _publish_seal(db, info, wal, finished, fault_hook=fault_hook, fence=fence, epoch=epoch)


@dataclass(frozen=True, slots=True)
class _Finished:
    """A ledger's sealed file written, read back and compared, not yet published."""

    writer: SealWriter
    sealed: SealInfo


def _seal_file(
    store: StoragePath,
    info: LedgerInfo,
    entries: Sequence[Appended],
    *,
    first_entry: int = 0,
    writer: SealWriter | None = None,
    epoch: int = 0,
    keep: Callable[[StoragePath, Path], bool] | None = None,
) -> _Finished:
    """The first step of :func:`seal`: the file, finished in its staging place."""
    if writer is None:
        writer = SealWriter(paths.sealed_path(store, info.ledger_id, epoch), keep=keep)
    if writer.rows < first_entry:
        writer.abandon()
        raise ValueError(f"ledger {info.ledger_id}: entries {writer.rows}..{first_entry - 1} are missing")
    rest = appended_table(info.ledger_id, entries, first_entry).slice(writer.rows - first_entry)
    return _Finished(writer, writer.finish(rest, publish=False))


def _publish_seal(
    db: Database,
    info: LedgerInfo,
    wal: OpenLog,
    finished: _Finished,
    *,
    fault_hook: Callable[[str], None] | None = None,
    fence: Callable[[Session], None] | None = None,
    epoch: int = 0,
) -> LedgerInfo | None:
    """The second step of :func:`seal`: the file published (renamed, or uploaded), then the
    ledger marked CLOSED (the commit is what publishes it to readers and rounds)."""
    finished.writer.publish()
    sealed = finished.sealed
    if fault_hook:
        fault_hook("sealed")
    closed = LedgerInfo(
        ledger_id=info.ledger_id,
        state=models.CLOSED,
        entries=sealed.entries,
        size_bytes=wal.size_bytes,
        file_bytes=sealed.file_bytes,
        created_at=info.created_at,
        first_publish_time=wal.first_publish_time,
        last_publish_time=wal.last_publish_time,
        checksum=sealed.checksum,
        verified=True,
        epoch=info.epoch,
        sealed_epoch=epoch,
    )
    with db.session() as s:
        if fence is not None:
            fence(s)
        row = s.get(models.Ledger, info.ledger_id)
        if row is None:
            return None
        for k in (
            "state",
            "entries",
            "size_bytes",
            "file_bytes",
            "first_publish_time",
            "last_publish_time",
            "checksum",
            "sealed_epoch",
        ):
            setattr(row, k, getattr(closed, k))
        row.closed_at = now_ms()
    if fault_hook:
        fault_hook("committed")
    return closed


@dataclass(frozen=True, slots=True)
class Ahead:
    """What a rolled-over ledger's sealing takes from its time open: the writer that holds its
    first row groups (if any) and the entry its cached records start at."""

    writer: SealWriter | None
    cache_start: int
    cache_entries: int = -1
