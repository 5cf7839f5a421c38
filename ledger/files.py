"""The ledger package's low-level file helpers, below both ``ledger.storage`` and
``ledger.paths``: the suffixes of files not yet (or no longer) in use, fsync by path, and
positional reads and writes that finish what they start (``os.pread``/``os.pwrite`` may do
less than asked)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

TMP_SUFFIX = ".tmp"
QUARANTINE_SUFFIX = ".quarantine"

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory (which makes a rename or unlink inside it durable), by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_dir = fsync_path


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(f"pwrite wrote {n} bytes at offset {offset}")
        view = view[n:]
        offset += n


# At most this many buffers a gathered write (Linux's IOV_MAX is 1024).
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


def pwritev_all(fd: int, parts: Sequence[bytes | bytearray | memoryview], offset: int) -> None:
    """Write ``parts`` one after the other at ``offset``, gathered (no copy into one buffer)."""
    for i in range(0, len(parts), _IOV_MAX):
        chunk = parts[i : i + _IOV_MAX]
        want = sum(len(p) for p in chunk)
        n = os.pwritev(fd, chunk, offset)
        if n < want:  # a short write (rare): the rest in plain writes
            pwrite_all(fd, memoryview(b"".join(chunk))[n:], offset + n)
        offset += want


def pread_exact(fd: int, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes at ``offset``; fewer only if the file ends first."""
    chunks: list[bytes] = []
    while n > 0:
        chunk = os.pread(fd, n, offset)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)
