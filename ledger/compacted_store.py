"""Compacted ledgers on disk: a directory of Parquet part files plus a manifest.

Layout of one compacted ledger (written by the compactor, read here without Spark)::

    compacted-{ledger_id:020d}/
        part-00000-....parquet     rows in message-id order, ARROW_SCHEMA columns
        part-00001-....parquet     every row of part i+1 comes after every row of part i
        ...
        _manifest.json             written last; a ledger without it is incomplete

``_manifest.json``::

    {"version": 1,
     "parts": [{"name": "part-00000-....parquet", "rows": 123,
                "first": "L:E", "last": "L:E", "size": 4567,
                "checksum": "crc32c:1a2b3c4d"}, ...]}

Parts are listed in reading order (their file-name order); empty part files are left out.
Records keep their *original* message ids, so ids are sparse: a reader locates a start id
by binary search, first over the parts' id ranges (from the manifest), then inside one part
over its two id columns (read once and cached), and then reads only the row groups that
hold the requested page.

Integrity (see ``ledger.checksums``): parts are written with page checksums and read with
them verified; the manifest carries each part's whole-file CRC32C (manifests written before
that carry none), and the manifest's own CRC32C is recorded in the metadata database, so the
chain database -> manifest -> parts covers every byte. A read that meets damage raises
``IntegrityError`` naming the part and the check.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ledger.checksums import (
    MANIFEST,
    MISSING,
    READ_OPTIONS,
    ROW_IDS,
    IntegrityError,
    crc32c_bytes,
    damage_of,
    file_checksum,
)
from ledger.entry import Entry, Position
from ledger.paths import TMP_SUFFIX, fsync_dir
from ledger.schema import COLUMNS, ENTRY_ID, LEDGER_ID, table_to_entries

MANIFEST_NAME = "_manifest.json"
MANIFEST_VERSION = 1
PART_GLOB = "part-*.parquet"
_PART_NUMBER = re.compile(r"^part-(\d+)")
_ID_COLUMNS = [LEDGER_ID, ENTRY_ID]


class CompactedLedgerError(IntegrityError, ValueError):
    """A compacted ledger directory is incomplete or its contents break the contract (its
    manifest or a part does not agree with what the manifest says): damage, too."""

    def __init__(self, path: Path, message: str, check: str = MANIFEST) -> None:
        super().__init__(path, check, message)


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One non-empty part file: its rows hold ids ``first`` .. ``last`` (inclusive), in order."""

    name: str
    rows: int
    first: Position
    last: Position
    size: int
    # The part file's CRC32C; None in manifests written before checksums.
    checksum: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "rows": self.rows,
            "first": str(self.first),
            "last": str(self.last),
            "size": self.size,
        }
        if self.checksum is not None:
            out["checksum"] = self.checksum
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PartInfo:
        return cls(
            name=str(obj["name"]),
            rows=int(obj["rows"]),
            first=Position.parse(obj["first"]),
            last=Position.parse(obj["last"]),
            size=int(obj["size"]),
            checksum=str(obj["checksum"]) if obj.get("checksum") is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """The parts of a compacted ledger, in reading (= message-id) order."""

    parts: tuple[PartInfo, ...]

    @property
    def entries(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def size_bytes(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def first_position(self) -> Position | None:
        return self.parts[0].first if self.parts else None

    @property
    def last_position(self) -> Position | None:
        return self.parts[-1].last if self.parts else None

    def to_json(self) -> dict[str, Any]:
        return {"version": MANIFEST_VERSION, "parts": [p.to_json() for p in self.parts]}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Manifest:
        if obj.get("version") != MANIFEST_VERSION:
            raise ValueError(f"unsupported manifest version {obj.get('version')!r}")
        return cls(parts=tuple(PartInfo.from_json(p) for p in obj["parts"]))

    @classmethod
    def load(cls, directory: Path, *, checksum: str | None = None) -> Manifest:
        """Read ``directory/_manifest.json``; raises :class:`CompactedLedgerError` if missing or bad,
        or if ``checksum`` is given and the file's CRC32C is not it."""
        path = Path(directory) / MANIFEST_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CompactedLedgerError(
                path, "no manifest: the compacted ledger is incomplete", MISSING
            ) from None
        if checksum is not None and (actual := crc32c_bytes(data)) != checksum:
            raise CompactedLedgerError(path, f"recorded {checksum}, the manifest has {actual}")
        try:
            manifest = cls.from_json(json.loads(data.decode("utf-8")))
        except (ValueError, KeyError, TypeError) as e:
            raise CompactedLedgerError(path, f"bad manifest: {e}") from e
        _check_order(path, manifest.parts)
        return manifest


def _part_sort_key(name: str) -> tuple[int, str]:
    # Spark names parts part-00000-..., part-00001-...; past 99999 the number grows a digit,
    # so order by the number first and the name second.
    m = _PART_NUMBER.match(name)
    return (int(m.group(1)) if m else -1, name)


def _check_order(where: Path, parts: Iterable[PartInfo]) -> None:
    prev: PartInfo | None = None
    for p in parts:
        if p.rows <= 0 or p.last < p.first:
            raise CompactedLedgerError(where, f"part {p.name}: bad range {p.first}..{p.last} ({p.rows} rows)")
        if prev is not None and not prev.last < p.first:
            raise CompactedLedgerError(
                where, f"part {p.name} starts at {p.first}, not after {prev.name} which ends at {prev.last}"
            )
        prev = p


def _id_at(pf: pq.ParquetFile, row_group: int, row: int) -> Position:
    ids = pf.read_row_group(row_group, columns=_ID_COLUMNS)
    return Position(ids.column(0)[row].as_py(), ids.column(1)[row].as_py())


def _describe_part(path: Path) -> PartInfo | None:
    """The manifest line of one part: its checksum (the whole file read once), and its id range
    from the id columns of its first and last row group."""
    size = path.stat().st_size
    checksum = file_checksum(path)
    with pq.ParquetFile(path, **READ_OPTIONS) as pf:  # type: ignore[arg-type]
        meta = pf.metadata
        non_empty = [i for i in range(meta.num_row_groups) if meta.row_group(i).num_rows > 0]
        if not non_empty:
            return None
        first_rg, last_rg = non_empty[0], non_empty[-1]
        first = _id_at(pf, first_rg, 0)
        last = _id_at(pf, last_rg, meta.row_group(last_rg).num_rows - 1)
        return PartInfo(
            name=path.name, rows=meta.num_rows, first=first, last=last, size=size, checksum=checksum
        )


def write_manifest(directory: Path) -> Manifest:
    """Describe the part files of ``directory`` and write its manifest atomically.

    Parts are taken in file-name order; empty parts are skipped. Raises
    :class:`CompactedLedgerError` if the parts' id ranges are not strictly increasing.
    The part files themselves must already be durable (the caller fsyncs them).
    """
    directory = Path(directory)
    names = sorted((p.name for p in directory.glob(PART_GLOB) if p.is_file()), key=_part_sort_key)
    parts = tuple(info for name in names if (info := _describe_part(directory / name)) is not None)
    _check_order(directory, parts)
    manifest = Manifest(parts=parts)
    path = directory / MANIFEST_NAME
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest.to_json(), f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(directory)
    return manifest


@dataclass(frozen=True, slots=True)
class _PartIndex:
    """What a reader needs to address rows of one part: its footer and row-group offsets."""

    metadata: pq.FileMetaData
    # rg_starts[i] is the row number of the first row of row group i; rg_starts[-1] == rows.
    rg_starts: list[int]


class CompactedLedger:
    """Read access to a compacted ledger by message id; safe to share between threads.

    Opening reads only the manifest. A read costs one binary search over the parts, one over
    the id columns of the part holding the start (cached per part, ``cache_parts`` at most),
    and the row groups of the returned page.
    """

    def __init__(self, directory: Path, *, cache_parts: int = 8, checksum: str | None = None) -> None:
        self.directory = Path(directory)
        self.manifest = Manifest.load(self.directory, checksum=checksum)
        self._parts = self.manifest.parts
        self._lasts = [(p.last.ledger_id, p.last.entry_id) for p in self._parts]
        self._cache_parts = max(1, cache_parts)
        self._index: dict[int, _PartIndex] = {}
        self._ids: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        # (part, first row group, last row group, rows): the row groups decoded last. Replaced
        # whole, never changed, so threads share it without the lock.
        self._decoded: tuple[int, int, int, pa.Table] | None = None

    # ------------------------------------------------------------------ summary

    @property
    def entries(self) -> int:
        return self.manifest.entries

    @property
    def size_bytes(self) -> int:
        return self.manifest.size_bytes

    @property
    def first_position(self) -> Position | None:
        return self.manifest.first_position

    @property
    def last_position(self) -> Position | None:
        return self.manifest.last_position

    def part_paths(self) -> list[Path]:
        """The non-empty part files, in message-id order (what a compaction reads back)."""
        return [self.directory / p.name for p in self._parts]

    # ------------------------------------------------------------------ reading

    def read(self, start: Position, max_entries: int) -> tuple[list[Entry], Position | None]:
        """Records with id >= ``start``, in id order, at most ``max_entries`` of them, and the id
        of the record after them (``None`` when the ledger has no more records)."""
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        part = bisect.bisect_left(self._lasts, (start.ledger_id, start.entry_id))
        if part == len(self._parts):
            return [], None
        row = self._locate(part, start)
        out: list[Entry] = []
        while part < len(self._parts) and len(out) < max_entries:
            take = min(max_entries - len(out), self._parts[part].rows - row)
            out.extend(self._read_rows(part, row, row + take))
            row += take
            if row >= self._parts[part].rows:
                part, row = part + 1, 0
        return out, self._position_of(part, row)

    def count_from(self, start: Position) -> int:
        """How many records have an id >= ``start`` (for backlogs), by binary search."""
        part = bisect.bisect_left(self._lasts, (start.ledger_id, start.entry_id))
        if part == len(self._parts):
            return 0
        rest = sum(p.rows for p in self._parts[part + 1 :])
        return rest + self._parts[part].rows - self._locate(part, start)

    def seek(self, start: Position) -> Position | None:
        """The id of the first record with id >= ``start``, or ``None``."""
        return self.read(start, 0)[1]

    def close(self) -> None:
        with self._lock:
            self._index.clear()
            self._ids.clear()
            self._decoded = None

    # ------------------------------------------------------------------ internals

    def _path(self, part: int) -> Path:
        return self.directory / self._parts[part].name

    def _part_index(self, part: int) -> _PartIndex:
        with self._lock:
            found = self._index.get(part)
        if found is not None:
            return found
        try:
            meta = pq.read_metadata(self._path(part))
        except Exception as e:
            raise damage_of(self._path(part), e, opening=True) or e from e
        starts = [0]
        for i in range(meta.num_row_groups):
            starts.append(starts[-1] + meta.row_group(i).num_rows)
        if starts[-1] != self._parts[part].rows:
            raise CompactedLedgerError(
                self._path(part), f"has {starts[-1]} rows, manifest says {self._parts[part].rows}"
            )
        index = _PartIndex(metadata=meta, rg_starts=starts)
        with self._lock:
            self._index[part] = index  # footers are small: keep every one
        return index

    def _part_ids(self, part: int) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            found = self._ids.get(part)
            if found is not None:
                self._ids.move_to_end(part)
                return found
        index = self._part_index(part)
        try:
            with pq.ParquetFile(self._path(part), metadata=index.metadata, **READ_OPTIONS) as pf:  # type: ignore[arg-type]
                table = pf.read(columns=_ID_COLUMNS)
        except Exception as e:
            raise damage_of(self._path(part), e) or e from e
        ids = (
            table.column(LEDGER_ID).to_numpy().astype(np.int64, copy=False),
            table.column(ENTRY_ID).to_numpy().astype(np.int64, copy=False),
        )
        with self._lock:
            self._ids[part] = ids
            self._ids.move_to_end(part)
            while len(self._ids) > self._cache_parts:
                self._ids.popitem(last=False)
        return ids

    def _locate(self, part: int, start: Position) -> int:
        """Row number, inside ``part``, of the first record with id >= ``start``."""
        if not start > self._parts[part].first:
            return 0  # no id column read needed
        ledger_ids, entry_ids = self._part_ids(part)
        lo = int(np.searchsorted(ledger_ids, start.ledger_id, side="left"))
        hi = int(np.searchsorted(ledger_ids, start.ledger_id, side="right"))
        return lo + int(np.searchsorted(entry_ids[lo:hi], start.entry_id, side="left"))

    def _check_ids(self, part: int, rows: pa.Table, *, lo: int) -> None:
        """Decoded rows must lie in the part's range from the manifest, in id order: a damaged
        footer that places other rows here is caught before they are served."""
        if not rows.num_rows:
            return
        n = rows.num_rows
        lids, eids = rows.column(LEDGER_ID), rows.column(ENTRY_ID)
        head = (lids[0].as_py(), eids[0].as_py())
        tail = (lids[n - 1].as_py(), eids[n - 1].as_py())
        info = self._parts[part]
        first, last = (info.first.ledger_id, info.first.entry_id), (info.last.ledger_id, info.last.entry_id)
        if head < first or tail > last or tail < head or (lo == 0 and head != first):
            raise IntegrityError(
                self._path(part),
                ROW_IDS,
                f"rows {head}..{tail} lie outside the part's range {info.first}..{info.last}",
            )

    def _position_of(self, part: int, row: int) -> Position | None:
        if part >= len(self._parts):
            return None
        if row == 0:
            return self._parts[part].first
        ledger_ids, entry_ids = self._part_ids(part)
        return Position(int(ledger_ids[row]), int(entry_ids[row]))

    def _read_rows(self, part: int, lo: int, hi: int) -> list[Entry]:
        """Rows ``lo`` .. ``hi - 1`` of ``part``, reading only the row groups that hold them."""
        if hi <= lo:
            return []
        index = self._part_index(part)
        first_rg = bisect.bisect_right(index.rg_starts, lo) - 1
        last_rg = bisect.bisect_right(index.rg_starts, hi - 1) - 1
        # Readers go page by page and a row group holds many pages: keep the last one decoded.
        decoded = self._decoded
        if decoded is None or decoded[0] != part or not decoded[1] <= first_rg <= last_rg <= decoded[2]:
            try:
                with pq.ParquetFile(self._path(part), metadata=index.metadata, **READ_OPTIONS) as pf:  # type: ignore[arg-type]
                    rows = pf.read_row_groups(list(range(first_rg, last_rg + 1)), columns=list(COLUMNS))
            except Exception as e:
                raise damage_of(self._path(part), e) or e from e
            self._check_ids(part, rows, lo=index.rg_starts[first_rg])
            decoded = self._decoded = (part, first_rg, last_rg, rows)
        _, first, _, table = decoded
        return table_to_entries(table.slice(lo - index.rg_starts[first], hi - lo))
