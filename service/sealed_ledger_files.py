"""The files of a topic's sealed ledgers: where each is (its name says which owner sealed it),
opening it through the shared LRU of open files, the sealed ledgers a round reads, removing
them (retention) and sweeping files no ledger publishes; and their integrity: a damaged file
recorded, a file verified, an operator accepting the loss of its damaged entries.

:class:`SealedLedgerFiles` is one of the jobs of
:class:`service.managed_ledger.ManagedLedger`, on its state (``service.ledger_state``). Order
that keeps a crash harmless: metadata first, then the files (a crash in between leaves only
files that recovery or the sweep removes, never a ledger without its file). The ledger's lock
is held to read or change the ledger list and its infos (with the metadata rows of the ledgers
retention deletes), never while a file is opened, written or removed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from ledger import paths
from ledger.checksums import IntegrityError
from ledger.entry import Position
from ledger.parquet_store import SealedLedger
from ledger.salvage import LostRanges, write_salvage
from ledger.storage import StoragePath
from service import models
from service.clock import now_ms
from service.errors import Conflict, DamagedData, NotFound
from service.ledger_info import LedgerInfo
from service.ledger_state import LedgerState

log = logging.getLogger(__name__)


class SealedLedgerFiles(LedgerState):
    """The sealed ledgers' files and their integrity (see the module's docstring)."""

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
