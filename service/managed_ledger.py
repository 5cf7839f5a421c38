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
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from compactor.spark import local_cores
from ledger import paths
from ledger.batches import appended_table
from ledger.checksums import IntegrityError
from ledger.entry import Appended, Entry, LedgerItem, Position, StoredBatch, entry_count, item_entries
from ledger.file_cache import FileCache
from ledger.local_copies import LocalCopies
from ledger.open_log import OpenLog
from ledger.parquet_store import ROW_GROUP_SIZE, SealedLedger, SealInfo, SealWriter
from ledger.salvage import LostRanges, write_salvage
from ledger.storage import StoragePath, as_storage_path
from ledger.wal import WriteAheadLog
from service import models
from service.clock import now_ms
from service.db import Database
from service.errors import Conflict, DamagedData, NotFound, is_descriptor_exhaustion
from service.resources import ExhaustionLog
from service.seal_backlog import SealBacklog
from service.settings import Settings
from service.wal_objects import ObjectWal

log = logging.getLogger(__name__)

# In memory only: closed for appends, sealing in the background (OPEN in the metadata).
SEALING = "SEALING"
# A failed sealing is tried again after this many seconds, doubling up to the maximum.
SEAL_RETRY_S = 0.5
SEAL_RETRY_MAX_S = 30.0
# Sealing attempts at start-up (recovery seals inline) before the start fails.
RECOVERY_SEAL_ATTEMPTS = 3


@dataclass
class LedgerResources:
    """What every managed ledger of a service shares: the sealer thread, the LRU of open
    sealed-ledger files, the seal backlog, and the record of descriptor exhaustion."""

    sealer: Executor
    # Publishes (renames, uploads) and commits what the sealer wrote, in order.
    publisher: Executor
    files: FileCache[tuple[Path, int], SealedLedger]  # by (topic directory, ledger id)
    backlog: SealBacklog
    exhaustion: ExhaustionLog = field(default_factory=ExhaustionLog)
    # COMPACTOR_WAL=object: the group-committed write-ahead objects (None: local files).
    wal: ObjectWal | None = None
    # On object storage: the sealed ledgers kept on local disk too, for rounds to read.
    copies: LocalCopies | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        sealer: Executor,
        publisher: Executor,
        max_open_files: int,
        wal: ObjectWal | None = None,
    ) -> LedgerResources:
        copies = None
        # Kept only where they are read: by rounds whose Spark runs in local mode, on this
        # machine (a cluster's executors read the bucket, and copies would only fill the disk).
        if (
            not settings.ledger_storage().local
            and settings.local_copies_bytes > 0
            and local_cores(settings.spark_master) is not None
        ):
            copies = LocalCopies(settings.data_dir / "local-copies", settings.local_copies_bytes)
        return cls(
            wal=wal,
            copies=copies,
            sealer=sealer,
            publisher=publisher,
            files=FileCache(
                max_open=max_open_files,
                max_bytes=settings.ledger_read_cache_bytes,
                idle_s=settings.ledger_file_idle_ms / 1000,
            ),
            backlog=SealBacklog(
                per_topic=settings.max_pending_seals_per_topic,
                total=settings.max_pending_seals,
                cache_bytes=settings.seal_cache_bytes,
            ),
        )


@dataclass(slots=True)
class LedgerInfo:
    """What the managed ledger knows of one of its original ledgers."""

    ledger_id: int
    state: str
    entries: int
    size_bytes: int
    file_bytes: int
    created_at: int
    first_publish_time: int | None = None
    last_publish_time: int | None = None
    # Integrity: the sealed file's recorded CRC32C, the damage found in it (None: intact),
    # whether an operator accepted losing its damaged entries, and which entries those are.
    checksum: str | None = None
    damage: str | None = None
    damage_accepted: bool = False
    lost: LostRanges = LostRanges()
    # In memory only: the whole file matched its checksum since this process started (sealing
    # read it back, a scrub or a compaction's input check verified it). A compaction verifies
    # the others before it reads them; page checksums guard every decode either way.
    verified: bool = False
    epoch: int = 0  # of the owner that opened it (0: a single instance)
    sealed_epoch: int = 0  # of the owner that sealed it: names its sealed file


class ManagedLedger:
    """Appends, roll-over and reads of one topic's original log. Thread-safe."""

    def __init__(
        self,
        *,
        topic_id: int,
        root: Path,
        db: Database,
        settings: Settings,
        ledgers: list[LedgerInfo],
        wal: OpenLog,
        shared: LedgerResources,
        epoch: int = 0,
        fence: Callable[[Session], None] | None = None,
        store: StoragePath | None = None,
    ) -> None:
        self.topic_id = topic_id
        # The owner's epoch (several instances): new ledgers carry it. ``fence`` runs in every
        # transaction that changes the log's metadata and refuses it once the lease moved.
        self.epoch = epoch
        self.fence = fence
        # The topic's write-ahead files are in ``root`` (local disk); its sealed (and
        # compacted) ledgers in ``store`` (the ledger storage: the same directory when that
        # is the local disk, a prefix of a bucket on object storage).
        self.root = root
        self.store = store if store is not None else as_storage_path(root)
        # The topic's full name, for errors (set by the broker).
        self.name = ""
        self._db = db
        self._settings = settings
        self._ledgers = ledgers
        self._wal = wal
        self._lock = threading.RLock()
        # Notified when entries become readable: long-polling consumers wait on it.
        self._appended = threading.Condition(self._lock)
        # Called (once each) when entries become readable: waiters that hold no thread.
        self._watchers: list[Callable[[], None]] = []
        self._shared = shared
        self._files = shared.files
        self._backlog = shared.backlog
        # Ledgers closed for appends whose sealing runs in the background, by id (their
        # write-ahead files are closed: reads open them for themselves).
        self._sealing: dict[int, OpenLog] = {}
        self._seal_errors: dict[int, BaseException] = {}
        self._seal_attempts: dict[int, int] = {}
        self._sealer = shared.sealer
        self._sealed_cv = threading.Condition(self._lock)
        # The open ledger's records and batches as appended, so sealing need not decode the
        # file again; their bytes are charged to the shared seal-cache budget. ``_cache_entries``
        # counts the entries they hold (a batch holds several).
        self._cache: list[Appended] | None = [] if not wal.written_entries else None
        self._cache_bytes = 0
        self._cache_entries = 0
        # The open ledger's sealed file, written while it is open: whenever a whole row group of
        # records is cached, the sealer encodes it (``_preseal``) and the records leave the
        # cache, so the sealing at roll-over (which a compaction round waits for) encodes only
        # the last of them. ``_cache[0]`` starts at entry ``_cache_start``; entries below
        # ``_presealed`` are written or being written by the one preseal in flight (a batch
        # that a row group ends inside stays cached until the next one has it all).
        self._seal_writer: SealWriter | None = None
        self._cache_start = 0
        self._presealed = 0
        self._presealing = False
        self._closed = False
        # Entries and payload bytes appended since the service started (pulsar_in_*_total);
        # written under the lock the append holds anyway.
        self.entries_added = 0
        self.bytes_added = 0
        # Tests simulate a crash at a named point of the roll-over ("sealed", "committed").
        self.fault_hook: Callable[[str], None] | None = None

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
            info = _new_ledger_row(s, topic_id)
        wal = _open_log(shared, root, info, settings, None, new=True)
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
        if shared.wal is None:
            root.mkdir(parents=True, exist_ok=True)
            for tmp in root.glob(f"*{paths.TMP_SUFFIX}"):
                if tmp.is_file():  # a half-written sealed file; the write-ahead file still has its entries
                    tmp.unlink()
        with db.session() as s:
            rows = s.scalars(
                select(models.Ledger)
                .where(models.Ledger.topic_id == topic_id, models.Ledger.kind == models.ORIGINAL)
                .where(models.Ledger.state != models.DELETED)
                .order_by(models.Ledger.id)
            ).all()
            infos = [_info(r) for r in rows]
            if fence is not None:
                fence(s)
            if not infos or infos[-1].state != models.OPEN or infos[-1].epoch != epoch:
                infos.append(_new_ledger_row(s, topic_id, epoch))
        for info in infos[:-1]:
            if info.state == models.OPEN:  # the stop came before its background sealing finished
                log.info("sealing ledger %s of topic %s, closed before the stop", info.ledger_id, topic_id)
                wal = _open_log(shared, root, info, settings, fence, new=False)
                for attempt in range(1, RECOVERY_SEAL_ATTEMPTS + 1):
                    try:
                        closed = _seal(
                            db,
                            store,
                            info,
                            wal,
                            wal.read_appended(),
                            fence=fence,
                            epoch=epoch,
                            keep=_keeper(shared),
                        )
                        break
                    except IntegrityError:  # the file read back wrong: the write-ahead file stays
                        log.exception("sealing ledger %s: attempt %d failed", info.ledger_id, attempt)
                        if attempt == RECOVERY_SEAL_ATTEMPTS:
                            raise
                _discard(shared, wal)
                if closed is not None:
                    for k in LedgerInfo.__slots__:
                        setattr(info, k, getattr(closed, k))
            if shared.wal is None:
                wal_file = paths.wal_path(root, info.ledger_id, info.epoch)
                if wal_file.exists():  # crashed after CLOSED was committed, before the unlink
                    wal_file.unlink()
                    paths.fsync_dir(root)
        # A sealed file of no CLOSED ledger: the open ledger sealed just before a crash (it is
        # sealed again at its roll-over), or a ledger deleted by retention before its unlink.
        live = {
            paths.sealed_path(store, i.ledger_id, i.sealed_epoch).name
            for i in infos
            if i.state == models.CLOSED
        }
        for sealed_file in store.files():
            if sealed_file.name.endswith(".parquet") and sealed_file.name not in live:
                sealed_file.unlink()
        current = infos[-1]
        wal = _open_log(shared, root, current, settings, fence, new=False)
        if wal.recovery.truncated_bytes:
            log.warning(
                "ledger %s: truncated a torn tail of %d bytes, kept in %s",
                current.ledger_id,
                wal.recovery.truncated_bytes,
                wal.recovery.quarantine_path,
            )
        _refresh_open(current, wal)
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
                _refresh_open(self._current, wal)
            self._appended.notify_all()
            self._wake_watchers_locked()
        return positions

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

    def wait_for_entries(self, after: Position, timeout: float) -> bool:
        """Block until an entry after ``after`` is readable or ``timeout`` seconds pass."""
        with self._appended:
            return self._appended.wait_for(
                lambda: self._closed or (self.last_position() or Position(-1, -1)) > after, timeout
            )

    def on_entry_after(self, after: Position, callback: Callable[[], None]) -> Callable[[], None]:
        """``wait_for_entries`` for a waiter that holds no thread (the binary protocol's
        consumers, on the event loop): ``callback()`` is called once, now or from the thread
        that appends, when an entry after ``after`` is readable or the ledger closes. It must
        not block (it runs under the ledger's lock). Returns a function that cancels it."""
        with self._lock:
            ready = self._closed or (self.last_position() or Position(-1, -1)) > after
            if not ready:
                self._watchers.append(callback)
        if ready:
            callback()

        def cancel() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._watchers.remove(callback)

        return cancel

    def _wake_watchers_locked(self) -> None:
        if self._watchers:
            watchers, self._watchers = self._watchers, []
            for callback in watchers:
                try:
                    callback()
                except Exception:  # noqa: BLE001 - one waiter's failure must not fail an append
                    log.exception("waking a waiter of %s failed", self.name)

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

    def _roll_over_locked(self) -> None:
        old, wal = self._current, self._wal
        # Written entries durable first (object storage may be away: then nothing changes).
        wal.flush()
        with self._db.session() as s:
            if self.fence is not None:
                self.fence(s)
            successor = _new_ledger_row(s, self.topic_id, self.epoch)
        # The successor's file before any state changes: if it cannot be created (out of
        # descriptors), the full ledger stays the open one and nothing was rolled over.
        try:
            new_wal = _open_log(self._shared, self.root, successor, self._settings, self.fence, new=True)
        except BaseException:
            self._drop_ledger_row(successor.ledger_id)
            raise
        # Every written entry becomes durable and readable now: the ledger is complete before
        # readers move past it to the next one. Closing also frees its descriptor while it
        # waits to be sealed.
        wal.close()
        _refresh_open(old, wal)
        cache, cache_bytes = self._cache, self._cache_bytes
        ahead = _Ahead(self._seal_writer, self._cache_start, self._cache_entries)
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

    def _seal_in_background(
        self,
        info: LedgerInfo,
        wal: OpenLog,
        cache: list[Appended] | None,
        cache_bytes: int = 0,
        ahead: _Ahead | None = None,
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
                _discard(self._shared, wal)
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
        return _keeper(self._shared)

    @property
    def seal_failures(self) -> int:
        """Ledgers whose last sealing attempt failed (retried with back-off)."""
        with self._lock:
            return len(self._seal_errors)

    # ---------------------------------------------------------------- reading

    def ledgers(self) -> list[LedgerInfo]:
        """A snapshot of the original ledgers, oldest first."""
        with self._lock:
            _refresh_open(self._current, self._wal)
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

    def delete_ledgers(self, ledger_ids: set[int]) -> None:
        """Remove sealed ledgers (retention): metadata first, then the files, so a crash in
        between leaves only files that recovery sweeps away, never a ledger without its file."""
        with self._lock:
            doomed = [i for i in self._ledgers if i.ledger_id in ledger_ids and i.state == models.CLOSED]
            if not doomed:
                return
            with self._db.session() as s:
                for info in doomed:
                    row = s.get(models.Ledger, info.ledger_id)
                    if row is not None:
                        row.state = models.DELETED
            self._ledgers = [i for i in self._ledgers if i not in doomed]
        gone = {(self.root, info.ledger_id) for info in doomed}
        self._files.discard(gone.__contains__)
        copies = self._shared.copies
        for info in doomed:
            sealed = paths.sealed_path(self.store, info.ledger_id, info.sealed_epoch)
            sealed.unlink(missing_ok=True)
            if copies is not None:
                copies.drop(sealed)
            paths.salvage_path(self.store, info.ledger_id).unlink(missing_ok=True)

    def _sealed_ledger(self, ledger_id: int) -> AbstractContextManager[SealedLedger]:
        """The sealed ledger's reader from the shared LRU of open files, held for a ``with``."""
        return self._files.use((self.root, ledger_id), self._opener(ledger_id))

    def _opener(self, ledger_id: int) -> Callable[[], SealedLedger]:
        # Keyed by (topic dir, ledger id): the file's path is built only when it is opened.
        return lambda: SealedLedger(self.sealed_file(ledger_id), ledger_id=ledger_id)

    def sweep_stale_sealed_files(self) -> int:
        """Remove sealed files no ledger publishes: an old owner's, uploaded late after this
        owner took the topic over (under its own epoch's name), or left by a crash. Files of
        ledgers newer than the ones known when it looks are never touched (a roll-over may be
        sealing one right now). Returns how many went."""
        with self._lock:
            # A ledger not sealed yet is sealed by this owner, under its epoch's name.
            keep = {
                paths.sealed_path(
                    self.store, i.ledger_id, i.sealed_epoch if i.state == models.CLOSED else self.epoch
                ).name
                for i in self._ledgers
            }
            newest = max(i.ledger_id for i in self._ledgers)
        removed = 0
        for f in self.store.files():
            head = f.name.split(".", 1)[0]
            if f.name.endswith(".parquet") and head.isdigit() and int(head) <= newest and f.name not in keep:
                log.warning("%s: removing %s, a sealed file no ledger publishes", self.name, f)
                f.unlink()
                removed += 1
        return removed

    def sealed_file(self, ledger_id: int) -> StoragePath:
        """Where the sealed ledger ``ledger_id`` is (its name says which owner sealed it)."""
        with self._lock:
            info = next((i for i in self._ledgers if i.ledger_id == ledger_id), None)
        return paths.sealed_path(self.store, ledger_id, info.sealed_epoch if info is not None else 0)

    # ---------------------------------------------------------------- integrity

    def damaged(self, ledger_id: int, error: IntegrityError) -> DamagedData:
        """Record that ledger ``ledger_id``'s file failed ``error``'s check (the first damage
        found is kept, in memory and in the metadata) and return the error a read answers."""
        finding = f"{error.check} failed: {error.detail}"
        with self._lock:
            info = next((i for i in self._ledgers if i.ledger_id == ledger_id), None)
            first = info is not None and info.damage is None
            if info is not None and info.damage is None:
                info.damage = finding
            if info is not None:
                info.verified = False
        if first:
            log.error("ledger %s of %s is damaged: %s (%s)", ledger_id, self.name, finding, error.path)
            self._files.discard(lambda key: key == (self.root, ledger_id))  # its decoded rows too
            try:
                with self._db.session() as s:
                    row = s.get(models.Ledger, ledger_id)
                    if row is not None and row.damage is None:
                        row.damage, row.damaged_at = finding, now_ms()
            except Exception:  # noqa: BLE001 - the read's answer matters more than the record
                log.exception("could not record the damage of ledger %s", ledger_id)
        return DamagedData(
            f"ledger {ledger_id} of {self.name} is damaged: {finding}",
            topic=self.name,
            ledger_id=ledger_id,
            check=error.check,
        )

    def mark_verified(self, ledger_id: int) -> None:
        """Ledger ``ledger_id``'s whole file just matched its recorded checksum."""
        with self._lock:
            info = next((i for i in self._ledgers if i.ledger_id == ledger_id), None)
            if info is not None:
                info.verified = True

    def record_checksum(self, ledger_id: int, checksum: str) -> None:
        """A checksum the scrubber computed for a file written before checksums existed."""
        with self._lock:
            info = next((i for i in self._ledgers if i.ledger_id == ledger_id), None)
            if info is not None and info.checksum is None:
                info.checksum = checksum
        with self._db.session() as s:
            row = s.get(models.Ledger, ledger_id)
            if row is not None and row.checksum is None:
                row.checksum = checksum

    def accept_damage(self, ledger_id: int) -> tuple[LostRanges, int]:
        """An operator accepts losing ledger ``ledger_id``'s damaged entries: find every row
        group that fails a check, write the intact rows to a verified copy (what compactions
        read from now on) and record the lost ranges; reads skip them from then on. Returns the
        lost ranges and how many entries were kept. 409 unless the ledger is known damaged."""
        with self._lock:
            info = next((i for i in self._ledgers if i.ledger_id == ledger_id), None)
        if info is None:
            raise NotFound(f"ledger {ledger_id} is not a ledger of {self.name}")
        if info.damage is None:
            raise Conflict(
                f"ledger {ledger_id} of {self.name} is not known to be damaged; "
                "scrub the topic first (POST .../scrub)"
            )
        if info.state != models.CLOSED:
            raise Conflict(f"ledger {ledger_id} of {self.name} is not sealed")
        self._files.discard(lambda key: key == (self.root, ledger_id))
        lost, kept, checksum = write_salvage(
            paths.sealed_path(self.store, ledger_id, info.sealed_epoch),
            paths.salvage_path(self.store, ledger_id),
            ledger_id,
            info.entries,
        )
        with self._db.session() as s:
            row = s.get(models.Ledger, ledger_id)
            if row is not None:
                row.damage_accepted_at = now_ms()
                row.lost_entries = lost.to_text()
                row.salvage_checksum = checksum
        with self._lock:
            info.damage_accepted, info.lost, info.verified = True, lost, False
        log.warning(
            "ledger %s of %s: the loss of entries %s was accepted; %d entries kept",
            ledger_id,
            self.name,
            lost.to_text() or "(none)",
            kept,
        )
        return lost, kept

    def sealed_inputs(self, after: Position | None, upto: Position) -> list[LedgerInfo]:
        """Copies of the sealed ledgers holding entries in ``(after, upto]``, oldest first."""
        with self._lock:
            return [
                LedgerInfo(**{k: getattr(i, k) for k in LedgerInfo.__slots__})
                for i in self._ledgers
                if i.state == models.CLOSED
                and i.entries
                and i.ledger_id <= upto.ledger_id
                and (after is None or Position(i.ledger_id, i.entries - 1) > after)
            ]

    def sealed_files(self, after: Position | None, upto: Position) -> list[tuple[int, StoragePath]]:
        """The sealed ledgers holding entries in ``(after, upto]``, as (ledger id, file)."""
        with self._lock:
            return [
                (i.ledger_id, paths.sealed_path(self.store, i.ledger_id, i.sealed_epoch))
                for i in self._ledgers
                if i.state == models.CLOSED
                and i.entries
                and i.ledger_id <= upto.ledger_id
                and (after is None or Position(i.ledger_id, i.entries - 1) > after)
            ]

    # ---------------------------------------------------------------- closing

    @property
    def _current(self) -> LedgerInfo:
        return self._ledgers[-1]

    def _check_open(self) -> None:
        if self._closed:
            raise NotFound("topic is being deleted")

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


def _seal(
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
    """The first step of :func:`_seal`: the file, finished in its staging place."""
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
    """The second step of :func:`_seal`: the file published (renamed, or uploaded), then the
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
class _Ahead:
    """What a rolled-over ledger's sealing takes from its time open: the writer that holds its
    first row groups (if any) and the entry its cached records start at."""

    writer: SealWriter | None
    cache_start: int
    cache_entries: int = -1


def _open_log(
    shared: LedgerResources,
    root: Path,
    info: LedgerInfo,
    settings: Settings,
    fence: Callable[[Session], None] | None,
    *,
    new: bool,
) -> OpenLog:
    """The write-ahead log of ledger ``info``: a local file, or its write-ahead objects."""
    if shared.wal is not None:
        return shared.wal.open(info.ledger_id, fence, new=new)
    return WriteAheadLog.open(
        paths.wal_path(root, info.ledger_id, info.epoch),
        info.ledger_id,
        fsync=settings.fsync,
        fsync_interval_ms=settings.fsync_interval_ms,
    )


def _keeper(shared: LedgerResources) -> Callable[[StoragePath, Path], bool] | None:
    """What takes a sealed ledger's uploaded file: the local copies, if the service keeps any."""
    return shared.copies.keep if shared.copies is not None else None


def _discard(shared: LedgerResources, wal: OpenLog) -> None:
    """The log of a sealed ledger goes: its file, or its chunks and the objects no one needs."""
    wal.discard()
    if shared.wal is not None:
        shared.wal.release([wal.ledger_id])


def _refresh_open(info: LedgerInfo, wal: OpenLog) -> None:
    info.entries = wal.entries
    info.size_bytes = wal.size_bytes
    info.file_bytes = wal.file_bytes


def _info(row: models.Ledger) -> LedgerInfo:
    return LedgerInfo(
        ledger_id=row.id,
        state=row.state,
        entries=row.entries,
        size_bytes=row.size_bytes,
        file_bytes=row.file_bytes,
        created_at=row.created_at,
        first_publish_time=row.first_publish_time,
        last_publish_time=row.last_publish_time,
        checksum=row.checksum,
        damage=row.damage,
        damage_accepted=row.damage_accepted_at is not None,
        lost=LostRanges.parse(row.lost_entries),
        epoch=row.epoch,
        sealed_epoch=row.sealed_epoch,
    )


def _new_ledger_row(session: Session, topic_id: int, epoch: int = 0) -> LedgerInfo:
    row = models.Ledger(
        topic_id=topic_id,
        epoch=epoch,
        kind=models.ORIGINAL,
        state=models.OPEN,
        entries=0,
        size_bytes=0,
        file_bytes=0,
        created_at=now_ms(),
    )
    session.add(row)
    session.flush()
    return _info(row)
