"""A compacted topic's Iceberg table: one snapshot per compaction round, at the storage level.

The table (format v2) lives in its own directory (``ledger.paths.table_dir``)::

    metadata/{version:05d}-{uuid}.metadata.json   one per commit, never overwritten
    metadata/snap-{snapshot id}-{uuid}.avro        a snapshot's manifest list
    metadata/{uuid}-p{partition}-{data|deletes}.avro   its manifests, one of each per partition
    deletes/p{partition}/{layer dir}/{vector}.parquet  position deletes (``ledger.position_deletes``)

Its data files are the compacted ledgers' own part files, registered where they are and never
opened to be (record counts, sizes and id bounds come from the ledger's manifest). A snapshot
holds, for each partition, the layers of that partition's latest compacted ledger, and the
position deletes hiding their dead rows and kept tombstones: its rows are the partition's
compacted view, row for row.

:func:`commit_round` replaces one partition's files: it writes that partition's manifests anew
(files already in the table keep their entry, status EXISTING with the sequence numbers they
were added with, so a delete file still applies to the data files it was written for), names
the other partitions' manifests of the previous snapshot as they are, and writes a new metadata
file with the new snapshot and the expiry of old ones. It does not publish: the caller makes
the returned metadata file the table's (a compare-and-swap in the catalog), then deletes
:func:`garbage`. Everything is written under a new name through the project's storage, so a
commit that fails or loses the swap leaves only unnamed files behind (garbage, too).

Snapshot summaries carry the round (``compactor.round``, ``compactor.horizon`` as
``ledger:entry``, ``compactor.ledger``, ``compactor.partition``) and ``compactor.ledgers``, the
JSON ``{"<partition>": ledger id}`` of every compacted ledger the snapshot's files come from:
:func:`pinned` reads them, so that no ledger a kept snapshot names is deleted.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
    write_manifest_list,
)
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.metadata import TableMetadata, TableMetadataV2
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    RemoveSnapshotsUpdate,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
    update_table_metadata,
)
from pyiceberg.typedef import Record
from pyiceberg.types import IntegerType, LongType

from ledger import position_deletes
from ledger.entry import Position
from ledger.iceberg_io import StorageFileIO, location, path_at
from ledger.iceberg_schema import (
    ENTRY_ID_ID,
    LEDGER_ID_ID,
    MESSAGE_LAST_COLUMN_ID,
    NAME_MAPPING,
    SPEC,
    name_mapping_json,
    table_schema,
)
from ledger.layers import Layer, Manifest
from ledger.storage import Storage, StoragePath

ROUND = "compactor.round"
HORIZON = "compactor.horizon"
LEDGER = "compactor.ledger"
PARTITION = "compactor.partition"
LEDGERS = "compactor.ledgers"
METADATA_DIR = "metadata"
_AVRO_CODEC: AvroCompressionCodec = "deflate"  # Iceberg's default for manifests ("gzip")
_MAIN = "main"
# How old a file the table does not name must be to be garbage: younger, it may belong to a
# commit still in progress (another partition's, another instance's), not yet swapped in.
GRACE_MS = 10 * 60 * 1000


@dataclass(frozen=True)
class RoundState:
    """What a compaction round left for one topic or partition, to commit to its table."""

    partition: int  # the partition's index; -1 for a non-partitioned topic
    ledger_dir: StoragePath  # the round's compacted ledger directory (its _manifest.json)
    ledger_id: int
    horizon: Position
    round: int  # the compaction run's id
    value_columns: pa.Schema | None = None  # typed value columns, None if none


@dataclass(frozen=True)
class Committed:
    """A written commit: ``metadata_location`` is not yet the table's (the caller's
    compare-and-swap makes it so)."""

    metadata_location: str
    snapshot_id: int
    pinned: dict[int, set[int]]  # partition -> ids of the compacted ledgers the kept snapshots name


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files (pyiceberg writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def read_metadata(storage: Storage, metadata_location: str) -> TableMetadata:
    """The table metadata at ``metadata_location`` (a file of ``storage``)."""
    return FromInputFile.table_metadata(StorageFileIO(storage).new_input(metadata_location))


def commit_round(
    table_dir: StoragePath,
    current: str | None,
    state: RoundState,
    *,
    now_ms: int,
    snapshots_kept: int,
    max_age_ms: int,
) -> Committed:
    """Write the table's next metadata file, whose current snapshot holds ``state.partition``
    as ``state``'s compacted ledger has it and every other partition as ``current`` (the
    table's metadata file; None: create the table) has it; snapshots past ``snapshots_kept``
    or older than ``max_age_ms`` (the new one aside) are expired in the same commit."""
    storage = table_dir.storage
    fio = StorageFileIO(storage)
    base = read_metadata(storage, current) if current is not None else None
    if base is not None and not isinstance(base, TableMetadataV2):
        raise ValueError(f"{current}: not an Iceberg v2 table (format {base.format_version})")
    schema, last_column_id = table_schema(
        state.value_columns,
        base.schema() if base is not None else None,
        base.last_column_id if base is not None else MESSAGE_LAST_COLUMN_ID,
    )
    if base is None:
        base = _new_table(table_dir, schema, last_column_id, now_ms)
    previous = base.current_snapshot()
    others: list[ManifestFile] = []
    mine: dict[str, ManifestEntry] = {}
    ledgers: dict[str, int] = {}
    if previous is not None:
        found = previous.summary.get(LEDGERS) if previous.summary is not None else None
        ledgers = {k: int(v) for k, v in json.loads(found or "{}").items()}
        for manifest in previous.manifests(fio):
            if _partition_of(manifest) != state.partition:
                others.append(manifest)
                continue
            for entry in manifest.fetch_manifest_entry(fio, discard_deleted=True):
                mine[entry.data_file.file_path] = entry
    ledgers[str(state.partition)] = state.ledger_id

    snapshot_id = _snapshot_id(base)
    sequence = base.last_sequence_number + 1
    token = uuid.uuid4().hex
    ledger = Manifest.load(state.ledger_dir)
    topic_root = state.ledger_dir.parent
    data = [_data_entry(topic_root, layer, state.partition, mine) for layer in ledger.layers]
    deletes = [_delete_entry(table_dir, topic_root, layer, state.partition, mine) for layer in ledger.layers]
    metadata_dir = table_dir / METADATA_DIR
    written = _write_manifests(
        fio,
        metadata_dir / f"{token}-p{state.partition}",
        schema,
        snapshot_id,
        data=[e for layer_entries in data for e in layer_entries],
        deletes=[e for e in deletes if e is not None],
    )
    manifests = written + others
    list_location = location(metadata_dir / f"snap-{snapshot_id}-{token}.avro")
    parent = previous.snapshot_id if previous is not None else None
    with write_manifest_list(
        2, fio.new_output(list_location), snapshot_id, parent, sequence, _AVRO_CODEC
    ) as w:
        w.add_manifests(manifests)
    timestamp = max(now_ms, previous.timestamp_ms if previous is not None else now_ms)
    summary = Summary(
        Operation.OVERWRITE if previous is not None else Operation.APPEND,
        **_totals(manifests),
        **{
            ROUND: str(state.round),
            HORIZON: f"{state.horizon.ledger_id}:{state.horizon.entry_id}",
            LEDGER: str(state.ledger_id),
            PARTITION: str(state.partition),
            LEDGERS: json.dumps(dict(sorted(ledgers.items(), key=lambda kv: int(kv[0])))),
        },
    )
    # Pydantic models, made from Iceberg's JSON names (what their fields are aliased to).
    snapshot = Snapshot.model_validate(
        {
            "snapshot-id": snapshot_id,
            "parent-snapshot-id": parent,
            "sequence-number": sequence,
            "timestamp-ms": timestamp,
            "manifest-list": list_location,
            "summary": summary,
            "schema-id": schema.schema_id,
        }
    )
    updates: list[TableUpdate] = []
    if schema.schema_id != base.current_schema_id:
        updates += [
            AddSchemaUpdate(schema=schema),
            SetCurrentSchemaUpdate.model_validate({"schema-id": schema.schema_id}),
        ]
    mapping = name_mapping_json(schema, base.properties.get(NAME_MAPPING))
    if base.properties.get(NAME_MAPPING) != mapping:
        updates.append(SetPropertiesUpdate(updates={NAME_MAPPING: mapping}))
    updates += [
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate.model_validate(
            {"ref-name": _MAIN, "type": "branch", "snapshot-id": snapshot_id}
        ),
    ]
    expired = _expired(base.snapshots, snapshots_kept=snapshots_kept, oldest_ms=now_ms - max_age_ms)
    if expired:
        updates.append(RemoveSnapshotsUpdate.model_validate({"snapshot-ids": expired}))
    metadata = update_table_metadata(base, tuple(updates), metadata_location=current)
    version = _version(current) + 1 if current is not None else 1
    path = metadata_dir / f"{version:05d}-{uuid.uuid4()}.metadata.json"
    out = fio.new_output(location(path))
    with out.create() as f:
        f.write(metadata.model_dump_json().encode("utf-8"))
    return Committed(location(path), snapshot_id, _pinned(metadata))


def _write_manifests(
    fio: StorageFileIO,
    prefix: StoragePath,
    schema: Schema,
    snapshot_id: int,
    *,
    data: list[ManifestEntry],
    deletes: list[ManifestEntry],
) -> list[ManifestFile]:
    """One partition's data manifest and delete manifest (each only if it has entries), at
    ``{prefix}-data.avro`` and ``{prefix}-deletes.avro``: entries new in this snapshot ADDED
    (their sequence number is the snapshot's), the others EXISTING with theirs."""
    out: list[ManifestFile] = []
    for kind, entries, writer_type in (
        ("data", data, ManifestWriterV2),
        ("deletes", deletes, _DeleteManifestWriter),
    ):
        if not entries:
            continue
        target = fio.new_output(location(prefix.with_name(f"{prefix.name}-{kind}.avro")))
        writer: ManifestWriter = writer_type(SPEC, schema, target, snapshot_id, _AVRO_CODEC)
        with writer:
            for entry in entries:
                if entry.status == ManifestEntryStatus.ADDED:
                    writer.add(entry)
                else:
                    writer.existing(entry)
        out.append(writer.to_manifest_file())
    return out


def _new_table(table_dir: StoragePath, schema: Schema, last_column_id: int, now_ms: int) -> TableMetadataV2:
    """A table without snapshots yet, at ``table_dir`` (a fresh table-uuid), with ``schema``."""
    return TableMetadataV2.model_validate(
        {
            "location": location(table_dir),
            "table-uuid": uuid.uuid4(),
            "last-updated-ms": now_ms,
            "last-column-id": last_column_id,
            "schemas": [schema],
            "current-schema-id": schema.schema_id,
            "partition-specs": [SPEC],
            "default-spec-id": SPEC.spec_id,
            "last-partition-id": max(f.field_id for f in SPEC.fields),
            # The metadata log names only the previous metadata file, the one garbage() keeps.
            "properties": {
                NAME_MAPPING: name_mapping_json(schema),
                "write.metadata.previous-versions-max": "1",
            },
            "sort-orders": [UNSORTED_SORT_ORDER],
            "default-sort-order-id": UNSORTED_SORT_ORDER.order_id,
            "last-sequence-number": 0,
        }
    )


def _data_entry(
    topic_root: StoragePath, layer: Layer, partition: int, previous: dict[str, ManifestEntry]
) -> list[ManifestEntry]:
    """The manifest entries of ``layer``'s parts: the previous snapshot's where it had them."""
    out = []
    for part in layer.parts:
        where = location(topic_root / layer.dir / part.name)
        old = previous.get(where)
        if old is not None:
            out.append(old)
            continue
        lower = {LEDGER_ID_ID: to_bytes(LongType(), part.first.ledger_id)}
        upper = {LEDGER_ID_ID: to_bytes(LongType(), part.last.ledger_id)}
        if part.first.ledger_id == part.last.ledger_id:  # else entry ids are bounded by nothing known
            lower[ENTRY_ID_ID] = to_bytes(LongType(), part.first.entry_id)
            upper[ENTRY_ID_ID] = to_bytes(LongType(), part.last.entry_id)
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=where,
            file_format=FileFormat.PARQUET,
            partition=Record(partition),
            record_count=part.rows,
            file_size_in_bytes=part.size,
            lower_bounds=lower,
            upper_bounds=upper,
            spec_id=SPEC.spec_id,
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
        )
        out.append(_added(data_file))
    return out


def _delete_entry(
    table_dir: StoragePath,
    topic_root: StoragePath,
    layer: Layer,
    partition: int,
    previous: dict[str, ManifestEntry],
) -> ManifestEntry | None:
    """The manifest entry of ``layer``'s position-delete file (None: it hides no row): the
    previous snapshot's if it named the same file, else a file written now."""
    path = table_dir / position_deletes.file_key(partition, layer)
    old = previous.get(location(path))
    if old is not None:
        return old
    if (
        layer.deletes is None
        and layer.parts
        and location(topic_root / layer.dir / layer.parts[0].name) in previous
    ):
        # The layer was in the table already, with no file of its tombstones: it has none
        # (a vector would be new, and tombstones do not change).
        return None
    hidden = position_deletes.hidden(topic_root, layer)
    if not hidden:
        return None
    if path.is_file():
        # Left by a commit that did not publish: garbage, which a collection running now may
        # be deleting. A name of this commit's own instead.
        path = table_dir / position_deletes.file_key(partition, layer, unique=uuid.uuid4().hex[:12])
    written = position_deletes.write(path, hidden)
    return _added(written.data_file(partition, SPEC.spec_id))


def _added(data_file: DataFile) -> ManifestEntry:
    return ManifestEntry.from_args(
        status=ManifestEntryStatus.ADDED,
        snapshot_id=None,
        sequence_number=None,
        file_sequence_number=None,
        data_file=data_file,
    )


def _partition_of(manifest: ManifestFile) -> int | None:
    """The partition a manifest of this table holds (each holds one)."""
    if not manifest.partitions or manifest.partitions[0].lower_bound is None:
        return None
    return int(from_bytes(IntegerType(), manifest.partitions[0].lower_bound))


def _snapshot_id(base: TableMetadata) -> int:
    taken = {s.snapshot_id for s in base.snapshots}
    while True:
        found = random.SystemRandom().getrandbits(63)
        if found and found not in taken:
            return found


def _version(metadata_location: str) -> int:
    name = metadata_location.rsplit("/", 1)[-1]
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def _expired(snapshots: list[Snapshot], *, snapshots_kept: int, oldest_ms: int) -> list[int]:
    """Of the snapshots before the new one, those to expire: past the ``snapshots_kept`` newest
    (the new one counts), or taken before ``oldest_ms``."""
    newest_first = sorted(snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms), reverse=True)
    kept = 1
    out = []
    for s in newest_first:
        if kept < snapshots_kept and s.timestamp_ms >= oldest_ms:
            kept += 1
        else:
            out.append(s.snapshot_id)
    return out


def _totals(manifests: list[ManifestFile]) -> dict[str, str]:
    """Iceberg's ``total-*`` summary properties over a snapshot's manifests."""
    files = {ManifestContent.DATA: 0, ManifestContent.DELETES: 0}
    rows = dict(files)
    for m in manifests:
        files[m.content] += (m.added_files_count or 0) + (m.existing_files_count or 0)
        rows[m.content] += (m.added_rows_count or 0) + (m.existing_rows_count or 0)
    return {
        "total-data-files": str(files[ManifestContent.DATA]),
        "total-delete-files": str(files[ManifestContent.DELETES]),
        "total-records": str(rows[ManifestContent.DATA]),
        "total-position-deletes": str(rows[ManifestContent.DELETES]),
        "total-equality-deletes": "0",
    }


def _pinned(metadata: TableMetadata) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for s in metadata.snapshots:
        found = s.summary.get(LEDGERS) if s.summary is not None else None
        for partition, ledger_id in json.loads(found or "{}").items():
            out.setdefault(int(partition), set()).add(int(ledger_id))
    return out


def pinned(storage: Storage, metadata_location: str) -> dict[int, set[int]]:
    """Per partition, the ids of the compacted ledgers the table's kept snapshots hold files
    of (a ledger's manifest may name older ledgers' directories: those are the caller's to
    keep with it)."""
    return _pinned(read_metadata(storage, metadata_location))


def garbage(
    table_dir: StoragePath, metadata_location: str, *, now_ms: int | None = None, grace_ms: int = GRACE_MS
) -> list[StoragePath]:
    """The files under ``table_dir`` that the table at ``metadata_location`` no longer names:
    not that metadata file nor the one before it (a reader may have just loaded it), nor a
    kept snapshot's manifest list, manifests and delete files. What a failed commit left is
    among them, once older than ``grace_ms``: a file written since then (``now_ms``: the
    current time) may be a commit's in progress, of another partition or instance, whose
    metadata is not yet the table's."""
    storage = table_dir.storage
    fio = StorageFileIO(storage)
    metadata = read_metadata(storage, metadata_location)
    named = {metadata_location}
    if metadata.metadata_log:
        named.add(metadata.metadata_log[-1].metadata_file)
    seen: set[str] = set()
    for snapshot in metadata.snapshots:
        named.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(fio):
            named.add(manifest.manifest_path)
            if manifest.content != ManifestContent.DELETES or manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(fio, discard_deleted=True):
                named.add(entry.data_file.file_path)
    young = (now_ms if now_ms is not None else int(time.time() * 1000)) - grace_ms
    out = []
    for found in storage.list(table_dir.key):
        path = storage.at(found.key)
        if location(path) in named or found.mtime_ms is None or found.mtime_ms > young:
            continue
        out.append(path)
    return out


__all__ = ["Committed", "RoundState", "commit_round", "garbage", "path_at", "pinned", "read_metadata"]
