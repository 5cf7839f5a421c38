"""What every managed ledger of a service shares (:class:`LedgerResources`: the sealer and
publisher threads, the LRU of open sealed-ledger files, the seal backlog, the write-ahead
objects, the local copies), and opening and discarding one ledger's write-ahead log over them
(a local file, or write-ahead objects with ``COMPACTOR_WAL=object``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

from compactor.spark import local_cores
from ledger import paths
from ledger.file_cache import FileCache
from ledger.local_copies import LocalCopies
from ledger.open_log import OpenLog
from ledger.parquet_store import SealedLedger
from ledger.storage import StoragePath
from ledger.wal import WriteAheadLog
from service.ledger_info import LedgerInfo
from service.resources import ExhaustionLog
from service.seal_backlog import SealBacklog
from service.settings import Settings
from service.wal_objects import ObjectWal


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


def open_log(
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


def keeper(shared: LedgerResources) -> Callable[[StoragePath, Path], bool] | None:
    """What takes a sealed ledger's uploaded file: the local copies, if the service keeps any."""
    return shared.copies.keep if shared.copies is not None else None


def discard_log(shared: LedgerResources, wal: OpenLog) -> None:
    """The log of a sealed ledger goes: its file, or its chunks and the objects no one needs."""
    wal.discard()
    if shared.wal is not None:
        shared.wal.release([wal.ledger_id])
