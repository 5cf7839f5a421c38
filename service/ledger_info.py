"""What a managed ledger knows of each of its original ledgers (:class:`LedgerInfo`), and the
metadata rows behind them: made from a row, a new OPEN row, an open ledger's counts refreshed
from its write-ahead log. No lock here: the managed ledger calls these under its own."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from ledger.open_log import OpenLog
from ledger.salvage import LostRanges
from service import models
from service.clock import now_ms


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


def refresh_open(info: LedgerInfo, wal: OpenLog) -> None:
    info.entries = wal.entries
    info.size_bytes = wal.size_bytes
    info.file_bytes = wal.file_bytes


def info_from_row(row: models.Ledger) -> LedgerInfo:
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


def new_ledger_row(session: Session, topic_id: int, epoch: int = 0) -> LedgerInfo:
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
    return info_from_row(row)
