"""Compacted ledgers in storage: a manifest over layers of Parquet part files.

Layout of one compacted ledger (written by the compactor, its manifest by
:mod:`ledger.manifest_writer`; read here without Spark)::

    compacted-{ledger_id:020d}/
        part-00000.parquet         rows in message-id order, ARROW_SCHEMA columns
        part-00000.keys.arrow      its key index (ledger.key_index)
        part-00001.parquet         every row of part i+1 comes after every row of part i
        ...
        deletes-{layer:020d}.npy   deletion vectors this round wrote for older layers
        _manifest.json             written last; a ledger without it is incomplete

The manifest (``ledger.layers``) lists layers: the base, then the deltas of later rounds, each
naming the directory its parts are in (its own or an older ledger's) and its deletion vector.
The live rows of the layers in layer order are in message-id order. Records keep their
*original* message ids, so ids are sparse: a reader locates a start id by binary search, first
over the parts' id ranges (from the manifest), then inside one part over its two id columns
(read once and cached), and then reads only the row groups that hold the requested page,
skipping the rows the layer's deletion vector marks dead.

Integrity (see ``ledger.checksums``): parts are written with page checksums and read with
them verified; the manifest carries the whole-file CRC32C of every file it names (parts, key
indexes, deletion vectors; manifests written before that carry none), and the manifest's own
CRC32C is recorded in the metadata database, so the chain database -> manifest -> files covers
every byte. Deletion vectors are verified against their CRC32C whenever the reader loads one.
A read that meets damage raises ``IntegrityError`` naming the file and the check.

The files are read through ``ledger.storage``: from a local directory or from objects of an
S3-compatible bucket, the same code (pyarrow's filesystem of the storage).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ledger import deletion_vectors
from ledger.checksums import READ_OPTIONS, ROW_IDS, IntegrityError, damage_of
from ledger.entry import Entry, Position
from ledger.layers import (
    MANIFEST_NAME,
    CompactedLedgerError,
    Layer,
    Manifest,
    PartInfo,
)
from ledger.row_group_cache import RowGroupCache, RowGroupKey, shared
from ledger.schema import ENTRY_COLUMNS, ENTRY_ID, LEDGER_ID, present, table_to_entries
from ledger.storage import StoragePath, as_storage_path

__all__ = [
    "MANIFEST_NAME",
    "CompactedLedger",
    "CompactedLedgerError",
    "Layer",
    "Manifest",
    "PartInfo",
]

_ID_COLUMNS = [LEDGER_ID, ENTRY_ID]
# How a part's row groups are decoded for readers (their entry columns): the row-group cache's view.
_ENTRY_VIEW = "entries"
# Decodes row groups ahead of in-order readers, for every compacted ledger of the process.
_READ_AHEAD = ThreadPoolExecutor(max_workers=2, thread_name_prefix="compacted-read-ahead")


@dataclass(frozen=True, slots=True)
class _PartIndex:
    """What a reader needs to address rows of one part: its footer and row-group offsets."""

    metadata: pq.FileMetaData
    # rg_starts[i] is the row number of the first row of row group i; rg_starts[-1] == rows.
    rg_starts: list[int]


@dataclass(frozen=True, slots=True)
class _Part:
    """A part as the reader sees it: where it is, its layer, and its first row in the layer."""

    path: StoragePath
    info: PartInfo
    layer: int
    layer_row: int


@dataclass(frozen=True, slots=True)
class _Decoded:
    """Row groups ``first_rg..last_rg`` of ``part``, decoded, holding only live rows.

    ``rows`` holds the row numbers (in the part) of the table's rows, or is ``None`` when every
    row is live and the table's row i is row ``offset + i``. Dropping the dead rows once per
    decoding, not once per page, makes every page of consecutive live rows a slice: no copy.
    """

    part: int
    first_rg: int
    last_rg: int
    table: pa.Table
    offset: int
    rows: np.ndarray | None

    def holds(self, part: int, first_rg: int, last_rg: int) -> bool:
        return self.part == part and self.first_rg <= first_rg <= last_rg <= self.last_rg

    def followed_by(self, part: int, first_rg: int) -> bool:
        """Whether row group ``first_rg`` of ``part`` comes right after these."""
        if part == self.part:
            return first_rg == self.last_rg + 1
        return part == self.part + 1 and first_rg == 0

    def select(self, rows: np.ndarray) -> pa.Table:
        """The table's rows for ``rows``: consecutive live rows of the part (as a page is),
        inside these row groups. A slice: no copy."""
        at = int(rows[0]) - self.offset if self.rows is None else int(np.searchsorted(self.rows, rows[0]))
        return self.table.slice(at, len(rows))


class CompactedLedger:
    """Read access to a compacted ledger by message id; safe to share between threads.

    The parts of every layer, in layer order, form one sequence in message-id order; a
    layer's deletion vector hides its dead rows. Opening reads only the manifest. A read costs
    one binary search over the parts, one over the id columns of the part holding the start
    (cached per part, ``cache_parts`` at most), and the row groups of the returned page; in a
    part with dead rows, the live row numbers come from the layer's deletion vector (read once
    per layer, when a read first reaches the layer). A reader going on in order has the next
    row group decoded ahead, on a thread of a pool the process's compacted ledgers share.
    Row groups come from ``cache`` (the process's :func:`ledger.row_group_cache.shared` by
    default) where it holds them, and the ones decoded are put there: every view of a topic,
    and each of its readers, shares them.
    """

    def __init__(
        self,
        directory: Path | str | StoragePath,
        *,
        cache_parts: int = 8,
        checksum: str | None = None,
        cache: RowGroupCache | None = None,
    ) -> None:
        self.directory = as_storage_path(directory)
        self._cache = cache if cache is not None else shared()
        self.manifest = Manifest.load(self.directory, checksum=checksum)
        root = self.directory.parent
        self._parts = [
            _Part(root / layer.dir / info.name, info, i, start)
            for i, layer in enumerate(self.manifest.layers)
            for info, start in zip(layer.parts, layer.part_starts(), strict=True)
        ]
        self._lasts = [(p.info.last.ledger_id, p.info.last.entry_id) for p in self._parts]
        self._cache_parts = max(1, cache_parts)
        self._index: dict[int, _PartIndex] = {}
        self._ids: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        # Per part: None (no dead row) or the sorted live row numbers; LRU as the ids.
        self._live: OrderedDict[int, np.ndarray | None] = OrderedDict()
        self._dead: dict[int, np.ndarray] = {}  # per layer with a deletion vector, unpacked
        self._live_counts: list[int] | None = None
        self._lock = threading.Lock()
        # The row groups decoded last, their dead rows dropped. Replaced whole, never changed,
        # so threads share it without the lock.
        self._decoded: _Decoded | None = None
        # The row group being decoded ahead of an in-order reader: ((part, row group), future).
        self._ahead: tuple[tuple[int, int], Future[_Decoded]] | None = None

    # ------------------------------------------------------------------ summary

    @property
    def entries(self) -> int:
        """Live records."""
        return self.manifest.entries

    @property
    def size_bytes(self) -> int:
        return self.manifest.size_bytes

    @property
    def first_position(self) -> Position | None:
        """The id of the first live record."""
        return self.seek(Position(0, 0))

    @property
    def last_position(self) -> Position | None:
        """The id of the last live record."""
        for part in reversed(range(len(self._parts))):
            live = self._live_rows(part)
            if live is None:
                return self._parts[part].info.last
            if len(live):
                return self._position_of(part, int(live[-1]))
        return None

    def part_paths(self) -> list[StoragePath]:
        """Every part file, in message-id order (dead rows included)."""
        return [p.path for p in self._parts]

    # ------------------------------------------------------------------ reading

    def read(self, start: Position, max_entries: int) -> tuple[list[Entry], Position | None]:
        """Live records with id >= ``start``, in id order, at most ``max_entries`` of them, and
        the id of the live record after them (``None`` when the ledger has no more)."""
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        part = bisect.bisect_left(self._lasts, (start.ledger_id, start.entry_id))
        if part == len(self._parts):
            return [], None
        row = self._locate(part, start)
        out: list[Entry] = []
        while part < len(self._parts) and len(out) < max_entries:
            rows = self._parts[part].info.rows
            live = self._live_rows(part)
            if live is None:
                take = min(max_entries - len(out), rows - row)
                out.extend(self._read_rows(part, np.arange(row, row + take)))
                row += take
            else:
                at = int(np.searchsorted(live, row))
                chosen = live[at : at + max_entries - len(out)]
                out.extend(self._read_rows(part, chosen))
                row = int(chosen[-1]) + 1 if at + len(chosen) < len(live) else rows
            if row >= rows:
                part, row = part + 1, 0
        return out, self._next_live(part, row)

    def count_from(self, start: Position) -> int:
        """How many live records have an id >= ``start`` (for backlogs), by binary search."""
        part = bisect.bisect_left(self._lasts, (start.ledger_id, start.entry_id))
        if part == len(self._parts):
            return 0
        counts = self._counts()
        row = self._locate(part, start)
        live = self._live_rows(part)
        if live is None:
            here = self._parts[part].info.rows - row
        else:
            here = len(live) - int(np.searchsorted(live, row))
        return here + sum(counts[part + 1 :])

    def seek(self, start: Position) -> Position | None:
        """The id of the first live record with id >= ``start``, or ``None``."""
        return self.read(start, 0)[1]

    def close(self) -> None:
        with self._lock:
            self._index.clear()
            self._ids.clear()
            self._live.clear()
            self._dead.clear()
            self._decoded = None
            self._ahead = None

    # ------------------------------------------------------------------ internals

    def _path(self, part: int) -> StoragePath:
        return self._parts[part].path

    def _open(self, part: int, index: _PartIndex) -> pq.ParquetFile:
        """The part for reading, its footer not read again."""
        path = self._path(part)
        return pq.ParquetFile(path.fs_path, filesystem=path.fs, metadata=index.metadata, **READ_OPTIONS)  # type: ignore[arg-type]

    def _layer_dead(self, layer: int) -> np.ndarray | None:
        deletes = self.manifest.layers[layer].deletes
        if deletes is None or deletes.count == 0:
            return None
        with self._lock:
            found = self._dead.get(layer)
        if found is None:
            path = self.directory.parent / deletes.dir / deletes.name
            # Verified on every load: a vector has no page checksums, and a damaged one would
            # hide live rows or show dead ones.
            found = deletion_vectors.read(path, self.manifest.layers[layer].rows, checksum=deletes.checksum)
            with self._lock:
                self._dead[layer] = found
        return found

    def _live_rows(self, part: int) -> np.ndarray | None:
        """The part's live row numbers, sorted, or ``None`` when every row is live."""
        with self._lock:
            if part in self._live:
                self._live.move_to_end(part)
                return self._live[part]
        p = self._parts[part]
        dead = self._layer_dead(p.layer)
        live: np.ndarray | None = None
        if dead is not None:
            mine = dead[p.layer_row : p.layer_row + p.info.rows]
            if mine.any():
                live = np.flatnonzero(~mine)
        with self._lock:
            self._live[part] = live
            self._live.move_to_end(part)
            while len(self._live) > self._cache_parts:
                self._live.popitem(last=False)
        return live

    def _counts(self) -> list[int]:
        """Live rows per part (reads every deletion vector, once)."""
        if self._live_counts is None:
            counts = []
            for p in self._parts:
                dead = self._layer_dead(p.layer)
                n = p.info.rows
                if dead is not None:
                    n -= int(np.count_nonzero(dead[p.layer_row : p.layer_row + p.info.rows]))
                counts.append(n)
            self._live_counts = counts
        return self._live_counts

    def _next_live(self, part: int, row: int) -> Position | None:
        """The id of the first live row at or after row ``row`` of ``part``, or ``None``."""
        while part < len(self._parts):
            live = self._live_rows(part)
            if live is None:
                if row < self._parts[part].info.rows:
                    return self._position_of(part, row)
            else:
                at = int(np.searchsorted(live, row))
                if at < len(live):
                    return self._position_of(part, int(live[at]))
            part, row = part + 1, 0
        return None

    def _part_index(self, part: int) -> _PartIndex:
        with self._lock:
            found = self._index.get(part)
        if found is not None:
            return found
        path = self._path(part)
        try:
            meta = pq.read_metadata(path.fs_path, filesystem=path.fs)
        except Exception as e:
            raise damage_of(self._path(part), e, opening=True) or e from e
        starts = [0]
        for i in range(meta.num_row_groups):
            starts.append(starts[-1] + meta.row_group(i).num_rows)
        if starts[-1] != self._parts[part].info.rows:
            raise CompactedLedgerError(
                self._path(part), f"has {starts[-1]} rows, manifest says {self._parts[part].info.rows}"
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
            with self._open(part, index) as pf:
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
        """Row number, inside ``part``, of the first stored row with id >= ``start``."""
        if not start > self._parts[part].info.first:
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
        info = self._parts[part].info
        first, last = (info.first.ledger_id, info.first.entry_id), (info.last.ledger_id, info.last.entry_id)
        if head < first or tail > last or tail < head or (lo == 0 and head != first):
            raise IntegrityError(
                self._path(part),
                ROW_IDS,
                f"rows {head}..{tail} lie outside the part's range {info.first}..{info.last}",
            )

    def _position_of(self, part: int, row: int) -> Position:
        if row == 0:
            return self._parts[part].info.first
        ledger_ids, entry_ids = self._part_ids(part)
        return Position(int(ledger_ids[row]), int(entry_ids[row]))

    def _read_rows(self, part: int, rows: np.ndarray) -> list[Entry]:
        """Rows ``rows`` of ``part`` (consecutive live rows: with none dead between them), reading
        only the row groups that hold them."""
        if not len(rows):
            return []
        index = self._part_index(part)
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        first_rg = bisect.bisect_right(index.rg_starts, lo) - 1
        last_rg = bisect.bisect_right(index.rg_starts, hi - 1) - 1
        # Readers go page by page and a row group holds many pages: keep the last one decoded.
        decoded = self._decoded
        if decoded is not None and decoded.holds(part, first_rg, last_rg):
            return table_to_entries(decoded.select(rows))
        if decoded is not None and decoded.part == part and decoded.first_rg <= first_rg <= decoded.last_rg:
            # A page across the end of the held row groups: decode only the ones after them.
            after = self._decoded = self._decode(part, decoded.last_rg + 1, last_rg, in_order=True)
            split = int(np.searchsorted(rows, index.rg_starts[decoded.last_rg + 1]))
            tail, head = decoded.select(rows[:split]), after.select(rows[split:])
            return table_to_entries(pa.concat_tables([tail, head]))
        in_order = decoded is not None and decoded.followed_by(part, first_rg)
        decoded = self._decoded = self._decode(part, first_rg, last_rg, in_order=in_order)
        return table_to_entries(decoded.select(rows))

    def _decode(self, part: int, first_rg: int, last_rg: int, *, in_order: bool) -> _Decoded:
        """Row groups ``first_rg..last_rg`` of ``part``, as ``_decode_now`` gives them.

        A reader that went on in order from the row groups it read last is likely to go on: the
        row group after these is decoded ahead, on a thread, while the reader converts these
        (decoding releases the GIL). A reader that jumps about decodes only what it reads."""
        ahead = self._ahead
        if in_order:  # started first: it runs beside this one's decoding as well
            groups = len(self._part_index(part).rg_starts) - 1
            after = (part, last_rg + 1) if last_rg + 1 < groups else (part + 1, 0)
            if after[0] < len(self._parts):
                with contextlib.suppress(RuntimeError):  # the interpreter is shutting down
                    self._ahead = (after, _READ_AHEAD.submit(self._decode_now, *after, after[1]))
        ready = ahead[1] if ahead is not None and ahead[0] == (part, first_rg) == (part, last_rg) else None
        if ready is not None and ready.exception() is None:
            return ready.result()
        # A failed decoding ahead is done again here: damage fails again, and a passing failure
        # (no descriptor free, say) is not served to the retries.
        return self._decode_now(part, first_rg, last_rg)

    def _row_groups(self, part: int, index: _PartIndex, first_rg: int, last_rg: int) -> pa.Table:
        """Row groups ``first_rg..last_rg`` of ``part`` (every row), each checked against the
        manifest: from the row-group cache where it holds them, the others decoded, each run of
        consecutive ones in one read (pyarrow coalesces their ranges), and put there."""
        cache = self._cache
        if not cache.max_bytes:  # off (a local disk, by default): as if there were none
            table = self._read_row_groups(part, index, first_rg, last_rg)
            self._check_ids(part, table, lo=index.rg_starts[first_rg])
            return table
        p = self._parts[part]
        keys = [RowGroupKey(str(p.path), p.info.size, rg, _ENTRY_VIEW) for rg in range(first_rg, last_rg + 1)]
        found = [cache.get(key) for key in keys]
        i = 0
        while i < len(found):
            if found[i] is not None:
                i += 1
                continue
            j = i + 1
            while j < len(found) and found[j] is None:
                j += 1
            run = self._read_row_groups(part, index, first_rg + i, first_rg + j - 1)
            at = index.rg_starts[first_rg + i]
            for k in range(i, j):
                lo, hi = index.rg_starts[first_rg + k], index.rg_starts[first_rg + k + 1]
                rows = run if j - i == 1 else run.slice(lo - at, hi - lo)
                self._check_ids(part, rows, lo=lo)
                cache.put(keys[k], rows)
                found[k] = rows
            i = j
        tables = [t for t in found if t is not None]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def _read_row_groups(self, part: int, index: _PartIndex, first_rg: int, last_rg: int) -> pa.Table:
        """Row groups ``first_rg..last_rg`` of ``part`` decoded from the file, page checksums
        verified (the ids are the caller's to check)."""
        try:
            with self._open(part, index) as pf:
                return pf.read_row_groups(
                    list(range(first_rg, last_rg + 1)), columns=present(ENTRY_COLUMNS, pf.schema_arrow.names)
                )
        except Exception as e:
            raise damage_of(self._path(part), e) or e from e

    def _decode_now(self, part: int, first_rg: int, last_rg: int) -> _Decoded:
        """Row groups ``first_rg..last_rg`` of ``part``, checked against the manifest, dead rows
        dropped."""
        index = self._part_index(part)
        table = self._row_groups(part, index, first_rg, last_rg)
        offset = index.rg_starts[first_rg]
        live = self._live_rows(part)
        if live is None:
            return _Decoded(part, first_rg, last_rg, table, offset, None)
        end = index.rg_starts[last_rg + 1]
        mine = live[np.searchsorted(live, offset) : np.searchsorted(live, end)]
        if len(mine) == table.num_rows:
            return _Decoded(part, first_rg, last_rg, table, offset, None)
        keep = np.zeros(table.num_rows, dtype=np.bool_)
        keep[mine - offset] = True
        # A filter by mask: Table.take copies the same rows several times slower.
        return _Decoded(part, first_rg, last_rg, table.filter(pa.array(keep)), offset, mine)
