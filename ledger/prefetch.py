"""Opening a Parquet object for reading a few of its columns with round trips in parallel.

What it is for: on object storage every request costs a round trip (milliseconds even on
loopback), and pyarrow's reader fetches a file's column chunks row group by row group, one
request (or one coalesced run) after another. A compaction round reads the key columns of
every sealed ledger, then the other columns of the row groups that hold winners: tens of row
groups per ledger, so hundreds of requests one after another. :func:`open_parquet` fetches
the byte ranges of exactly the column chunks that will be read, all at once on a shared pool
of threads, into a sparse image of the object (an anonymous mapping: pages never written cost
no memory), and hands pyarrow a reader over that image: the decoding then does no I/O.

Invariants:

* only the column chunks asked for are in the image; a read of anything else finds zeros,
  which the page checksums refuse (a reader asking for a column it did not name fails
  loudly, never silently);
* what pyarrow decodes is checked exactly as from the object (``READ_OPTIONS``);
* on a local disk, and for reads larger than :data:`MAX_PREFETCH_BYTES`, it opens the file
  as pyarrow would: the page cache (or pyarrow's own pre-buffering) serves them;
* a local file whose whole-file CRC32C the caller knows, read for most of its bytes (at least
  :data:`WHOLE_FILE_SHARE`), is mapped into memory and checked whole against it, and then
  decoded from those very bytes without page checks: the check covers every byte decoded
  (and the footer and page headers besides), at the speed of CRC32C in hardware rather than
  of pyarrow's CRC32 in software (a third of phase two's time on 4 KB values). A file that
  fails it is opened page-checked as any other: a damaged page is then found where it is.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from ledger.checksums import READ_OPTIONS, crc32c_bytes
from ledger.storage import StoragePath

T = TypeVar("T")
U = TypeVar("U")

#: Reads of more bytes than this go through pyarrow's reader (its memory stays bounded by
#: the row groups it decodes; an image would hold every one of them at once).
MAX_PREFETCH_BYTES = 128 << 20
#: Ranges closer than this are fetched as one (a round trip costs more than the gap's bytes).
GAP_BYTES = 256 << 10
#: A range longer than this is fetched in pieces, on several threads.
PIECE_BYTES = 8 << 20
#: Requests in flight at once, over every reader of the process.
FETCHERS = 16

#: Files being opened (footer, then their chunks fetched) at once, over every reader.
OPENERS = 8

#: The share of a local file's bytes a read must cover for the file to be checked whole
#: against its known CRC32C instead of page by page (see the module's docstring).
WHOLE_FILE_SHARE = 0.5

_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(name: str, workers: int) -> ThreadPoolExecutor:
    # Two pools: an opener waits for its fetches, which must not wait behind openers.
    with _pools_lock:
        if name not in _pools:
            _pools[name] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        return _pools[name]


def _fetchers() -> ThreadPoolExecutor:
    return _pool("prefetch-range", FETCHERS)


def _openers() -> ThreadPoolExecutor:
    return _pool("prefetch-file", OPENERS)


def chunk_ranges(
    meta: pq.FileMetaData, columns: Sequence[str], row_groups: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """The ``(offset, length)`` of every column chunk of ``columns`` in ``row_groups`` (all
    when None): where each chunk's first page (its dictionary page, if any) starts, and its
    pages' stored size."""
    wanted = set(columns)
    leaves = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] in wanted]
    groups = range(meta.num_row_groups) if row_groups is None else row_groups
    out = []
    for g in groups:
        rg = meta.row_group(g)
        for i in leaves:
            cc = rg.column(i)
            start = cc.data_page_offset
            if cc.has_dictionary_page and 0 < cc.dictionary_page_offset < start:
                start = cc.dictionary_page_offset
            out.append((start, cc.total_compressed_size))
    return out


def coalesce(
    ranges: Sequence[tuple[int, int]], gap: int = GAP_BYTES, piece: int = PIECE_BYTES
) -> list[tuple[int, int]]:
    """``ranges`` merged where they are less than ``gap`` apart, then cut into pieces of at
    most ``piece`` bytes (so that one long range is fetched on several threads)."""
    merged: list[list[int]] = []
    for start, length in sorted(ranges):
        if merged and start <= merged[-1][0] + merged[-1][1] + gap:
            end = max(merged[-1][0] + merged[-1][1], start + length)
            merged[-1][1] = end - merged[-1][0]
        else:
            merged.append([start, length])
    out = []
    for start, length in merged:
        for at in range(start, start + length, piece):
            out.append((at, min(piece, start + length - at)))
    return out


#: What to read of a file, decided from its footer: the columns and the row groups (None: all),
#: or None when nothing of it is to be read.
Select = Callable[[pq.FileMetaData], "tuple[Sequence[str], Sequence[int] | None] | None"]
#: The column paths to decode as Arrow dictionaries (pyarrow's ``read_dictionary``), decided
#: from the file's footer.
Dictionaries = Callable[[pq.FileMetaData], "Sequence[str] | None"]


def open_parquet(
    path: StoragePath,
    select: Select,
    *,
    footer: pq.FileMetaData | None = None,
    dictionaries: Dictionaries | None = None,
    checksum: str | None = None,
) -> pq.ParquetFile | None:
    """``path`` opened with every page check (``READ_OPTIONS``) to read what ``select`` asks
    for once it has seen the footer; None when it asks for nothing. On object storage those
    column chunks are fetched first, in parallel (see the module's docstring); ``footer``, if
    known, saves a request. On a local disk the file is opened as pyarrow opens it, and the
    caller decides from its footer what to read (``select`` only tells whether the file is
    read for most of its bytes: then, ``checksum`` given, it is checked whole, see the
    module's docstring). ``dictionaries``, if given, names the columns to read as
    dictionaries."""
    local = path.local
    if local is not None:
        if dictionaries is None and checksum is None:
            return pq.ParquetFile(path.fs_path, filesystem=path.fs, metadata=footer, **READ_OPTIONS)  # type: ignore[arg-type]
        meta = footer if footer is not None else pq.read_metadata(path.fs_path, filesystem=path.fs)
        as_dictionaries = dictionaries(meta) if dictionaries is not None else None
        image = _mapped_if_intact(local, checksum, meta, select) if checksum is not None else None
        if image is not None:
            return pq.ParquetFile(
                pa.BufferReader(pa.py_buffer(image)),
                metadata=meta,
                pre_buffer=False,
                read_dictionary=as_dictionaries,
                page_checksum_verification=False,  # every byte was checked whole
            )
        return pq.ParquetFile(
            path.fs_path,
            filesystem=path.fs,
            metadata=meta,
            read_dictionary=as_dictionaries,
            **READ_OPTIONS,  # type: ignore[arg-type]
        )
    with path.open() as source:
        meta = footer if footer is not None else pq.read_metadata(source)
        chosen = select(meta)
        if chosen is None:
            return None
        as_dictionaries = dictionaries(meta) if dictionaries is not None else None
        ranges = coalesce(chunk_ranges(meta, *chosen))
        if sum(n for _, n in ranges) > MAX_PREFETCH_BYTES:
            return pq.ParquetFile(
                path.fs_path,
                filesystem=path.fs,
                metadata=meta,
                read_dictionary=as_dictionaries,
                **READ_OPTIONS,  # type: ignore[arg-type]
            )
        image = mmap.mmap(-1, source.size())  # the reader is given the footer: not fetched

        def fetch(at: int, n: int) -> None:
            image[at : at + n] = source.read_at(n, at)

        # Every fetch ends before the source closes.
        _results([_fetchers().submit(fetch, at, n) for at, n in ranges])
    return pq.ParquetFile(
        pa.BufferReader(pa.py_buffer(image)),
        metadata=meta,
        pre_buffer=False,
        read_dictionary=as_dictionaries,
        **READ_OPTIONS,  # type: ignore[arg-type]
    )


def _mapped_if_intact(
    path: os.PathLike[str], checksum: str, meta: pq.FileMetaData, select: Select
) -> mmap.mmap | None:
    """The local file at ``path`` mapped into memory, when what ``select`` reads of it covers
    at least :data:`WHOLE_FILE_SHARE` of its bytes and its CRC32C is ``checksum``; else None
    (and on a file system that maps no files, or where this process has no CRC32C library:
    a cluster's executors may have only pyarrow, numpy and pandas)."""
    chosen = select(meta)
    if chosen is None:
        return None
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if not size or sum(n for _, n in chunk_ranges(meta, *chosen)) < WHOLE_FILE_SHARE * size:
                return None
            # Populated: the kernel maps the page cache's pages in one go, not a fault each.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            image = mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)
    except OSError:
        return None
    try:
        with memoryview(image) as view:
            intact = crc32c_bytes(view) == checksum
    except ImportError:
        intact = False
    if not intact:
        image.close()
        return None
    return image


def opening(
    path: StoragePath,
    select: Select,
    *,
    footer: pq.FileMetaData | None = None,
    dictionaries: Dictionaries | None = None,
    checksum: str | None = None,
) -> Future[pq.ParquetFile | None]:
    """:func:`open_parquet` on a thread of its own: a reader of several files in turn opens
    (fetches) the next ones while it decodes this one."""
    return _openers().submit(
        open_parquet, path, select, footer=footer, dictionaries=dictionaries, checksum=checksum
    )


def each(fn: Callable[[U], T], items: Sequence[U], *, at_once: bool = True) -> list[T]:
    """``fn`` of each of ``items``, in ``items``' order. ``at_once`` (for requests to object
    storage): all at once on the openers' threads, waiting for every one, then raising the
    first error in order; else one after another here (reads of a local disk, from the page
    cache). (Not for ``fn`` that itself runs on the openers' threads: it would wait for itself.)"""
    if not at_once:
        return [fn(item) for item in items]
    return _results([_openers().submit(fn, item) for item in items])


def _results(running: list[Future[T]]) -> list[T]:
    """The results of ``running``, once every one has ended (none left running behind an
    error); the first error in their order, if any."""
    wait(running)
    return [r.result() for r in running]
