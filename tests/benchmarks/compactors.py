"""Three compactors over the same input, producing the same output, and the check that they do.

Every compactor is given a :class:`Round` -- sealed ledgers in message-id order and the
horizon, plus optionally the previous round's compacted output -- and writes the latest
record of every key (tombstoned keys dropped, keyless records dropped) as Parquet in
``ARROW_SCHEMA`` with rows in message-id order, fsynced (the project's compactor makes its
output durable, so the peers do too). Timed: the whole call, from the first read to the
last fsync.

- :class:`ProjectCompactor`: the project's ``TwoPhaseCompactor`` on the process's warm
  SparkSession (``compactor.spark.get_spark``), writing a compacted ledger (part files and
  manifest) as the service does.
- :class:`DuckDBCompactor`: one DuckDB statement, latest-per-key (packed ``(ledger_id,
  entry_id)`` max and ``arg_max`` of the tombstone flag per key), a semi-join back to the full
  rows, ``ORDER BY`` the ids, ``COPY TO`` one zstd Parquet file; DuckDB's default threads
  (= cores).
- :class:`PythonCompactor`: the plain two-pass dict compactor a Python user would write with
  pyarrow: pass one iterates record batches of the narrow columns into ``dict[key] ->
  packed id`` (a tombstone stored as ``~id``); pass two iterates full batches, keeps the rows
  whose id is in the set of live winners, and writes them with a ``ParquetWriter``.

:func:`verify_same_output` reads the outputs back and raises :class:`OutputMismatch` unless
they hold the same rows in the same (strictly increasing id) order: equal id arrays, equal
digests of the key and value columns, matching column names and types.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compactor import CompactionJob, TwoPhaseCompactor
from ledger.checksums import file_checksum
from ledger.compacted_store import Manifest
from ledger.entry import Position
from ledger.files import fsync_dir
from ledger.schema import ARROW_SCHEMA, ENTRY_ID, IS_TOMBSTONE, KEY, LEDGER_ID, VALUE

PACK_SHIFT = 32
BATCH_ROWS = 64 * 1024


@dataclass(frozen=True)
class PreviousOutput:
    """What the previous round of one compactor left: its files, and its horizon."""

    files: list[Path]
    horizon: Position
    directory: Path  # the project's compacted-ledger directory (peers: their output directory)


@dataclass(frozen=True)
class Round:
    """One compaction round's input: sealed ledgers ``(ledger_id, path)`` in id order, all of
    whose rows are at or before ``horizon``; with ``previous`` an incremental round whose new
    ledgers all come after the previous horizon."""

    topic_root: Path
    ledgers: list[tuple[int, Path]]
    horizon: Position
    previous: PreviousOutput | None = None

    def new_ledgers(self) -> list[Path]:
        """The sealed ledgers a round must read besides the previous output."""
        if self.previous is None:
            return [p for _, p in self.ledgers]
        after = self.previous.horizon.ledger_id
        return [p for lid, p in self.ledgers if lid > after]


@dataclass
class Output:
    """One compactor's result of one round: its files (in id order), rows, time in seconds."""

    compactor: str
    files: list[Path]
    directory: Path
    rows: int
    seconds: float
    input_bytes: int
    details: dict[str, Any] = field(default_factory=dict)
    # The project's layered ledgers: per part file, its rows a deletion vector marks dead.
    dead: dict[Path, np.ndarray] = field(default_factory=dict)

    def previous(self, horizon: Position) -> PreviousOutput:
        return PreviousOutput(files=list(self.files), horizon=horizon, directory=self.directory)


class Compactor(Protocol):
    name: str

    def compact(self, work: Round, out_dir: Path) -> Output:
        """Compact ``work`` into a new directory ``out_dir`` (must not exist)."""
        ...


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.iterdir()):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(directory)


def _bytes(paths: Sequence[Path]) -> int:
    return sum(Path(p).stat().st_size for p in paths)


# --------------------------------------------------------------------------- the project


class ProjectCompactor:
    """The project's ``TwoPhaseCompactor`` on a (warm) SparkSession.

    ``out_dir``'s name must be ``compacted-{ledger_id:020d}`` under the round's topic root, as
    the service lays it out (see :meth:`output_dir`).
    """

    name = "project (Spark)"

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.compactor = TwoPhaseCompactor(spark)
        self._next_ledger_id = 1_000_000_000
        # The sealed ledgers' whole-file CRC32C, as the service records them when it seals them
        # and passes them to its rounds (computed here once, outside any timing).
        self._checksums: dict[Path, str] = {}

    def output_dir(self, topic_root: Path) -> Path:
        from ledger.paths import compacted_dir

        self._next_ledger_id += 1
        return compacted_dir(topic_root, self._next_ledger_id)

    def compact(self, work: Round, out_dir: Path) -> Output:
        ledger_id = int(out_dir.name.removeprefix("compacted-"))
        prev = work.previous
        for _, path in work.ledgers:
            if path not in self._checksums:
                self._checksums[path] = file_checksum(path)
        job = CompactionJob(
            topic_root=Path(work.topic_root),
            inputs=[p for _, p in work.ledgers],
            input_ledger_ids=[i for i, _ in work.ledgers],
            previous_compacted=prev.directory if prev else None,
            previous_horizon=prev.horizon if prev else None,
            horizon=work.horizon,
            output_ledger_id=ledger_id,
            input_checksums={i: self._checksums[p] for i, p in work.ledgers},
        )
        t0 = time.perf_counter()
        result = self.compactor.compact(job)
        seconds = time.perf_counter() - t0
        directory = result.directory.local  # the benchmarks' topics are on a local disk
        if directory != out_dir:
            raise AssertionError(f"compactor wrote {result.directory}, expected {out_dir}")
        files, dead = layered_files(directory)
        return Output(
            compactor=self.name,
            files=files,
            dead=dead,
            directory=directory,
            rows=result.records_kept,
            seconds=seconds,
            input_bytes=result.bytes_in,
            details={
                "phase_one_ms": result.phase_one_ms,
                "phase_two_ms": result.phase_two_ms,
                "parts": len(result.manifest.parts),
                "ledger_id": ledger_id,
                "layers": [layer.kind for layer in result.manifest.layers],
            },
        )


# --------------------------------------------------------------------------- DuckDB


def _sql_list(paths: Sequence[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


DUCKDB_QUERY = """
COPY (
    WITH src AS (SELECT * FROM read_parquet({files})),
    latest AS (
        SELECT max(ledger_id << 32 | entry_id) AS id,
               arg_max(is_tombstone, ledger_id << 32 | entry_id) AS tombstone
        FROM src WHERE key IS NOT NULL GROUP BY key
    )
    SELECT src.* FROM src
    SEMI JOIN (SELECT id FROM latest WHERE NOT tombstone) AS live
        ON (src.ledger_id << 32 | src.entry_id) = live.id
    ORDER BY src.ledger_id, src.entry_id
) TO '{out}' (FORMAT parquet, COMPRESSION zstd)
"""


class DuckDBCompactor:
    """Latest-per-key in one DuckDB statement (see ``DUCKDB_QUERY``), default threads."""

    name = "DuckDB"

    def __init__(self, threads: int | None = None) -> None:
        import duckdb

        self.version = duckdb.__version__
        self.threads = threads

    def compact(self, work: Round, out_dir: Path) -> Output:
        import duckdb

        files = [*(work.previous.files if work.previous else []), *work.new_ledgers()]
        out_dir.mkdir(parents=True)
        out = out_dir / "part-00000.parquet"
        t0 = time.perf_counter()
        con = duckdb.connect()
        try:
            if self.threads:
                con.execute(f"SET threads = {int(self.threads)}")
            threads = con.execute("SELECT current_setting('threads')").fetchone()
            con.execute(DUCKDB_QUERY.format(files=_sql_list(files), out=str(out).replace("'", "''")))
        finally:
            con.close()
        _fsync_tree(out_dir)
        seconds = time.perf_counter() - t0
        return Output(
            compactor=self.name,
            files=[out],
            directory=out_dir,
            rows=pq.read_metadata(out).num_rows,
            seconds=seconds,
            input_bytes=_bytes(files),
            details={"threads": threads[0] if threads else None},
        )


# --------------------------------------------------------------------------- plain Python


def _packed_ids(batch: pa.RecordBatch) -> np.ndarray:
    lid = batch.column(LEDGER_ID).to_numpy()
    eid = batch.column(ENTRY_ID).to_numpy()
    return (lid << PACK_SHIFT) | eid


class PythonCompactor:
    """The two-pass dict compactor (see the module docstring). Relies on the storage order:
    files are given in id order and rows within a file are in id order, so the last record
    seen for a key is its latest."""

    name = "Python dict"

    def compact(self, work: Round, out_dir: Path) -> Output:
        files = [*(work.previous.files if work.previous else []), *work.new_ledgers()]
        out_dir.mkdir(parents=True)
        out = out_dir / "part-00000.parquet"
        t0 = time.perf_counter()
        # Pass one: key -> packed id of its latest record (~id when that record is a tombstone).
        latest: dict[str, int] = {}
        narrow = [LEDGER_ID, ENTRY_ID, KEY, IS_TOMBSTONE]
        for path in files:
            with pq.ParquetFile(path) as pf:
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=narrow):
                    ids = _packed_ids(batch)
                    tomb = batch.column(IS_TOMBSTONE).to_numpy(zero_copy_only=False)
                    signed = np.where(tomb, ~ids, ids)
                    keys = batch.column(KEY).to_pylist()
                    latest.update(zip(keys, signed.tolist(), strict=True))
        latest.pop(None, None)  # type: ignore[call-overload]  # keyless records are dropped
        keep = {i for i in latest.values() if i >= 0}
        del latest
        # Pass two: the full rows whose id is a live winner, in input (= id) order.
        rows = 0
        with pq.ParquetWriter(out, ARROW_SCHEMA, compression="zstd") as writer:
            for path in files:
                with pq.ParquetFile(path) as pf:
                    for batch in pf.iter_batches(batch_size=BATCH_ROWS):
                        mask = [i in keep for i in _packed_ids(batch).tolist()]
                        kept = batch.filter(pa.array(mask, pa.bool_()))
                        if kept.num_rows:
                            writer.write_batch(kept)
                            rows += kept.num_rows
        _fsync_tree(out_dir)
        seconds = time.perf_counter() - t0
        return Output(
            compactor=self.name,
            files=[out],
            directory=out_dir,
            rows=rows,
            seconds=seconds,
            input_bytes=_bytes(files),
        )


# --------------------------------------------------------------------------- checking


class OutputMismatch(AssertionError):
    """Two compactors' outputs differ (or one is not in message-id order)."""


@dataclass(frozen=True)
class Fingerprint:
    """What is compared: the packed ids in file order, and digests of the key and value columns."""

    rows: int
    ids: np.ndarray
    key_digest: str
    value_digest: str
    columns: tuple[tuple[str, str], ...]


def _feed(lengths: Any, data: Any, arr: pa.Array) -> None:
    """Add a string/binary array to two digests: one of lengths (-1 = null), one of bytes;
    independent of how the column is chunked."""
    arr = arr.cast(pa.large_binary())
    offsets_buf, data_buf = arr.buffers()[1], arr.buffers()[2]
    offs = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    nulls = arr.is_null().to_numpy(zero_copy_only=False)
    lengths.update(np.where(nulls, -1, np.diff(offs)).astype(np.int64).tobytes())
    if data_buf is not None and len(offs) and offs[-1] > offs[0]:
        data.update(memoryview(data_buf)[int(offs[0]) : int(offs[-1])])


def _type_name(t: pa.DataType) -> str:
    # Map field names differ between writers (Spark: key_value, Arrow: entries); compare shape.
    if pa.types.is_map(t):
        return f"map<{t.key_type}, {t.item_type}>"
    if pa.types.is_large_string(t):
        return "string"
    if pa.types.is_large_binary(t):
        return "binary"
    return str(t)


def layered_files(directory: Path) -> tuple[list[Path], dict[Path, np.ndarray]]:
    """A compacted ledger's part files in reading order, layer by layer, and the dead-row
    mask of each part that has dead rows (from its layer's deletion vector)."""
    from ledger import deletion_vectors

    manifest = Manifest.load(directory)
    root = directory.parent
    files: list[Path] = []
    dead: dict[Path, np.ndarray] = {}
    for layer in manifest.layers:
        vector = None
        if layer.deletes is not None and layer.dead:
            vector = deletion_vectors.read(root / layer.deletes.dir / layer.deletes.name, layer.rows)
        for part, start in zip(layer.parts, layer.part_starts(), strict=True):
            path = root / layer.dir / part.name
            files.append(path)
            if vector is not None:
                dead[path] = vector[start : start + part.rows]
    return files, dead


def fingerprint(files: Sequence[Path], dead: dict[Path, np.ndarray] | None = None) -> Fingerprint:
    """Read ``files`` in order and fingerprint their rows (ids, keys, values), leaving out the
    rows ``dead`` marks (per file)."""
    ids: list[np.ndarray] = []
    kl, kd, vl, vd = (hashlib.blake2b(digest_size=16) for _ in range(4))
    columns: tuple[tuple[str, str], ...] = ()
    for path in files:
        with pq.ParquetFile(path) as pf:
            schema = pf.schema_arrow
            cols = tuple((f.name, _type_name(f.type)) for f in schema)
            if columns and cols != columns:
                raise OutputMismatch(f"{path}: columns {cols} differ from the other parts' {columns}")
            columns = cols
            gone = (dead or {}).get(path)
            row = 0
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[LEDGER_ID, ENTRY_ID, KEY, VALUE]):
                if gone is not None:
                    live = ~gone[row : row + batch.num_rows]
                    row += batch.num_rows
                    batch = batch.filter(pa.array(live))
                ids.append(_packed_ids(batch))
                _feed(kl, kd, batch.column(KEY))
                _feed(vl, vd, batch.column(VALUE))
    all_ids = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
    return Fingerprint(
        rows=len(all_ids),
        ids=all_ids,
        key_digest=kl.hexdigest() + kd.hexdigest(),
        value_digest=vl.hexdigest() + vd.hexdigest(),
        columns=columns,
    )


EXPECTED_COLUMNS = tuple((f.name, _type_name(f.type)) for f in ARROW_SCHEMA)


def verify_same_output(outputs: Sequence[Output]) -> int:
    """Raise :class:`OutputMismatch` unless every output holds the same rows, in strictly
    increasing message-id order, with the ledger columns; returns the row count."""
    if not outputs:
        return 0
    prints = [(o.compactor, fingerprint(o.files, o.dead)) for o in outputs]
    for name, fp in prints:
        # The ledger columns of this format, or of an earlier one (inputs written before the
        # last columns were added give DuckDB's output their columns only).
        if fp.columns and not (len(fp.columns) >= 8 and fp.columns == EXPECTED_COLUMNS[: len(fp.columns)]):
            raise OutputMismatch(f"{name}: columns {fp.columns}, expected {EXPECTED_COLUMNS}")
        if fp.rows > 1 and not bool(np.all(fp.ids[1:] > fp.ids[:-1])):
            bad = int(np.argmin(fp.ids[1:] > fp.ids[:-1]))
            raise OutputMismatch(f"{name}: rows not in message-id order at row {bad + 1}")
    (ref_name, ref), others = prints[0], prints[1:]
    for name, fp in others:
        if fp.rows != ref.rows:
            raise OutputMismatch(f"{name} wrote {fp.rows} rows, {ref_name} {ref.rows}")
        if not np.array_equal(fp.ids, ref.ids):
            i = int(np.argmax(fp.ids != ref.ids))
            a, b = int(fp.ids[i]), int(ref.ids[i])
            raise OutputMismatch(
                f"{name} and {ref_name} differ at row {i}: "
                f"id {a >> 32}:{a & 0xFFFFFFFF} vs {b >> 32}:{b & 0xFFFFFFFF}"
            )
        if fp.key_digest != ref.key_digest:
            raise OutputMismatch(f"{name} and {ref_name}: same ids, different keys")
        if fp.value_digest != ref.value_digest:
            raise OutputMismatch(f"{name} and {ref_name}: same ids, different values")
    for o in outputs:
        if o.rows != ref.rows:
            raise OutputMismatch(f"{o.compactor} reported {o.rows} rows, its files hold {ref.rows}")
    return ref.rows


def remove_output(output: Output) -> None:
    shutil.rmtree(output.directory, ignore_errors=True)


def manifest_files(directory: Path) -> list[Path]:
    """The part files of a compacted ledger directory, in reading order (every layer's)."""
    return Manifest.load(directory).part_paths(directory.parent)
