"""A compacted layer's hidden rows as an Iceberg v2 position-delete file.

A table's data files are the compacted ledger's part files, dead rows included; what a reader
of the compacted view does not see must be deleted by position for the table's readers too:

- the rows the layer's deletion vector marks dead (``ledger.deletion_vectors``: bits numbered
  across the layer's parts in order, so part ``i``'s rows start at ``Layer.part_starts()[i]``);
- tombstone rows the compacted ledger keeps while ``deleteRetentionMs`` holds (``is_tombstone``
  true): a readCompacted consumer gets them as deletes, a table shows the key absent.

One file per (layer, deletion vector): a later round that leaves the layer's vector unchanged
names the same file again; a round that writes the layer a new vector (old bits plus new ones)
gets a new file, and the old one leaves the table with the snapshots naming it. Its name comes
from the layer's directory and the vector's (``file_key``); a commit that finds that name taken
by a file no snapshot names (a failed commit's, garbage) writes under a name of its own. The
file's columns are Iceberg's ``file_path`` (field id 2147483546) and ``pos`` (2147483545), rows
sorted by both.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, StringType

from ledger import deletion_vectors
from ledger.iceberg_io import location
from ledger.layers import Layer
from ledger.schema import IS_TOMBSTONE, KEY, VALUE, derived_delete_flags, flags_follow_rule
from ledger.storage import StoragePath

FILE_PATH_ID = 2147483546
POS_ID = 2147483545
FILE_PATH, POS = "file_path", "pos"
ARROW_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.string(),
            nullable=False,
            metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()},
        ),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
    ]
)
# Where a table keeps its delete files, under its directory.
DELETES_DIR = "deletes"


def file_key(partition: int, layer: Layer, unique: str | None = None) -> str:
    """The delete file of ``layer`` (with its current vector) of ``partition``, relative to the
    table's directory: ``deletes/p{partition}/{layer dir}/{vector dir}-{vector}.parquet``
    (``tombstones.parquet`` for a layer without a vector, whose tombstones are all it hides);
    with ``unique``, ``...{vector}.{unique}.parquet`` (for a file that may not reuse the name)."""
    if layer.deletes is None:
        vector = "tombstones"
    else:
        vector = f"{layer.deletes.dir}-{layer.deletes.name.rsplit('.', 1)[0]}"
    suffix = f".{unique}" if unique else ""
    return f"{DELETES_DIR}/p{partition}/{layer.dir}/{vector}{suffix}.parquet"


def tombstones(part: StoragePath) -> np.ndarray:
    """Which rows of ``part`` are tombstones: its ``is_tombstone`` column, or, in a file written
    before that column followed Pulsar's delete rule, the rule applied to its key and value."""
    with part.open() as f:
        pf = pq.ParquetFile(f)
        if flags_follow_rule(pf.schema_arrow.metadata):
            column = pf.read(columns=[IS_TOMBSTONE]).column(0)
        else:
            table = pf.read(columns=[KEY, VALUE])
            column = derived_delete_flags(table.column(KEY), table.column(VALUE))
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=bool)


@functools.lru_cache(maxsize=4096)
def _tombstone_rows(part: StoragePath) -> np.ndarray:
    # Parts are immutable and a layer's stay for many rounds (each new vector of the base
    # re-reads them otherwise): their tombstones' positions, read once a process. Few or none
    # (tombstones stay only while deleteRetentionMs holds), so the cache stays small.
    rows = np.flatnonzero(tombstones(part)).astype(np.int64)
    rows.setflags(write=False)
    return rows


def hidden(topic_root: StoragePath, layer: Layer) -> list[tuple[StoragePath, np.ndarray]]:
    """Per part of ``layer`` (whose directory is under ``topic_root``) with rows to hide: the
    part and the sorted positions of those rows. Reads the layer's vector, verified against
    its checksum, and every part's tombstone flags."""
    dead = None
    if layer.deletes is not None:
        vector = topic_root / layer.deletes.dir / layer.deletes.name
        dead = deletion_vectors.read(vector, layer.rows, checksum=layer.deletes.checksum)
    out: list[tuple[StoragePath, np.ndarray]] = []
    for part, start in zip(layer.parts, layer.part_starts(), strict=True):
        path = topic_root / layer.dir / part.name
        stones = _tombstone_rows(path)
        if len(stones) and stones[-1] >= part.rows:
            raise ValueError(f"{path}: a tombstone at row {stones[-1]}, the manifest says {part.rows} rows")
        if dead is None:
            positions = stones
        else:
            hide = dead[start : start + part.rows].copy()
            hide[stones] = True
            positions = np.flatnonzero(hide).astype(np.int64)
        if len(positions):
            out.append((path, positions))
    return out


@dataclass(frozen=True)
class DeleteFile:
    """A written position-delete file: what its manifest entry records."""

    path: StoragePath
    rows: int
    size: int
    first: tuple[str, int]
    last: tuple[str, int]

    def data_file(self, partition: int, spec_id: int) -> DataFile:
        """Its manifest entry's data file, in the partition of the data files it deletes from."""
        return DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=location(self.path),
            file_format=FileFormat.PARQUET,
            partition=Record(partition),
            record_count=self.rows,
            file_size_in_bytes=self.size,
            # Readers index a delete file by file_path when its bounds are equal.
            lower_bounds={
                FILE_PATH_ID: to_bytes(StringType(), self.first[0]),
                POS_ID: to_bytes(LongType(), self.first[1]),
            },
            upper_bounds={
                FILE_PATH_ID: to_bytes(StringType(), self.last[0]),
                POS_ID: to_bytes(LongType(), self.last[1]),
            },
            spec_id=spec_id,
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
        )


def encode(rows: list[tuple[StoragePath, np.ndarray]]) -> tuple[bytes, int, tuple[str, int], tuple[str, int]]:
    """The Parquet bytes of a delete file over ``rows`` (non-empty), its row count and its
    first and last (file_path, pos)."""
    ordered = sorted(((location(p), pos) for p, pos in rows), key=lambda r: r[0])
    # Each part's path repeated by arrow's take (a Python list of tens of thousands of strings
    # cost 40 ms a file); the positions delta-encoded: sorted, they pack to a few bits each.
    which = np.repeat(np.arange(len(ordered), dtype=np.int32), [len(pos) for _, pos in ordered])
    paths = pa.array([p for p, _ in ordered], pa.string()).take(pa.array(which))
    positions = pa.array(np.concatenate([pos for _, pos in ordered]), pa.int64())
    table = pa.Table.from_arrays([paths, positions], schema=ARROW_SCHEMA)
    out = io.BytesIO()
    pq.write_table(
        table,
        out,
        compression="zstd",
        compression_level=1,
        use_dictionary=[FILE_PATH],
        column_encoding={POS: "DELTA_BINARY_PACKED"},
    )
    first = (ordered[0][0], int(ordered[0][1][0]))
    last = (ordered[-1][0], int(ordered[-1][1][-1]))
    return out.getvalue(), table.num_rows, first, last


def write(path: StoragePath, rows: list[tuple[StoragePath, np.ndarray]]) -> DeleteFile:
    """Write the delete file of ``rows`` (non-empty) at ``path``, durably and whole."""
    data, count, first, last = encode(rows)
    path.write_bytes(data)
    return DeleteFile(path, count, len(data), first, last)
