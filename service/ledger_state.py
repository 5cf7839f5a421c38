"""The state of one topic's managed ledger that its jobs share, and the lock that guards it.

:class:`LedgerState` is the base of :class:`service.managed_ledger.ManagedLedger` and of the
classes that hold its jobs (``service.sealed_ledger_files``, ``service.ledger_reads``,
``service.sealing``): one object, one ``RLock`` (``_lock``), with two conditions on it
(``_appended``: entries became readable; ``_sealed_cv``: a sealing finished or failed). The
fields that change (the ledger list, the open write-ahead log, the ledgers being sealed and
their errors, the open ledger's cache and its writing ahead, the waiters) change under
``_lock``; the sealer's and publisher's steps read ``_closed`` without it, only to skip work
for a topic that stops. No job holds the lock while it waits for the sealer, the publisher or
the seal backlog (they need it to finish what it waits for), nor while it writes or reads a
sealed file."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session

from ledger.entry import Appended, Position
from ledger.open_log import OpenLog
from ledger.parquet_store import SealWriter
from ledger.storage import StoragePath, as_storage_path
from service.db import Database
from service.errors import NotFound
from service.ledger_info import LedgerInfo
from service.ledger_resources import LedgerResources
from service.settings import Settings


class LedgerState:
    """The fields of one topic's original log and its lock (see the module's docstring)."""

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
        # How often waiters were woken for something other than an append (``wake``): a waiter
        # that read it before looking for messages also ends its wait on a change of it.
        self.wakes = 0
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
        # Set once the topic is terminated: its last entry for ever (entry -1: it had none).
        # Appends are refused from then on (checked under ``_lock``, where they write).
        self.terminated: Position | None = None
        # Entries and payload bytes appended since the service started (pulsar_in_*_total);
        # written under the lock the append holds anyway.
        self.entries_added = 0
        self.bytes_added = 0
        # Tests simulate a crash at a named point of the roll-over ("sealed", "committed").
        self.fault_hook: Callable[[str], None] | None = None

    @property
    def _current(self) -> LedgerInfo:
        return self._ledgers[-1]

    def _check_open(self) -> None:
        if self._closed:
            raise NotFound("topic is being deleted")
