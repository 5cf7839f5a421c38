"""A round's input: which files it reads, and those files as the Arrow path's segments or as a
Spark SQL DataFrame.

:func:`plan_inputs` chooses the files from the previous compacted ledger's manifest and the
sealed ledgers' Parquet footers (their id bounds, read once for the whole round, decide which
ledgers can hold rows in ``(previous_horizon, horizon]`` and whether the round's ids pack into
one BIGINT); it reads nothing else. :func:`input_segments` makes them the id-ordered segments
the Arrow tasks read (``compactor.segments``); :func:`input_frame` reads them as a DataFrame,
with Spark SQL on a local disk and with Arrow tasks on object storage, which Spark SQL does not
read (:data:`NEEDS_ARROW`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from compactor.parts import INCOMPRESSIBLE_RATIO
from compactor.phases import MAX_PACKED_ENTRY_ID, can_pack, derived_delete_column
from compactor.result import CompactionJob
from compactor.segments import Segment, ShippedFooter, bound, column_bytes, row_group_ids
from compactor.sql_paths import rows_frame
from ledger import prefetch
from ledger.compacted_store import Manifest
from ledger.entry import Position
from ledger.schema import COLUMNS, ENTRY_ID, IS_TOMBSTONE, LEDGER_ID, SPARK_DDL, VALUE, flags_follow_rule
from ledger.storage import StoragePath

# Why a round on object storage that only Spark SQL could run is refused (see the docstring of
# ``compactor.two_phase``): Spark SQL reads and writes files on a local disk only.
NEEDS_ARROW = (
    "compaction on object storage needs the Arrow path: message ids that pack into 64 bits "
    "(ledger ids below 2**31), and retainNullKey only with the offset strategy"
)


def spark_path(path: Path | StoragePath) -> str:
    """A local path as Spark should read it: always the local file system, never the
    cluster's default one (the storage root is mounted where every executor can read it).
    ``ValueError`` for an object of object storage: Spark SQL's files are local ones."""
    local = path.local if isinstance(path, StoragePath) else Path(path).absolute()
    if local is None:
        raise ValueError(f"{path}: {NEEDS_ARROW}")
    return "file:" + str(local)


def id_range(after: Position | None, upto: Position) -> Column:
    """Rows with ids in ``(after, upto]`` (``after`` None: no lower bound)."""
    lid, eid = F.col(LEDGER_ID), F.col(ENTRY_ID)
    cond = (lid < upto.ledger_id) | ((lid == upto.ledger_id) & (eid <= upto.entry_id))
    if after is not None:
        cond = cond & ((lid > after.ledger_id) | ((lid == after.ledger_id) & (eid > after.entry_id)))
    return cond


@dataclass(frozen=True, slots=True)
class IdBounds:
    """The smallest and largest ledger and entry ids of a set of rows (from Parquet statistics);
    ``EMPTY`` (min > max) when there are no rows."""

    min_ledger_id: int
    max_ledger_id: int
    min_entry_id: int
    max_entry_id: int

    @property
    def is_empty(self) -> bool:
        return self.min_ledger_id > self.max_ledger_id

    def union(self, other: IdBounds) -> IdBounds:
        return IdBounds(
            min(self.min_ledger_id, other.min_ledger_id),
            max(self.max_ledger_id, other.max_ledger_id),
            min(self.min_entry_id, other.min_entry_id),
            max(self.max_entry_id, other.max_entry_id),
        )


EMPTY_BOUNDS = IdBounds(2**63, -1, 2**63, -1)


def _footer_facts(meta: pq.FileMetaData) -> tuple[IdBounds | None, bool]:
    """From a Parquet footer: the file's id bounds (``None`` if a row group lacks statistics:
    then nothing may be concluded), and whether its ``is_tombstone`` must be derived again
    (written before empty values deleted)."""
    derive = not flags_follow_rule(meta.metadata)
    groups = row_group_ids(meta)
    if groups is None:
        return None, derive
    bounds = EMPTY_BOUNDS
    for g in groups:
        bounds = bounds.union(IdBounds(g.min_ledger_id, g.max_ledger_id, g.min_entry_id, g.max_entry_id))
    return bounds, derive


def ids_packable(bounds: Sequence[IdBounds | None]) -> bool:
    """Whether every id within these bounds packs into one BIGINT (unknown bounds: no)."""
    return all(
        b is not None
        and (
            b.is_empty
            or can_pack(
                b.max_ledger_id, b.max_entry_id, min_ledger_id=b.min_ledger_id, min_entry_id=b.min_entry_id
            )
        )
        for b in bounds
    )


@dataclass(frozen=True)
class CompactionInputs:
    """The files a round reads, and whether its ids pack into one BIGINT; with the previous
    compacted ledger's manifest, read once for the whole round."""

    previous_parts: list[StoragePath]
    originals: list[StoragePath]
    packed: bool
    previous_manifest: Manifest | None = None
    # Files whose ``is_tombstone`` predates today's delete rule: derived from key and value.
    derive_deletes: frozenset[StoragePath] = frozenset()
    # Rows of every file, from the footers (the originals' may extend past the round's range):
    # the round's progress counts against it.
    rows: int = 0
    # Of which in the original ledgers.
    new_rows: int = 0
    # The original ledgers' value column: bytes stored and bytes decoded (from the footers).
    value_bytes: tuple[int, int] = (0, 0)
    # Every file's size in bytes, as planning found it (the manifest's, or the opened file's),
    # so that no file is asked for it again.
    sizes: Mapping[StoragePath, int] = field(default_factory=dict)
    # The original ledgers' footers, handed to the tasks that read them (a request less each).
    footers: Mapping[StoragePath, pq.FileMetaData] = field(default_factory=dict)

    @property
    def values_compress(self) -> bool:
        """Whether the new values compress (their sealed ledgers' codec saved a tenth or more;
        unknown: yes), so that compacted parts should compress them too."""
        stored, decoded = self.value_bytes
        return decoded == 0 or stored < INCOMPRESSIBLE_RATIO * decoded

    @property
    def files(self) -> list[StoragePath]:
        return [*self.previous_parts, *self.originals]

    def size(self, path: StoragePath) -> int:
        found = self.sizes.get(path)
        return found if found is not None else path.size()

    @property
    def bytes_in(self) -> int:
        return sum(self.size(p) for p in self.files)


def _on_object_storage(job: CompactionJob) -> bool:
    """Whether the round's topic is in a bucket (no rename, no Spark SQL file I/O)."""
    return job.topic_root.local is None


def _ledger_in_range(job: CompactionJob, ledger_id: int) -> bool:
    after = job.previous_horizon
    return ledger_id <= job.horizon.ledger_id and (after is None or ledger_id >= after.ledger_id)


def _may_hold_new_rows(job: CompactionJob, bounds: IdBounds | None) -> bool:
    """Whether a sealed ledger with these id bounds can hold rows in ``(previous_horizon, horizon]``."""
    after = job.previous_horizon
    if bounds is None:
        return True  # no statistics: read it, the filter decides
    if bounds.is_empty:
        return False
    if bounds.min_ledger_id != bounds.max_ledger_id:
        return True
    lo = Position(bounds.min_ledger_id, bounds.min_entry_id)
    hi = Position(bounds.max_ledger_id, bounds.max_entry_id)
    return lo <= job.horizon and (after is None or hi > after)


def _footer(path: StoragePath) -> tuple[pq.FileMetaData, int]:
    """A Parquet file's footer and its size in bytes, from one opening of the file."""
    with path.open() as f:
        return pq.read_metadata(f), f.size()


def _footers(paths: Sequence[StoragePath]) -> dict[StoragePath, tuple[pq.FileMetaData, int]]:
    """:func:`_footer` of each of ``paths``: all at once where any is on object storage (each
    is a round trip or two), else one after another (each is a read from the page cache)."""
    at_once = any(p.local is None for p in paths)
    return dict(zip(paths, prefetch.each(_footer, paths, at_once=at_once), strict=True))


def plan_inputs(job: CompactionJob) -> CompactionInputs:
    """Which files ``job`` reads: the previous compacted ledger's parts (from its manifest) and
    the sealed ledgers that may hold rows in ``(previous_horizon, horizon]`` (by ledger id and
    footer statistics). Reads only the manifest and Parquet footers."""
    previous: list[StoragePath] = []
    manifest: Manifest | None = None
    if job.previous_compacted is not None:
        directory = job.previous_compacted
        manifest = job.previous_manifest if job.previous_manifest is not None else Manifest.load(directory)
        previous = manifest.part_paths(directory.parent)
    bounds: list[IdBounds | None] = []
    derive: set[StoragePath] = set()
    sizes: dict[StoragePath, int] = {}
    rows = 0
    parts = manifest.parts if manifest is not None else ()
    for path, part in zip(previous, parts, strict=True):
        if part.keys is not None:
            # Written by this version's part writer (the only one that writes key indexes):
            # its flags follow today's rule, and its rows and id range are in the manifest.
            # Entry ids always pack (a ledger holds fewer than 2**32 entries), so the range
            # of ledger ids decides -- and a delta round opens none of the older parts.
            rows += part.rows
            sizes[path] = part.size
            bounds.append(IdBounds(part.first.ledger_id, part.last.ledger_id, 0, MAX_PACKED_ENTRY_ID))
            continue
        meta, sizes[path] = _footer(path)
        rows += meta.num_rows
        b, legacy = _footer_facts(meta)
        bounds.append(b)
        if legacy:
            derive.add(path)
    originals: list[StoragePath] = []
    new_rows = value_stored = value_decoded = 0
    in_range = [p for p, i in zip(job.inputs, job.input_ledger_ids, strict=True) if _ledger_in_range(job, i)]
    found = _footers(in_range)  # of the others not even the footer is needed
    footers: dict[StoragePath, pq.FileMetaData] = {}
    for path in in_range:
        meta, size = found[path]
        b, legacy = _footer_facts(meta)
        if _may_hold_new_rows(job, b):
            rows += meta.num_rows
            new_rows += meta.num_rows
            stored, decoded = column_bytes(meta, [VALUE])
            value_stored += stored
            value_decoded += decoded
            originals.append(path)
            sizes[path] = size
            footers[path] = meta
            bounds.append(b)
            if legacy:
                derive.add(path)
    return CompactionInputs(
        previous_parts=previous,
        originals=originals,
        packed=ids_packable(bounds),
        previous_manifest=manifest,
        derive_deletes=frozenset(derive),
        rows=rows,
        new_rows=new_rows,
        value_bytes=(value_stored, value_decoded),
        sizes=sizes,
        footers=footers,
    )


def input_segments(
    job: CompactionJob,
    inputs: CompactionInputs,
    *,
    incremental: bool = False,
    new_only: bool = False,
) -> list[Segment]:
    """The round's input as id-ordered segments: the previous compacted ledger's parts, layer
    by layer, each with its layer's deletion vector (whole; in an ``incremental`` round one
    segment per row group, so that its copy spreads over the tasks; none with
    ``new_only``), then the original ledgers clipped to ``(previous_horizon, horizon]``."""
    out: list[Segment] = []
    manifest = inputs.previous_manifest
    if manifest is not None and not new_only:
        root = job.previous_compacted.parent  # type: ignore[union-attr]
        for layer in manifest.layers:
            dv = layer.deletes
            deletes = root / dv.dir / dv.name if dv is not None and dv.count else None
            for part, layer_row in zip(layer.parts, layer.part_starts(), strict=True):
                part_path = root / layer.dir / part.name
                first = bound(part.first.ledger_id, part.first.entry_id) - 1
                last = bound(part.last.ledger_id, part.last.entry_id)
                whole = Segment(
                    part_path,
                    first,
                    last,
                    part.size,
                    derive_deletes=part_path in inputs.derive_deletes,
                    deletes=deletes,
                    deletes_rows=layer.rows,
                    first_row=layer_row,
                )
                if not incremental:
                    out.append(whole)
                    continue
                meta = pq.read_metadata(part_path.fs_path, filesystem=part_path.fs)
                row = layer_row
                for rg in range(meta.num_row_groups):
                    group = meta.row_group(rg)
                    size = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
                    out.append(replace(whole, size=size, previous=True, row_groups=(rg,), first_row=row))
                    row += group.num_rows
    after = job.previous_horizon
    lo = bound(after.ledger_id, after.entry_id) if after is not None else -1
    hi = bound(job.horizon.ledger_id, job.horizon.entry_id)
    ids = dict(zip(job.inputs, job.input_ledger_ids, strict=True))
    for path in sorted(inputs.originals, key=lambda p: ids[p]):
        ledger = ids[path]
        footer = inputs.footers.get(path)
        first, last = bound(ledger, -1), bound(ledger, MAX_PACKED_ENTRY_ID)
        out.append(
            Segment(
                path,
                max(lo, first),
                min(hi, last),
                inputs.size(path),
                derive_deletes=path in inputs.derive_deletes,
                footer=ShippedFooter(footer) if footer is not None else None,
                checksum=job.input_checksums.get(ledger),
            )
        )
    return out


def input_frame(
    spark: SparkSession, job: CompactionJob, inputs: CompactionInputs, columns: Sequence[str] = COLUMNS
) -> DataFrame:
    """The round's input rows (previous compacted ledger + new original rows), ``columns`` only.
    Read by Spark SQL on a local disk; on object storage, which Spark SQL does not read, by
    Arrow tasks (``ValueError`` when ids do not pack: Arrow's reader needs them packed)."""
    if _on_object_storage(job):
        if not inputs.packed:
            raise ValueError(NEEDS_ARROW)
        return rows_frame(spark, input_segments(job, inputs), columns).select(*columns)
    reader = spark.read.schema(SPARK_DDL)
    frames: list[DataFrame] = []
    originals = set(inputs.originals)

    def read(paths: Sequence[StoragePath]) -> Iterator[DataFrame]:
        # Files written before empty values deleted get the flag derived from key and value.
        for derive in (False, True):
            chosen = [spark_path(p) for p in paths if (p in inputs.derive_deletes) == derive]
            if chosen:
                df = reader.parquet(*chosen)
                yield df.withColumn(IS_TOMBSTONE, derived_delete_column()) if derive else df

    # Taken whole: every record of the previous compacted ledger is <= the previous horizon.
    if inputs.previous_manifest is not None and inputs.previous_manifest.dead:
        # Its layers have dead rows: read with their deletion vectors applied.
        previous = [s for s in input_segments(job, inputs) if s.path not in originals]
        frames.append(rows_frame(spark, previous, COLUMNS))
    else:
        frames.extend(read(inputs.previous_parts))
    frames.extend(df.where(id_range(job.previous_horizon, job.horizon)) for df in read(inputs.originals))
    if not frames:
        frames.append(spark.createDataFrame([], schema=SPARK_DDL))
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    return df.select(*columns)
