"""The scrubber: every stored file of a topic verified against its recorded checksum.

As HDFS's block scanner and a ZFS scrub, it finds damage before a reader or a compaction does.
One pass over a topic verifies:

* each sealed original ledger's file against the CRC32C recorded when it was sealed (and, once
  an operator accepted a loss, the copy of its intact rows against its own); a file sealed
  before checksums existed has every row group decoded with every check instead, and if it is
  intact its checksum is recorded then ("checksum recorded on first scrub");
* the compacted ledger's manifest against the CRC32C in the metadata, and every file of every
  layer it names against the checksum in the manifest: parts, their key indexes and the
  deletion vectors, wherever they are (an older layer's files stay in the directory of the
  round that wrote them); the files of a manifest without checksums are decoded instead;
* and it removes the compacted files no live view names: what a failed round could not clean
  up (object storage that stopped answering), when no round of the topic runs.

Damage found is recorded as a read would record it: an original ledger is marked damaged (it
shows in stats and internalStats; compaction stops before it until ``skip-damaged``); a
compacted ledger is dropped and rebuilt. Each pass is a row of ``scrub_runs`` (the
``scrubRuns`` admin route) and counted in the metrics. The open ledger is not scrubbed: its
write-ahead file checks every record with CRC32C on every read.

``compactor topics scrub TOPIC`` runs a pass at once at full speed; the background pass runs
every ``scrub_interval_seconds`` over every topic at ``scrub_bytes_per_second`` at most.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import pyarrow.parquet as pq
from sqlalchemy import select

from ledger import deletion_vectors, key_index, paths
from ledger.checksums import (
    FILE_CHECKSUM,
    READ_OPTIONS,
    ROW_IDS,
    IntegrityError,
    Throttle,
    crc32c_bytes,
    damage_of,
    file_checksum,
    verify_file,
)
from ledger.compacted_store import MANIFEST_NAME, Manifest
from ledger.layers import CompactedLedgerError, LayerFile
from ledger.parquet_store import SealedLedger
from ledger.storage import StoragePath
from service import models
from service.clock import now_ms
from service.compacted_view import RetiredView
from service.integrity import compacted_damage_line
from service.ledger_info import LedgerInfo
from service.managed_topic import ManagedTopic
from service.metrics import ServiceMetrics
from service.names import TopicName
from service.topics import Broker

log = logging.getLogger(__name__)

CLEAN, DAMAGED, ERROR = "CLEAN", "DAMAGED", "ERROR"
MANUAL, BACKGROUND = "manual", "background"


@dataclass
class ScrubReport:
    """One pass over one topic (a ``scrub_runs`` row)."""

    run_id: int
    topic: str
    trigger: str
    status: str = CLEAN
    started_at: int = 0
    finished_at: int | None = None
    files_checked: int = 0
    bytes_checked: int = 0
    checksums_recorded: int = 0
    findings: list[str] = field(default_factory=list)

    @property
    def damaged_files(self) -> int:
        return len(self.findings)

    @classmethod
    def of(cls, row: models.ScrubRun, topic: str) -> ScrubReport:
        return cls(
            run_id=row.id,
            topic=topic,
            trigger=row.trigger,
            status=row.status,
            started_at=row.started_at,
            finished_at=row.finished_at,
            files_checked=row.files_checked,
            bytes_checked=row.bytes_checked,
            checksums_recorded=row.checksums_recorded,
            findings=row.findings.splitlines() if row.findings else [],
        )


class Scrubber:
    """Scrubs topics on request and, from :meth:`start`, in the background. Thread-safe: one
    pass at a time per service (a pass is I/O bound; two would only share the disk)."""

    def __init__(
        self,
        *,
        broker: Broker,
        interval_s: float,
        bytes_per_second: int,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.broker = broker
        self.db = broker.db
        self.interval_s = interval_s
        self.bytes_per_second = bytes_per_second
        self.metrics = metrics
        self._pass = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- background

    def start(self) -> None:
        """Scrub every topic each ``interval_s`` (the first pass one interval after start, so
        that a restart does not begin with a burst of reads); 0 turns it off."""
        if self.interval_s <= 0:
            return
        self._thread = threading.Thread(target=self._loop, name="scrubber", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            throttle = Throttle(self.bytes_per_second)  # one budget for the whole pass
            for topic in self.broker.topics():
                if self._stop.is_set():
                    return
                try:
                    self._scrub(topic, BACKGROUND, throttle)
                except Exception:  # noqa: BLE001 - a topic deleted under the pass, say
                    log.exception("background scrub of %s failed", topic.name)

    # ---------------------------------------------------------------- one topic

    def scrub(self, name: TopicName, *, trigger: str = MANUAL) -> ScrubReport:
        """Verify every file of topic ``name`` now, at full speed; the pass's report."""
        return self._scrub(self.broker.topic(name), trigger, Throttle(0))

    def history(self, name: TopicName, limit: int = 100) -> list[ScrubReport]:
        """The topic's scrubs, newest first."""
        topic = self.broker.topic(name)
        with self.db.session() as s:
            rows = s.scalars(
                select(models.ScrubRun)
                .where(models.ScrubRun.topic_id == topic.topic_id)
                .order_by(models.ScrubRun.id.desc())
                .limit(limit)
            ).all()
            return [ScrubReport.of(r, str(name)) for r in rows]

    def _scrub(self, topic: ManagedTopic, trigger: str, throttle: Throttle) -> ScrubReport:
        with self._pass:
            with self.db.session() as s:
                row = models.ScrubRun(
                    topic_id=topic.topic_id,
                    trigger=trigger,
                    status="RUNNING",
                    started_at=now_ms(),
                    files_checked=0,
                    bytes_checked=0,
                    damaged_files=0,
                    checksums_recorded=0,
                )
                s.add(row)
                s.flush()
                report = ScrubReport(
                    run_id=row.id, topic=str(topic.name), trigger=trigger, started_at=row.started_at
                )
            try:
                for info in topic.ledger.ledgers():
                    if info.state == models.CLOSED and info.entries:
                        self._original(topic, info, report, throttle)
                self._compacted(topic, report, throttle)
                if self.broker.sweep_orphans is not None:
                    # What failed rounds left (object storage may have refused their clean-up).
                    self.broker.sweep_orphans(topic)
                topic.ledger.sweep_stale_sealed_files()
                # Write-ahead objects a crash or a failed flush left (once a minute when scheduled).
                self.broker.sweep_write_ahead(force=trigger == MANUAL)
                report.status = DAMAGED if report.findings else CLEAN
            except Exception as e:  # noqa: BLE001 - recorded as the pass's outcome
                log.exception("scrub of %s failed", topic.name)
                report.status = ERROR
                report.findings.append(f"the scrub failed: {type(e).__name__}: {e}")
            report.finished_at = now_ms()
            with self.db.session() as s:
                done = s.get(models.ScrubRun, report.run_id)
                if done is not None:
                    done.status = report.status
                    done.finished_at = report.finished_at
                    done.files_checked = report.files_checked
                    done.bytes_checked = report.bytes_checked
                    done.damaged_files = report.damaged_files
                    done.checksums_recorded = report.checksums_recorded
                    done.findings = "\n".join(report.findings) or None
        if self.metrics is not None:
            self.metrics.integrity.scrub_runs.labels(report.status).inc()
            self.metrics.integrity.scrub_files.inc(report.files_checked)
            self.metrics.integrity.scrub_bytes.inc(report.bytes_checked)
        if report.findings:
            log.error("scrub of %s found damage: %s", topic.name, "; ".join(report.findings))
        return report

    def _original(
        self, topic: ManagedTopic, info: LedgerInfo, report: ScrubReport, throttle: Throttle
    ) -> None:
        path = paths.sealed_path(topic.ledger.store, info.ledger_id, info.sealed_epoch)
        try:
            if info.damage_accepted:
                # The damaged file stays as evidence; what reads and compactions use now is the
                # verified copy of its intact rows.
                path = paths.salvage_path(topic.ledger.store, info.ledger_id)
                with self.db.session() as s:
                    row = s.get(models.Ledger, info.ledger_id)
                    expected = row.salvage_checksum if row is not None else None
                if expected is not None:
                    verify_file(path, expected, throttle=throttle)
            elif info.checksum is None:
                self._decode_all(path, info.ledger_id)  # written before checksums
                topic.ledger.record_checksum(info.ledger_id, file_checksum(path, throttle=throttle))
                report.checksums_recorded += 1
            else:
                try:
                    verify_file(path, info.checksum, throttle=throttle)
                except IntegrityError as e:
                    if e.check == FILE_CHECKSUM and self._decodes(path, info.ledger_id):
                        raise IntegrityError(
                            path,
                            e.check,
                            f"{e.detail}; every page checksum and row id checks out, so the "
                            "recorded checksum itself may be what is damaged",
                        ) from e
                    raise
        except IntegrityError as e:
            if self.metrics is not None and (info.damage is None or info.damage_accepted):
                self.metrics.integrity.damage_found("original", e.check)
            if info.damage_accepted:
                report.findings.append(
                    f"the copy of the intact rows of ledger {info.ledger_id} of {topic.name} is damaged: "
                    f"{e.check} failed: {e.detail}"
                )
            else:
                report.findings.append(topic.ledger.damaged(info.ledger_id, e).reason)
        else:
            self._verified(info.ledger_id)
            topic.ledger.mark_verified(info.ledger_id)
            if info.damage is not None and not info.damage_accepted:
                # Known damaged and not accepted yet: still a finding, whatever the file says now.
                report.findings.append(f"ledger {info.ledger_id} of {topic.name} is damaged: {info.damage}")
        report.files_checked += 1
        report.bytes_checked += path.size() if path.is_file() else 0

    @staticmethod
    def _decode_all(path: StoragePath, ledger_id: int) -> None:
        reader = SealedLedger(path, ledger_id=ledger_id)
        try:
            for rg in range(len(reader.row_groups())):
                reader.row_group(rg)
        finally:
            reader.close()

    def _decodes(self, path: StoragePath, ledger_id: int) -> bool:
        try:
            self._decode_all(path, ledger_id)
        except IntegrityError:
            return False
        return True

    def _verified(self, ledger_id: int) -> None:
        with self.db.session() as s:
            row = s.get(models.Ledger, ledger_id)
            if row is not None:
                row.verified_at = now_ms()

    def _compacted(self, topic: ManagedTopic, report: ScrubReport, throttle: Throttle) -> None:
        view = topic.view
        if view is None:
            return
        try:
            with view.lease():
                manifest = Manifest.load(view.directory, checksum=view.checksum)
                report.files_checked += 1
                report.bytes_checked += (view.directory / MANIFEST_NAME).size()
                root = view.directory.parent
                # Every file of every layer, wherever it is (older layers' files are in the
                # directories of the rounds that wrote them): parts, key indexes, deletion vectors.
                for f in manifest.checked_files():
                    path = f.path(root)
                    if f.checksum is not None:
                        verify_file(path, f.checksum, throttle=throttle)
                    else:  # a manifest written before checksums: decode it instead
                        self._decode_layer_file(manifest, f, root)
                    report.files_checked += 1
                    report.bytes_checked += path.size()
                if view.checksum is None:
                    self._record_manifest(view.ledger_id, view.directory)
                    report.checksums_recorded += 1
        except IntegrityError as e:
            report.findings.append(
                f"{compacted_damage_line(topic.name, e, view.ledger_id)}; "
                "it was dropped and is rebuilt from the original ledgers"
            )
            handler = self.broker.on_compacted_damage
            if handler is not None:
                handler(topic, view, e)
        except RetiredView:
            return  # replaced by a newer round meanwhile: that one is scrubbed next time
        else:
            self._verified(view.ledger_id)

    @staticmethod
    def _decode_layer_file(manifest: Manifest, f: LayerFile, root: StoragePath) -> None:
        """Every check a file without a recorded checksum allows: a part's pages decoded with
        their checksums and its row count, a key index or deletion vector decoded against its
        part's or layer's rows."""
        path = f.path(root)
        for layer in manifest.layers:
            if layer.deletes is not None and (layer.deletes.dir, layer.deletes.name) == (f.dir, f.name):
                deletion_vectors.read(path, layer.rows)
                return
            if layer.dir != f.dir:
                continue
            for part in layer.parts:
                if part.keys == f.name:
                    key_index.read(path, rows=part.rows)
                    return
                if part.name == f.name:
                    _decode_part(path, part.rows)
                    return

    def _record_manifest(self, ledger_id: int, directory: StoragePath) -> None:
        data = (directory / MANIFEST_NAME).read_bytes()
        with self.db.session() as s:
            row = s.get(models.Ledger, ledger_id)
            if row is not None and row.checksum is None:
                row.checksum = crc32c_bytes(data)


def _decode_part(path: StoragePath, rows: int) -> None:
    """Decode every page of a compacted part with its page checksums verified, and compare its
    row count with the manifest's (for parts written before whole-file checksums)."""
    try:
        with path.open() as source, pq.ParquetFile(source, **READ_OPTIONS) as pf:  # type: ignore[arg-type]
            found = 0
            for batch in pf.iter_batches():
                found += batch.num_rows
    except Exception as e:
        raise damage_of(path, e) or e from e
    if found != rows:
        raise CompactedLedgerError(path, f"has {found} rows, manifest says {rows}", ROW_IDS)
