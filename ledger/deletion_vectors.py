"""Deletion vectors: which rows of a compacted layer a newer layer superseded.

A deletion vector covers the rows of one layer, numbered across the layer's part files in
reading order (part 0's rows first). It is a bitmap, bit ``r`` set when row ``r`` is dead,
stored as a NumPy ``.npy`` file of ``uint8`` holding ``numpy.packbits(dead, bitorder="little")``
(``ceil(rows / 8)`` bytes): 62.5 KB for a layer of 500,000 rows, whatever share is dead.

Integrity: the manifest that names a vector carries its CRC32C (``Deletes.checksum``). The
service's reader verifies it on every load (the file is small); a compaction's tasks, which may
run where no CRC32C library is installed, read vectors the driver verified before the round. A
file that does not decode or does not cover its layer's rows raises ``IntegrityError``.

Files are immutable. A round that deletes more rows of a layer writes a *new* vector, the old
one's bits plus the new ones, into its own directory, and its manifest names the new file; the
old manifest still names the old file, so a reader of either sees a consistent set. Written to
a temporary name, fsynced and renamed (the round's directory is fsynced by the caller).
"""

from __future__ import annotations

import functools
import io
import os
from pathlib import Path

import numpy as np

from ledger.checksums import DECODE, FILE_CHECKSUM, MISSING, IntegrityError, crc32c_bytes
from ledger.paths import TMP_SUFFIX


def empty(rows: int) -> np.ndarray:
    """A vector of ``rows`` live rows, unpacked (one bool per row)."""
    return np.zeros(rows, dtype=bool)


def read(path: Path | str, rows: int, *, checksum: str | None = None) -> np.ndarray:
    """The vector at ``path`` over ``rows`` rows, unpacked (``True`` = dead); with ``checksum``,
    the file's CRC32C is verified first. Raises ``IntegrityError`` for a file that is missing,
    fails its checksum or is not a vector of ``rows`` rows."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise IntegrityError(path, MISSING, "the file is gone") from None
    if checksum is not None and (actual := crc32c_bytes(data)) != checksum:
        raise IntegrityError(path, FILE_CHECKSUM, f"recorded {checksum}, the file has {actual}")
    try:
        packed = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise IntegrityError(path, DECODE, f"not a deletion vector: {e}") from e
    if packed.dtype != np.uint8 or packed.ndim != 1 or len(packed) != (rows + 7) // 8:
        raise IntegrityError(path, DECODE, f"not a deletion vector of {rows} rows")
    return np.unpackbits(packed, count=rows, bitorder="little").astype(bool)


@functools.lru_cache(maxsize=16)
def _cached(path: str, rows: int, mtime_ns: int, size: int) -> np.ndarray:
    dead = read(path, rows)
    dead.setflags(write=False)  # shared between callers
    return dead


def read_cached(path: Path | str, rows: int) -> np.ndarray:
    """:func:`read`, cached per process (keyed by the file's identity too, so a file that is
    written again under a name it had before is read again). Read-only."""
    st = os.stat(path)
    return _cached(str(path), rows, st.st_mtime_ns, st.st_size)


def write(path: Path, dead: np.ndarray) -> int:
    """Write ``dead`` (one bool per row) to ``path`` durably; returns how many rows are dead."""
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        np.save(f, np.packbits(np.asarray(dead, dtype=bool), bitorder="little"), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return int(np.count_nonzero(dead))
