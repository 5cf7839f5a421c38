"""Checksums of stored files, and the error a failed check raises.

Two layers guard every Parquet file the service writes (sealed ledgers, compacted parts):

* **page checksums** (Parquet's CRC32 of each page, ``write_page_checksum=True``), verified by
  every read that decodes the page (``page_checksum_verification=True`` here, and
  ``parquet.page.verify-checksum.enabled`` for Spark's reader): damage in a page is found by
  the read that would have used it, and only the row groups holding that page are lost;
* a **whole-file CRC32C**, recorded in the metadata database when a ledger is sealed and in
  the manifest for every file of a compacted ledger (parts, their key indexes, deletion
  vectors; the manifest's own CRC32C is in the database): it also covers the footer and page
  headers, and is what the scrubber and a compaction's input check verify. Key indexes and
  deletion vectors have no pages to check: the whole-file CRC32C is their only guard.

A checksum is written ``"crc32c:xxxxxxxx"`` (lower-case hex), so that a stronger algorithm can
be added later without ambiguity. Files written before page checksums existed are still read:
pyarrow verifies only the pages that carry a CRC.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ledger.storage import StoragePath, is_unavailable

ALGORITHM = "crc32c"
# Read size of a whole-file check: large enough for the CRC to run at memory speed.
CHUNK_BYTES = 1 << 20

# Every Parquet writer of the service passes these; every pyarrow reader passes READ_OPTIONS.
WRITE_OPTIONS: dict[str, object] = {"write_page_checksum": True}
READ_OPTIONS: dict[str, object] = {"page_checksum_verification": True}

# The checks a damaged file can fail, as they are named in errors, stats and scrub reports.
PAGE_CHECKSUM = "page checksum"
FILE_CHECKSUM = "file checksum"
FOOTER = "footer"
ROW_IDS = "row ids"
MANIFEST = "manifest checksum"
MISSING = "file missing"
READ_BACK = "read-back comparison"
PAGE_DECODE = "page decode"
# A compacted layer's deletion vector or key index (not Parquet: no page checksums) that does
# not decode, or does not cover the rows its manifest says.
DECODE = "decode"

# What pyarrow and parquet-mr say when a page's CRC does not match.
_PAGE_CRC_MESSAGES = ("CRC checksum verification failed", "could not verify page integrity")


class IntegrityError(Exception):
    """A stored file failed a check: ``path`` names it, ``check`` the check that failed (one
    of the names above), ``detail`` what was found. ``str()`` is one line.

    ``path`` is a ``Path`` for a file on this machine's disk (a local storage's file too: what
    it always was), and the :class:`StoragePath` of an object in a bucket (``str()``:
    ``s3://bucket/key``); ``.name`` and ``.parent`` work on both."""

    def __init__(self, path: Path | str | StoragePath, check: str, detail: str) -> None:
        if isinstance(path, StoragePath):
            self.path: Path | StoragePath = path.local or path
        else:
            self.path = Path(path)
        self.check = check
        self.detail = " ".join(str(detail).split())[:300]
        super().__init__(f"{self.path}: {check} failed: {self.detail}")


def format_checksum(value: int) -> str:
    return f"{ALGORITHM}:{value & 0xFFFFFFFF:08x}"


def _crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    # Imported here, not at the top: the compactor's Spark tasks import this module for the
    # read and write options, and executors on a cluster have only pyarrow, numpy and pandas.
    import crc32c

    return int(crc32c.crc32c(data, value))


def crc32c_bytes(data: bytes | bytearray | memoryview) -> str:
    return format_checksum(_crc32c(data))


def file_checksum(path: Path | str | StoragePath, *, throttle: Callable[[int], None] | None = None) -> str:
    """The CRC32C of the whole file at ``path``; ``throttle(n)`` is called after each ``n``
    bytes read (the scrubber sleeps there to keep to its rate)."""
    value = 0
    with _reading(path) as f:
        while chunk := f.read(CHUNK_BYTES):
            value = _crc32c(chunk, value)
            if throttle is not None:
                throttle(len(chunk))
    return format_checksum(value)


@contextlib.contextmanager
def _reading(path: Path | str | StoragePath) -> Iterator[Any]:
    """The file for reading from start to end: unbuffered on a local disk (read in large
    chunks), one stream (one request, not one per chunk) from object storage."""
    local = path.local if isinstance(path, StoragePath) else path
    if local is not None:
        with open(local, "rb", buffering=0) as f:
            yield f
        return
    assert isinstance(path, StoragePath)
    with path.fs.open_input_stream(path.fs_path) as stream:
        yield stream


def verify_file(
    path: Path | str | StoragePath, expected: str, *, throttle: Callable[[int], None] | None = None
) -> None:
    """Raise :class:`IntegrityError` unless the file exists and its checksum is ``expected``."""
    try:
        actual = file_checksum(path, throttle=throttle)
    except FileNotFoundError:
        raise IntegrityError(path, MISSING, "the file is gone") from None
    if actual != expected:
        raise IntegrityError(path, FILE_CHECKSUM, f"recorded {expected}, the file has {actual}")


def read_verified(path: StoragePath, expected: str) -> bytes:
    """The whole file at ``path`` (one read: a single request on object storage), if its
    checksum is ``expected``; :class:`IntegrityError` as :func:`verify_file` raises it if not."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(path, MISSING, "the file is gone") from None
    if (actual := crc32c_bytes(data)) != expected:
        raise IntegrityError(path, FILE_CHECKSUM, f"recorded {expected}, the file has {actual}")
    return data


class Throttle:
    """Keeps a reader under ``bytes_per_second`` (0: no limit) by sleeping after reads."""

    def __init__(self, bytes_per_second: int) -> None:
        self.rate = bytes_per_second
        self._start = time.monotonic()
        self._bytes = 0

    def __call__(self, n: int) -> None:
        if self.rate <= 0:
            return
        self._bytes += n
        ahead = self._bytes / self.rate - (time.monotonic() - self._start)
        if ahead > 0:
            time.sleep(ahead)


def is_page_checksum_failure(exc: BaseException | str) -> bool:
    text = str(exc)
    return any(m in text for m in _PAGE_CRC_MESSAGES)


def io_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a read that failed rather than bytes that do not decode: a system
    call (out of descriptors or memory), or a request to the object store (network,
    credentials, throttling). pyarrow raises ``OSError`` for both kinds."""
    if not isinstance(exc, OSError):
        return False
    return exc.errno is not None or "Too many open files" in str(exc) or is_unavailable(exc)


def damage_of(
    path: Path | str | StoragePath, exc: BaseException, *, opening: bool = False
) -> IntegrityError | None:
    """What a failed read of a Parquet file at ``path`` means: an :class:`IntegrityError` when the
    file's bytes are bad (a page checksum, a footer or page that does not decode; ``opening``:
    the failure came from reading the footer), or ``None`` when the failure is not the file's
    (out of descriptors or memory, the file deleted under the read, a request to the object
    store that failed)."""
    if isinstance(exc, IntegrityError):
        return exc
    if isinstance(exc, FileNotFoundError | MemoryError | PermissionError):
        return None
    if io_failure(exc):
        return None  # nothing says the bytes are bad
    if is_page_checksum_failure(exc):
        return IntegrityError(path, PAGE_CHECKSUM, str(exc))
    # pyarrow raises OSError (no errno) or ArrowInvalid (a ValueError) for bytes it cannot
    # decode: a bad footer, a truncated file, a page header or page that does not decode.
    if isinstance(exc, OSError | ValueError):
        return IntegrityError(path, FOOTER if opening else PAGE_DECODE, str(exc))
    return None
