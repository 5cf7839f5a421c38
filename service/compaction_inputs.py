"""What a compaction round reads: its horizon (the end of the log, or the last entry old enough
under a minimum compaction lag), its original ledgers with each file's whole-file CRC32C
verified (unless verified since the service started), the previous compacted ledger's key
indexes and deletion vectors verified against its manifest, and, on object storage, the local
copies of all of these the round reads instead of the bucket (leased for the round, released
after it). Damage found here stops or repairs the round (``service.compaction_damage``)."""

from __future__ import annotations

import logging

from ledger import paths, prefetch
from ledger.checksums import IntegrityError, read_verified, verify_file
from ledger.compacted_store import Manifest
from ledger.entry import Position
from ledger.local_copies import LocalCopies
from ledger.storage import StoragePath
from service import models
from service.compacted_view import CompactedView
from service.compaction_damage import RoundDamage, RoundDamaged
from service.integrity import skip_damaged_path
from service.managed_topic import ManagedTopic
from service.metrics import ServiceMetrics
from service.topics import Broker

log = logging.getLogger(__name__)


class RoundInputs:
    """What a round reads, verified (see the module's docstring)."""

    def __init__(self, *, broker: Broker, damage: RoundDamage, metrics: ServiceMetrics | None = None) -> None:
        self.broker = broker
        self.metrics = metrics
        self.db = broker.db
        self.damage = damage

    @staticmethod
    def horizon(topic: ManagedTopic, last: Position | None, min_lag_ms: int, now: int) -> Position | None:
        """The last entry this round may compact: the end of the log, or with a minimum
        compaction lag the last entry published at least that long ago (None: no such entry)."""
        if last is None or min_lag_ms <= 0:
            return last
        first_young = topic.ledger.find_by_publish_time(now - min_lag_ms + 1)
        horizon = min(last, Position(first_young.ledger_id, first_young.entry_id - 1))
        first, _ = topic.ledger.read(Position(0, 0), 1)
        if not first or first[0].position > horizon:
            return None
        return horizon

    def verified_inputs(
        self,
        topic: ManagedTopic,
        previous: CompactedView | None,
        previous_horizon: Position | None,
        horizon: Position,
        layer_copies: dict[str, StoragePath],
        leased: list[StoragePath],
        checksums: dict[int, str],
    ) -> list[tuple[int, StoragePath]]:
        """The round's original ledgers as (ledger id, file to read), each file's whole-file
        CRC32C verified against the metadata's unless it was verified since the service started
        (sealing reads every file back; a scrub or an earlier round's check). The previous
        compacted ledger's manifest is its view's, verified against its checksum when the view
        was made (the round reads it from memory: a later damage to the file is the scrub's
        to find, and the new ledger does not depend on it). Page checksums guard every page the
        round decodes either way; the whole-file check also covers footers and page headers.
        A damaged ledger whose loss no one accepted stops the round (``RoundDamaged``); one
        whose loss was accepted is read from the verified copy of its intact rows. The previous
        ledger's files verified from local copies go into ``layer_copies`` (the copies leased
        into ``leased``); each file's expected CRC32C, where known, into ``checksums`` by
        ledger id (the round's tasks check a file whole against it rather than page by page
        where they decode most of it)."""
        if previous is not None:
            try:
                # Read and verified against its checksum when the view was made.
                manifest = previous.ledger.manifest
                layer_copies.update(self._verify_layer_files(previous, manifest, leased))
            except IntegrityError as e:
                self.damage.drop_damaged_view(topic, e, ledger_id=previous.ledger_id, view=previous)
                raise RoundDamaged(self.damage.repair_line(topic, e, previous.ledger_id)) from e
        out: list[tuple[int, StoragePath]] = []
        for info in topic.ledger.sealed_inputs(previous_horizon, horizon):
            path = paths.sealed_path(topic.ledger.store, info.ledger_id, info.sealed_epoch)
            expected = info.checksum
            if info.damage is not None and not info.damage_accepted:
                raise RoundDamaged(
                    f"ledger {info.ledger_id} of {topic.name} is damaged: {info.damage}; compaction stops "
                    f"until the loss is accepted ({skip_damaged_path(topic.name, info.ledger_id)})"
                )
            if info.damage_accepted:
                path = paths.salvage_path(topic.ledger.store, info.ledger_id)
                expected = self._salvage_checksum(info.ledger_id)
            if expected is not None and not info.verified:
                try:
                    verify_file(path, expected)
                except IntegrityError as e:
                    damaged = topic.ledger.damaged(info.ledger_id, e)
                    if self.metrics is not None:
                        self.metrics.integrity.damage_found("original", e.check)
                    raise RoundDamaged(
                        f"{damaged.reason}; compaction stops until the loss is accepted "
                        f"({skip_damaged_path(topic.name, info.ledger_id)})"
                    ) from e
                topic.ledger.mark_verified(info.ledger_id)
            if expected is not None:
                checksums[info.ledger_id] = expected
            out.append((info.ledger_id, path))
        return out

    def _verify_layer_files(
        self, previous: CompactedView, manifest: Manifest, leased: list[StoragePath]
    ) -> dict[str, StoragePath]:
        """The previous compacted ledger's key indexes and deletion vectors against the CRC32C
        its manifest records, every round: they have no page checksums, and a damaged key index
        or vector would mark the wrong rows dead, silently. (The pass costs a fraction of the
        probe that reads every key index anyway: CRC32C runs at memory speed.) Its parts need
        no pass here: page checksums guard every page the round decodes (a delta round decodes
        none).

        On object storage, with local copies, each file is verified as the copy the round
        will read (leased into ``leased``): a copy is made of the object's bytes the first
        time, once they passed; a copy that fails is dropped and the object verified instead.
        Returns the copies by object name."""
        root = previous.directory.parent
        checked = manifest.checked_files()
        files = [(f.path(root), f.checksum) for f in checked if f.size is None and f.checksum]  # not parts
        copies = self.broker.resources.copies if root.local is None else None
        if copies is None:
            # On object storage a request each: all at once (the first damage in manifest order is raised).
            prefetch.each(lambda file: verify_file(*file), files, at_once=root.local is None)
            return {}
        found = prefetch.each(lambda file: _verified_copy(copies, *file), files, at_once=True)
        out: dict[str, StoragePath] = {}
        for (path, _), copy in zip(files, found, strict=True):
            if copy is not None:
                leased.append(copy)
                out[str(path)] = copy
        return out

    def _salvage_checksum(self, ledger_id: int) -> str | None:
        with self.db.session() as s:
            row = s.get(models.Ledger, ledger_id)
            return row.salvage_checksum if row is not None else None

    def local_copies(
        self, sealed: list[tuple[int, StoragePath]], leased: list[StoragePath]
    ) -> list[tuple[int, StoragePath]]:
        """The round's inputs, each sealed ledger this instance keeps a local copy of read from
        that copy (``ledger.local_copies``); the copies leased for the round go into ``leased``."""
        copies = self.broker.resources.copies
        if copies is None:
            return sealed
        out: list[tuple[int, StoragePath]] = []
        for ledger_id, path in sealed:
            copy = copies.lease(path)
            if copy is not None:
                leased.append(copy)
                path = copy
            out.append((ledger_id, path))
        return out

    def release_copies(self, leased: list[StoragePath]) -> None:
        copies = self.broker.resources.copies
        if copies is not None:
            for copy in leased:
                copies.release(copy)
        leased.clear()


def _verified_copy(copies: LocalCopies, path: StoragePath, checksum: str) -> StoragePath | None:
    """``path`` (an object) verified against ``checksum`` as its local copy, leased (made from
    the object's bytes if there is none); None when no copy could be kept, the object verified
    all the same. ``IntegrityError`` when the object fails."""
    copy = copies.lease(path)
    if copy is not None:
        try:
            verify_file(copy, checksum)
            return copy
        except IntegrityError as e:  # the copy, not the ledger: the object decides
            log.warning("dropping a damaged local copy: %s", e)
            copies.release(copy)
            copies.drop(copy)
    copies.keep_bytes(path, read_verified(path, checksum))
    return copies.lease(path)
