"""Recovering a topic's original log at start-up, after a clean stop or a crash at any point
of a roll-over or a sealing (the body of :meth:`service.managed_ledger.ManagedLedger.recover`).

Order: half-written sealed files go first (their write-ahead files still hold the entries);
every ledger left OPEN behind the newest is sealed inline (the stop came before its background
sealing finished, or an older owner left it), and a write-ahead file whose ledger is CLOSED
removed; then sealed files no CLOSED ledger publishes are removed; last, the open ledger's
write-ahead log is opened (a torn tail truncated and kept aside). It runs before the managed
ledger exists: no lock is needed, no other thread sees the topic yet."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger import files, paths
from ledger.checksums import IntegrityError
from ledger.open_log import OpenLog
from ledger.storage import StoragePath
from service import models
from service.db import Database
from service.ledger_info import LedgerInfo, info_from_row, new_ledger_row, refresh_open
from service.ledger_resources import LedgerResources, discard_log, keeper, open_log
from service.sealing import seal
from service.settings import Settings

log = logging.getLogger(__name__)


# Sealing attempts at start-up (recovery seals inline) before the start fails.
RECOVERY_SEAL_ATTEMPTS = 3


def recover_ledgers(
    *,
    topic_id: int,
    root: Path,
    db: Database,
    settings: Settings,
    shared: LedgerResources,
    epoch: int,
    fence: Callable[[Session], None] | None,
    store: StoragePath,
) -> tuple[list[LedgerInfo], OpenLog]:
    """Open an existing topic's log after a clean stop or a crash at any point.

    A ledger left open by an owner of an older ``epoch`` (a takeover) is never appended to:
    it is sealed with the whole records its write-ahead file holds now, and a new ledger of
    this epoch is opened after it. So bytes a fenced-off owner writes late land beyond the
    sealed end of its own ledger, and are never read as this owner's.

    Returns the topic's ledgers, oldest first (the last one OPEN, of this ``epoch``), and the
    open ledger's write-ahead log."""
    if shared.wal is None:
        root.mkdir(parents=True, exist_ok=True)
        for tmp in root.glob(f"*{files.TMP_SUFFIX}"):
            if tmp.is_file():  # a half-written sealed file; the write-ahead file still has its entries
                tmp.unlink()
    with db.session() as s:
        rows = s.scalars(
            select(models.Ledger)
            .where(models.Ledger.topic_id == topic_id, models.Ledger.kind == models.ORIGINAL)
            .where(models.Ledger.state != models.DELETED)
            .order_by(models.Ledger.id)
        ).all()
        infos = [info_from_row(r) for r in rows]
        if fence is not None:
            fence(s)
        if not infos or infos[-1].state != models.OPEN or infos[-1].epoch != epoch:
            infos.append(new_ledger_row(s, topic_id, epoch))
    for info in infos[:-1]:
        if info.state == models.OPEN:  # the stop came before its background sealing finished
            log.info("sealing ledger %s of topic %s, closed before the stop", info.ledger_id, topic_id)
            wal = open_log(shared, root, info, settings, fence, new=False)
            for attempt in range(1, RECOVERY_SEAL_ATTEMPTS + 1):
                try:
                    closed = seal(
                        db,
                        store,
                        info,
                        wal,
                        wal.read_appended(),
                        fence=fence,
                        epoch=epoch,
                        keep=keeper(shared),
                    )
                    break
                except IntegrityError:  # the file read back wrong: the write-ahead file stays
                    log.exception("sealing ledger %s: attempt %d failed", info.ledger_id, attempt)
                    if attempt == RECOVERY_SEAL_ATTEMPTS:
                        raise
            discard_log(shared, wal)
            if closed is not None:
                for k in LedgerInfo.__slots__:
                    setattr(info, k, getattr(closed, k))
        if shared.wal is None:
            wal_file = paths.wal_path(root, info.ledger_id, info.epoch)
            if wal_file.exists():  # crashed after CLOSED was committed, before the unlink
                wal_file.unlink()
                files.fsync_dir(root)
    # A sealed file of no CLOSED ledger: the open ledger sealed just before a crash (it is
    # sealed again at its roll-over), or a ledger deleted by retention before its unlink.
    live = {
        paths.sealed_path(store, i.ledger_id, i.sealed_epoch).name for i in infos if i.state == models.CLOSED
    }
    for sealed_file in store.files():
        if sealed_file.name.endswith(".parquet") and sealed_file.name not in live:
            sealed_file.unlink()
    current = infos[-1]
    wal = open_log(shared, root, current, settings, fence, new=False)
    if wal.recovery.truncated_bytes:
        log.warning(
            "ledger %s: truncated a torn tail of %d bytes, kept in %s",
            current.ledger_id,
            wal.recovery.truncated_bytes,
            wal.recovery.quarantine_path,
        )
    refresh_open(current, wal)
    return infos, wal
