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
from ledger.files import TMP_SUFFIX
from ledger.storage import StoragePath


def empty(rows: int) -> np.ndarray:
    """A vector of ``rows`` live rows, unpacked (one bool per row)."""
    return np.zeros(rows, dtype=bool)


def read(path: Path | str | StoragePath, rows: int, *, checksum: str | None = None) -> np.ndarray:
    """The vector at ``path`` over ``rows`` rows, unpacked (``True`` = dead); with ``checksum``,
    the file's CRC32C is verified first. Raises ``IntegrityError`` for a file that is missing,
    fails its checksum or is not a vector of ``rows`` rows."""
    local = path.local if isinstance(path, StoragePath) else path
    try:
        if local is not None:
            with open(local, "rb") as f:
                data = f.read()
        else:
            assert isinstance(path, StoragePath)
            data = path.read_bytes()
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
def _cached(path: str | StoragePath, rows: int, mtime_ns: int, size: int) -> np.ndarray:
    dead = read(path, rows)
    dead.setflags(write=False)  # shared between callers
    return dead


def read_cached(path: Path | str | StoragePath, rows: int) -> np.ndarray:
    """:func:`read`, cached per process (keyed by the file's identity too, so a file that is
    written again under a name it had before is read again). Read-only."""
    local = path.local if isinstance(path, StoragePath) else path
    if local is not None:
        st = os.stat(local)
        return _cached(str(local), rows, st.st_mtime_ns, st.st_size)
    assert isinstance(path, StoragePath)
    # An object's modification time is when its upload completed: a new upload, a new entry.
    info = path.fs.get_file_info(path.fs_path)
    if info.size is None:
        raise FileNotFoundError(str(path))
    return _cached(path, rows, info.mtime_ns or 0, info.size)


def write(path: Path | StoragePath, dead: np.ndarray) -> str:
    """Write ``dead`` (one bool per row) to ``path`` durably; returns the CRC32C of the bytes
    written (what the manifest records)."""
    out = io.BytesIO()
    np.save(out, np.packbits(np.asarray(dead, dtype=bool), bitorder="little"), allow_pickle=False)
    data = out.getvalue()
    local = path.local if isinstance(path, StoragePath) else Path(path)
    if local is None:
        assert isinstance(path, StoragePath)
        path.write_bytes(data)  # stored whole, or not at all
        return crc32c_bytes(data)
    tmp = local.with_name(local.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, local)
    return crc32c_bytes(data)
