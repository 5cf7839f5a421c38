"""Key indexes: the keys of one compacted part file, so that a round finds the rows its new
data supersedes without reading the part.

Layout: beside ``part-00000.parquet``, ``part-00000.keys.arrow``, an Arrow IPC file (no
compression, so it is memory-mapped, not decoded) with one row per row of the part, in the
part's row order:

- ``key`` (string): the row's key, null for a keyless row (kept with ``retainNullKey``);
- ``tombstone_time`` (int64), present only when the part holds tombstones (kept by delete
  retention): the publish time of a tombstone row, null for other rows.

A key's row number in the part is its position in the file, so no row column is stored. Keys
are unique among the keyed rows of a part (a compacted layer holds one row per key).

How a round uses it (``compactor.probe``): it probes every indexed key against a hash
set of its *new* keys (Arrow's ``is_in``). That costs about 50 ns per indexed key, and for a
round of 1% new messages it is less work than a sorted or hashed index would save: such an
index needs ``new keys x log(indexed keys)`` comparisons, about as many as there are indexed
keys when the new keys are a few percent of them. Exact keys decide; nothing is hashed into
an identity.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa

from ledger.checksums import DECODE, MISSING, IntegrityError, io_failure
from ledger.storage import StoragePath

KEY = "key"
TOMBSTONE_TIME = "tombstone_time"
SUFFIX = ".keys.arrow"


def index_name(part_name: str) -> str:
    """The key index file name of part ``part_name`` (``part-00000.parquet`` -> ``part-00000.keys.arrow``)."""
    stem = part_name[: -len(".parquet")] if part_name.endswith(".parquet") else part_name
    return stem + SUFFIX


def build(keys: pa.ChunkedArray | pa.Array, tombstones: np.ndarray, publish_times: np.ndarray) -> pa.Table:
    """The index table of a part whose rows have these keys, tombstone flags and publish times."""
    columns: dict[str, pa.Array | pa.ChunkedArray] = {KEY: keys}
    if tombstones.any():
        columns[TOMBSTONE_TIME] = pa.array(publish_times, pa.int64(), mask=~tombstones)
    return pa.table(columns)


def write(path: str | Path, table: pa.Table) -> None:
    """Write an index file on this machine's disk (the caller makes it durable and puts it in
    place: fsync and rename, or ``StoragePath.publish``; see the part writer)."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def read(path: str | Path | StoragePath, *, rows: int = -1) -> pa.Table:
    """The index at ``path``: memory-mapped on a local disk (pages are read as the probe
    touches them), read whole in one request from object storage.

    An Arrow IPC file has no checksums of its own: the manifest's CRC32C of it is verified
    before a round reads it (``service.compaction_inputs``) and by the scrubber. A file that does not
    decode, or (``rows`` >= 0) does not hold ``rows`` rows, raises ``IntegrityError``."""
    local = path.local if isinstance(path, StoragePath) else path
    try:
        if local is not None:
            with pa.memory_map(str(local)) as source:
                table = pa.ipc.open_file(source).read_all()
        else:
            assert isinstance(path, StoragePath)
            table = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()
    except FileNotFoundError:
        raise IntegrityError(path, MISSING, "the file is gone") from None
    except (pa.ArrowInvalid, OSError) as e:
        if io_failure(e):
            raise  # a system call or a request failed: nothing says the bytes are bad
        raise IntegrityError(path, DECODE, f"not a key index: {e}") from e
    if KEY not in table.column_names or (rows >= 0 and table.num_rows != rows):
        raise IntegrityError(path, DECODE, f"holds {table.num_rows} rows, its part {rows}")
    return table


#: What :func:`read_cached` keeps per process, at most (decoded indexes, by ``Table.nbytes``).
CACHE_BYTES = 128 << 20

_cache: collections.OrderedDict[tuple[str, str, int], pa.Table] = collections.OrderedDict()
_cache_lock = threading.Lock()


def read_cached(path: StoragePath, *, rows: int, checksum: str | None) -> pa.Table:
    """:func:`read`, kept per process on object storage when the manifest gives the file's
    ``checksum`` (the key: a file is never rewritten, and a name reused by a retried round
    would come with another checksum): a delta round's probe reads every older layer's key
    indexes, the same files round after round, and a Spark worker lives across rounds. The
    driver verifies each file against its checksum before every round (a damaged one stops
    the round before its tasks run), so what is kept was verified when it was read. On a local
    disk the index is memory-mapped, and the page cache keeps it."""
    if path.local is not None or checksum is None:
        return read(path, rows=rows)
    key = (str(path), checksum, rows)
    with _cache_lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    table = read(path, rows=rows)
    with _cache_lock:
        _cache[key] = table
        while sum(t.nbytes for t in _cache.values()) > CACHE_BYTES and len(_cache) > 1:
            _cache.popitem(last=False)
    return table


def dead_tombstones(index: pa.Table, keep_since: int | None) -> np.ndarray:
    """Rows of the part that are tombstones no longer kept: all of them without delete
    retention (``keep_since`` None), else those published before ``keep_since``."""
    if TOMBSTONE_TIME not in index.column_names:
        return np.zeros(index.num_rows, dtype=bool)
    times = index.column(TOMBSTONE_TIME)
    is_tomb = np.asarray(times.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if keep_since is None:
        return is_tomb
    t = np.asarray(times.fill_null(keep_since).to_numpy(), dtype=np.int64)
    return is_tomb & (t < keep_since)
