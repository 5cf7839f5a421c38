"""The write-ahead file of one open ledger: append, make durable, read back, recover.

The byte layout is in :mod:`ledger.format`. This module adds the rules around it:

* Entry ids are the frame's position in the file: 0, 1, 2, ... with no gaps.
* An entry is readable (counted in :attr:`WriteAheadLog.entries`) only once acknowledged:
  under the ``"always"`` policy once an fsync covered its frame, under ``"interval"`` and
  ``"never"`` as soon as it is written. Readers never see an entry a crash could take back
  under the policy the operator chose.
* Appends from many threads are serialised by one lock (the file's byte order is the entry
  order); fsyncs are group-committed: one thread fsyncs on behalf of every waiting thread,
  and appends go on while it does.
* On open, recovery keeps every whole record with a good CRC and the next entry id, and
  cuts the file at the first bad one. The cut bytes are kept in a quarantine file next to
  the log, never simply thrown away.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, get_args

from ledger import format as fmt
from ledger.batches import SMALL_READ, appended_table, small_batch_entries
from ledger.entry import Appended, BatchEntry, Entry, LedgerItem, StoredBatch, record_size
from ledger.files import (
    O_CLOEXEC,
    QUARANTINE_SUFFIX,
    TMP_SUFFIX,
    fsync_dir,
    pread_exact,
    pwrite_all,
    pwritev_all,
)
from ledger.format import CorruptRecordError
from ledger.schema import table_to_entries

__all__ = [
    "CorruptRecordError",
    "FrameIndex",
    "FramedEntries",
    "FsyncPolicy",
    "LedgerClosedError",
    "Recovery",
    "WalFailedError",
    "WriteAheadLog",
    "check_frame",
    "encode_appended",
]

log = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "interval", "never"]
_POLICIES: tuple[str, ...] = get_args(FsyncPolicy)

_COPY_CHUNK = 1 << 20
# Batches an open ledger keeps as sent for the consumers that follow it (``stored_batch``).
RECENT_BATCHES = 1024
# fdatasync also flushes the file size, which is all an append changes besides data; it
# skips the mtime update a full fsync would force.
_datasync = getattr(os, "fdatasync", os.fsync)

# Called with the seconds of every group-commit fsync (the service's WAL fsync latency
# histogram); a hook, so that the ledger package knows nothing of metrics.
fsync_observer: Callable[[float], None] | None = None


class LedgerClosedError(RuntimeError):
    """The write-ahead log was closed: the ledger takes no more entries."""


class WalFailedError(LedgerClosedError):
    """An fsync (or an unrecoverable write) failed; the log takes no more entries.

    After a failed fsync the kernel may have dropped the dirty pages, so a retry could
    "succeed" without the data being on disk. The only safe course is to stop using the
    file: the owner rolls over to a new ledger, and recovery decides on the next open.
    """


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :meth:`WriteAheadLog.open` found and did.

    ``entries`` whole records were kept. If the file had a bad tail, ``truncated_bytes`` bytes
    from ``truncated_at`` to the old end were moved to ``quarantine_path`` (``reason`` says why
    the first one was rejected).
    """

    entries: int
    truncated_bytes: int = 0
    quarantine_path: Path | None = None
    truncated_at: int | None = None
    reason: str | None = None
    created: bool = False
    header_rewritten: bool = False


class FramedEntries:
    """The in-memory index of an open ledger's frames, whichever log holds their bytes (this
    module's file, or :mod:`ledger.object_wal`'s memory): what its readers and its roll-over
    ask of it, and the decoding of a run of frames.

    A frame holds one entry, or a whole Pulsar batch (entries ``E .. E+n-1``). The index is by
    entry all the same, so that every question about entries is one array look-up; a batch's
    entries are added in C (a one-item array repeated), never one Python step per member.

    Invariants, all under ``_cond``: ``entries <= written_entries``; both are at frame
    boundaries; ``_bounds[i]`` is where the frame holding entry ``i`` starts and
    ``_bounds[written]`` where the last one ends; ``_ends[i]`` is where the frame holding entry
    ``i`` ends; ``_cum_sizes[i]`` is the payload size (record_size) of entries ``[0, i)`` (a
    batch's whole size counted at its last entry); ``_publish_times[i]`` is entry ``i``'s,
    stamped in append order.
    """

    def __init__(self, ledger_id: int, index: FrameIndex) -> None:
        self._ledger_id = ledger_id
        # Guards the index, and wakes the log's waiters.
        self._cond = threading.Condition(threading.Lock())
        self._index = index
        self._bounds = index.bounds
        self._ends = index.ends
        self._cum_sizes = index.cum_sizes
        self._publish_times = index.publish_times
        self._written = index.entries
        self._entries = self._written
        # The batches appended last, by first entry, as their producers sent them: a consumer
        # that follows the log receives them so (``stored_batch``), not rebuilt from members.
        self._recent: dict[int, StoredBatch] = {}

    def stored_batch(self, first_entry: int) -> StoredBatch | None:
        """The batch whose first entry is ``first_entry``, as stored, if it is readable and
        among the last :data:`RECENT_BATCHES` appended."""
        with self._cond:
            if first_entry >= self._entries:
                return None
            return self._recent.get(first_entry)

    def _index_frames(
        self, offset: int, bodies: Sequence[bytes], sizes: Sequence[int], items: Sequence[Appended]
    ) -> int:
        """Count the frames of ``bodies`` written from ``offset`` on as entries; returns where
        they end. The caller holds ``_cond``."""
        end = offset
        index, recent = self._index, self._recent
        for body, size, item in zip(bodies, sizes, items, strict=True):
            end += fmt.FRAME_HEADER_SIZE + len(body)
            if type(item) is StoredBatch:
                recent[self._written] = item
                if len(recent) > RECENT_BATCHES:
                    del recent[next(iter(recent))]
                index.add(end, item.count, size, item.publish_time)
                self._written += item.count
            else:
                index.add(end, 1, size, item.publish_time)
                self._written += 1
        return end

    def _span(self, start: int, stop: int) -> tuple[int, int, int]:
        """``(first, lo, hi)`` of the frames holding entries ``start..stop-1``: the first entry
        of the first of them, where they start and where they end. The caller holds ``_cond``."""
        lo = self._bounds[start]
        first = start if not start or self._bounds[start - 1] != lo else bisect.bisect_left(self._bounds, lo)
        return first, lo, self._ends[stop - 1]

    def _decode_frames(
        self, data: bytes, base: int, first: int, start: int, stop: int, where: Path | str
    ) -> list[Entry]:
        """Entries ``start..stop-1`` from their frames ``data`` (found at ``base`` of ``where``;
        the first frame's first entry is ``first``), each frame checked again (CRC, entry id):
        ``CorruptRecordError`` for the first bad one. Batches among them are decoded together,
        in one walk (a table per small batch would cost most of the read)."""
        items = self._decode_appended(data, base, first, stop, where)
        if all(type(i) is Entry for i in items):
            return items[start - first : stop - first]  # type: ignore[return-value]
        if stop - first < SMALL_READ:
            entries: list[Entry] = []
            at = first
            for i in items:
                if type(i) is StoredBatch:
                    entries += small_batch_entries(self._ledger_id, at, i)
                    at += i.count
                else:
                    entries.append(i)  # type: ignore[arg-type]
                    at += 1
            return entries[start - first : stop - first]
        rows = appended_table(self._ledger_id, items, first).slice(start - first, stop - start)
        return table_to_entries(rows)

    def _decode_appended(
        self, data: bytes, base: int, first: int, stop: int, where: Path | str
    ) -> list[Appended]:
        """Whole frames ``data`` (entries ``first..stop-1``) as they were appended: an entry per
        message frame, a :class:`StoredBatch` per batch frame (sealing decodes those in bulk)."""
        view = memoryview(data)
        out: list[Appended] = []
        pos = 0
        entry_id = first
        while entry_id < stop:
            length, crc = fmt.decode_frame_header(view, pos)
            real = length & ~fmt.BATCH_FRAME
            body = view[pos + fmt.FRAME_HEADER_SIZE : pos + fmt.FRAME_HEADER_SIZE + real]
            checked = check_frame(body, length, crc, self._ledger_id, entry_id)
            if isinstance(checked, str):
                raise CorruptRecordError(where, base + pos, checked)
            out.append(checked)  # type: ignore[arg-type]
            entry_id += checked.count if type(checked) is StoredBatch else 1
            pos += fmt.FRAME_HEADER_SIZE + real
        return out

    # ------------------------------------------------------------------ reading

    def read(self, start_entry: int, max_entries: int) -> list[Entry]:
        """Up to ``max_entries`` readable entries from ``start_entry`` on, in order.

        An empty list when ``start_entry`` is at or past :attr:`entries`. Safe to call while
        other threads append: it reads from offsets kept in memory. Frames are checked again
        (CRC, entry id), so damage since they were written raises :class:`CorruptRecordError`.
        """
        found = self._range(start_entry, max_entries)
        if found is None:
            return []
        first, stop, lo, hi = found
        return self._decode_frames(self._frame_bytes(lo, hi), lo, first, start_entry, stop, self._where)

    def _range(self, start_entry: int, max_entries: int) -> tuple[int, int, int, int] | None:
        """``(first, stop, lo, hi)`` of a read of up to ``max_entries`` readable entries from
        ``start_entry``: the first entry of the first frame it touches, the entry it stops
        before, and where its frames start and end (None when there is nothing to read)."""
        if start_entry < 0 or max_entries < 0:
            raise ValueError(f"bad read range: start {start_entry}, max {max_entries}")
        with self._cond:
            stop = min(self._entries, start_entry + max_entries)
            if start_entry >= stop:
                return None
            first, lo, hi = self._span(start_entry, stop)
        return first, stop, lo, hi

    def read_batches(self, start_entry: int, max_entries: int) -> list[LedgerItem]:
        """What :meth:`read` reads from ``start_entry`` on, a batch whole (a
        :class:`BatchEntry`, as its producer sent it) wherever the read holds its first
        entry: a batch the limit cuts is given whole, so the read may cover more than
        ``max_entries`` entries. Members of a batch begun before ``start_entry`` come as
        entries. No object per member of a whole batch."""
        found = self._range(start_entry, max_entries)
        if found is None:
            return []
        first, stop, lo, hi = found
        items = self._decode_appended(self._frame_bytes(lo, hi), lo, first, stop, self._where)
        out: list[LedgerItem] = []
        at = first
        lid = self._ledger_id
        for item in items:
            if type(item) is StoredBatch:
                if at >= start_entry:
                    out.append(BatchEntry(lid, at, item))
                else:  # begun before the read: its members from start_entry on
                    out += small_batch_entries(lid, at, item)[start_entry - at :]
                at += item.count
            else:
                if at >= start_entry:
                    out.append(item)  # type: ignore[arg-type]
                at += 1
        return out

    def read_all(self) -> list[Entry]:
        """Every readable entry, in order."""
        return self.read(0, self.entries)

    def read_appended(self) -> list[Appended]:
        """Every readable entry, as appended: entries, and whole batches (what sealing writes)."""
        with self._cond:
            stop = self._entries
            if not stop:
                return []
            lo, hi = self._bounds[0], self._bounds[stop]
        return self._decode_appended(self._frame_bytes(lo, hi), lo, 0, stop, self._where)

    def _frame_bytes(self, lo: int, hi: int) -> bytes:
        """Bytes ``lo..hi`` of where the frames are kept (the log's own)."""
        raise NotImplementedError

    @property
    def _where(self) -> Path | str:
        """Where the frames are, as a corruption error names it."""
        raise NotImplementedError

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def entries(self) -> int:
        """Number of acknowledged, readable entries; also the id of the next one to become readable."""
        with self._cond:
            return self._entries

    @property
    def written_entries(self) -> int:
        """Number of entries written, acknowledged or not; the next entry id."""
        with self._cond:
            return self._written

    @property
    def size_bytes(self) -> int:
        """Payload bytes (:func:`ledger.entry.record_size`) of the readable entries."""
        with self._cond:
            return self._cum_sizes[self._entries]

    @property
    def written_size_bytes(self) -> int:
        """Payload bytes of every written entry, acknowledged or not; what roll-over by size counts."""
        with self._cond:
            return self._cum_sizes[self._written]

    @property
    def first_publish_time(self) -> int | None:
        """Publish time of entry 0 if it is readable; for roll-over by age."""
        with self._cond:
            return self._publish_times[0] if self._entries else None

    @property
    def last_publish_time(self) -> int | None:
        """Publish time of the last readable entry."""
        with self._cond:
            return self._publish_times[self._entries - 1] if self._entries else None

    def first_entry_at_or_after(self, publish_time: int) -> int:
        """Id of the first readable entry published at or after ``publish_time`` (``entries``
        if none is). Publish times are stamped in append order, so they do not decrease."""
        with self._cond:
            return bisect.bisect_left(self._publish_times, publish_time, 0, self._entries)


class WriteAheadLog(FramedEntries):
    """The append-only file of one open ledger. Thread-safe.

    Create or recover one with :meth:`open`. Invariants:

    * ``entries <= written_entries``; entries ``[0, entries)`` are readable and (under
      ``"always"``) durable.
    * The file holds exactly the header and the frames of ``written_entries`` entries
      (``file_bytes`` long).
    * Once :meth:`close` has returned, every written entry is durable and readable.
    """

    def __init__(
        self,
        path: Path,
        ledger_id: int,
        fd: int,
        policy: FsyncPolicy,
        fsync_interval_ms: int,
        recovery: Recovery,
        index: FrameIndex,
    ) -> None:
        """Use :meth:`open`; this only assembles a log whose file was already checked."""
        super().__init__(ledger_id, index)
        self._path = path
        self._fd = fd
        self._policy: FsyncPolicy = policy
        self._interval_s = fsync_interval_ms / 1000.0
        self.recovery = recovery
        """What opening the file found (see :class:`Recovery`)."""
        self.fsync_count = 0
        """fsyncs of the log issued since open (group commits, the interval flusher, close)."""

        # Serialises writers so the byte order in the file is the entry order.
        self._write_lock = threading.Lock()
        # ``_cond`` (the base's) guards all the state below too, and wakes sync() waiters and
        # close(). Lock order: _write_lock before _cond, never the other way round.
        # bounds[written] is the end of the file.
        self._write_end = index.bounds[-1]
        self._durable_end = self._write_end
        self._syncing = False  # one thread at a time holds the fsync "baton"
        self._closing = False  # set under _write_lock: no append may start after it
        self._closed = False
        self._failure: BaseException | None = None
        self._active_reads = 0  # preads on self._fd in flight; close waits for them

        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if policy == "interval":
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"wal-flush-{ledger_id}", daemon=True
            )
            self._flusher.start()

    # ------------------------------------------------------------------ open / recovery

    @classmethod
    def open(
        cls,
        path: Path,
        ledger_id: int,
        *,
        fsync: FsyncPolicy = "always",
        fsync_interval_ms: int = 100,
    ) -> WriteAheadLog:
        """Open ledger ``ledger_id``'s write-ahead file at ``path``, creating it if missing.

        A new file is written under a temporary name with its header, fsynced, renamed into
        place and the directory fsynced. An existing file is recovered: see the module
        docstring; what happened is in :attr:`recovery`. A file shorter than the header (a
        crash right after creating it) has its header rewritten, provided its bytes are a
        prefix of that header or zeros. A header with the wrong magic or another ledger's id
        raises :class:`CorruptRecordError`: that is not a torn write, and the file is left
        untouched for an operator. The directory must exist.
        """
        if fsync not in _POLICIES:
            raise ValueError(f"fsync policy must be one of {_POLICIES}, not {fsync!r}")
        if fsync == "interval" and fsync_interval_ms <= 0:
            raise ValueError(f"fsync_interval_ms must be positive, not {fsync_interval_ms}")
        path = Path(path)
        header = fmt.encode_header(ledger_id)
        created = header_rewritten = False
        if not path.exists():
            _create_file(path, header)
            created = True

        fd = os.open(path, os.O_RDWR | O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size < fmt.HEADER_SIZE:
                torn = pread_exact(fd, size, 0)
                if not (header.startswith(torn) or torn.count(0) == len(torn)):
                    raise CorruptRecordError(
                        path, 0, f"file is {size} bytes, shorter than a header, and not a torn header"
                    )
                os.close(fd)
                fd = -1
                log.warning("%s: torn file header (%d bytes), rewriting it", path, size)
                _create_file(path, header)
                header_rewritten = True
                fd = os.open(path, os.O_RDWR | O_CLOEXEC)
                size = fmt.HEADER_SIZE
            found_id = fmt.decode_header(pread_exact(fd, fmt.HEADER_SIZE, 0), path)
            if found_id != ledger_id:
                raise CorruptRecordError(
                    path, len(fmt.MAGIC), f"file belongs to ledger {found_id}, expected ledger {ledger_id}"
                )

            scan = _scan(fd, path, ledger_id, size)
            quarantine: Path | None = None
            good_end = scan.index.bounds[-1]
            if scan.reason is not None:
                quarantine = _quarantine(fd, path, good_end, size)
                os.ftruncate(fd, good_end)
                log.warning(
                    "%s: bad record at offset %d (%s); kept %d entries, moved %d bytes to %s",
                    path,
                    good_end,
                    scan.reason,
                    scan.index.entries,
                    size - good_end,
                    quarantine,
                )
            # Entries found on open count as acknowledged, but a previous process running
            # under "never" may have left them in the page cache only.
            os.fsync(fd)
            recovery = Recovery(
                entries=scan.index.entries,
                truncated_bytes=size - good_end if scan.reason is not None else 0,
                quarantine_path=quarantine,
                truncated_at=good_end if scan.reason is not None else None,
                reason=scan.reason,
                created=created,
                header_rewritten=header_rewritten,
            )
            return cls(
                path,
                ledger_id,
                fd,
                fsync,
                fsync_interval_ms,
                recovery,
                scan.index,
            )
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise

    # ------------------------------------------------------------------ writing

    def append(self, records: Sequence[Appended], sizes: Sequence[int] | None = None) -> tuple[int, int]:
        """Write ``records`` (messages, and whole Pulsar batches: one frame each) as consecutive
        entries; return ``(first_entry_id, token)``.

        They go to the file in one write. The entries are not acknowledged yet: pass
        ``token`` to :meth:`sync` before replying to a producer. Raises
        :class:`LedgerClosedError` after :meth:`close`, ``ValueError`` for a record the format
        cannot hold (then nothing of the batch is written).
        """
        # Encoding is the costly part and needs no ids: do it before taking the lock.
        bodies, counts, sizes = encode_appended(records, sizes)
        with self._write_lock:
            self._check_writable()
            first = self._written
            if not bodies:
                return first, self._write_end
            offset = self._write_end
            try:
                if sum(map(len, bodies)) >= _GATHER_MIN_BODY * len(bodies):
                    # Large bodies (Pulsar batches): gathered, each written where it lies.
                    pwritev_all(self._fd, fmt.frame_parts(first, bodies, counts)[0], offset)
                else:
                    # Many small ones (REST's records, messages sent alone): three buffers a
                    # frame cost more in the gathered write than one copy (1,000 records of
                    # 140 bytes: 1.17 ms gathered, 0.61 ms copied).
                    pwrite_all(self._fd, fmt.encode_frames(first, bodies, counts), offset)
            except OSError as e:
                # Drop the partial batch so the file again ends at the last whole frame.
                try:
                    os.ftruncate(self._fd, offset)
                except OSError:
                    with self._cond:
                        self._failure = self._failure or e
                        self._cond.notify_all()
                raise
            with self._cond:
                end = self._write_end = self._index_frames(offset, bodies, sizes, records)
                if self._policy != "always":
                    self._entries = self._written
            return first, end

    def sync(self, token: int) -> None:
        """Block until the data up to ``token`` (from :meth:`append`) is acknowledged.

        ``"always"``: returns once an fsync covered ``token``. If another thread's fsync
        already did, at once; if one is in progress, waits for it; otherwise this thread
        fsyncs everything written so far, for itself and every thread waiting behind it.
        ``"interval"`` and ``"never"``: returns at once. Raises :class:`WalFailedError` if an
        fsync failed.
        """
        if self._policy != "always":
            self._raise_if_failed()
            return
        with self._cond:
            if token > self._write_end:
                raise ValueError(f"token {token} is beyond the end of the log ({self._write_end})")
            while True:
                if self._durable_end >= token:
                    return
                self._raise_if_failed()
                if not self._syncing:
                    break
                self._cond.wait()
            self._syncing = True
            end, n = self._write_end, self._written
        self._fsync_as_leader(end, n)

    def append_and_sync(self, records: Sequence[Appended]) -> int:
        """Append ``records`` and wait until they are acknowledged; return the first entry id."""
        first, token = self.append(records)
        self.sync(token)
        return first

    def close(self) -> None:
        """fsync (whatever the policy), stop the flusher and close the file. Idempotent.

        Threads blocked in :meth:`sync` are released: their data is durable after the final
        fsync. Appends after this raise :class:`LedgerClosedError`; reads still work (they
        open the file for themselves) until the file is removed.
        """
        with self._write_lock:
            already = self._closing
            self._closing = True
        if already:
            with self._cond:
                while not self._closed:
                    self._cond.wait()
            return
        if self._flusher is not None:
            self._stop.set()
            self._flusher.join()
        with self._cond:
            while self._syncing:
                self._cond.wait()
            self._syncing = True
            end, n = self._write_end, self._written
        error: BaseException | None = None
        try:
            if self._failure is None:
                os.fsync(self._fd)
                self.fsync_count += 1
        except BaseException as e:
            # Close the file and release the waiters whatever happened, but claim nothing.
            error = e
        with self._cond:
            # Reads from now on open the file themselves; wait for the ones using our fd, so
            # it is not closed (and its number reused) under them.
            fd, self._fd = self._fd, -1
            while self._active_reads:
                self._cond.wait()
            os.close(fd)
            self._syncing = False
            self._closed = True
            if error is not None:
                self._failure = self._failure or error
            if self._failure is None:
                self._durable_end = end
                self._entries = n
            self._cond.notify_all()
        if isinstance(error, OSError):
            raise WalFailedError(f"{self._path}: final fsync failed: {error}") from error
        if error is not None:
            raise error

    def flush(self) -> None:
        """Nothing to do here: :meth:`close` makes every written entry durable (the object
        write-ahead log's ``flush`` is where a roll-over waits for its store)."""

    def discard(self) -> None:
        """Close and remove the file: its ledger is sealed (or its topic gone)."""
        self.close()
        self._path.unlink(missing_ok=True)
        fsync_dir(self._path.parent)

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_writable(self) -> None:
        if self._closing:
            raise LedgerClosedError(f"{self._path}: ledger {self._ledger_id} is closed")
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        failure = self._failure
        if failure is not None:
            raise WalFailedError(
                f"{self._path}: write-ahead log unusable after an I/O error: {failure}"
            ) from failure

    def _fsync_as_leader(self, end: int, n: int) -> None:
        """fsync, then acknowledge the ``n`` entries ending at ``end``. Caller holds the baton.

        ``end, n`` were read when the baton was taken: everything written by then is in the
        page cache, so this fsync covers it. Later writes wait for the next leader.
        """
        error: BaseException | None = None
        try:
            t0 = time.perf_counter()
            _datasync(self._fd)
            if fsync_observer is not None:
                fsync_observer(time.perf_counter() - t0)
        except BaseException as e:
            # Whatever went wrong, the baton must be handed back or every waiter hangs.
            error = e
        with self._cond:
            self.fsync_count += 1
            self._syncing = False
            if error is None:
                self._durable_end = max(self._durable_end, end)
                self._entries = max(self._entries, n)
            elif isinstance(error, OSError):
                self._failure = self._failure or error
            self._cond.notify_all()
        if isinstance(error, OSError):
            raise WalFailedError(f"{self._path}: fsync failed: {error}") from error
        if error is not None:
            raise error

    def _flush_loop(self) -> None:
        """The ``"interval"`` policy: fsync what was written, every ``fsync_interval_ms``."""
        while not self._stop.wait(self._interval_s):
            with self._cond:
                if self._durable_end >= self._write_end:
                    continue
                while self._syncing:
                    self._cond.wait()
                if self._closing or self._failure is not None:
                    return
                self._syncing = True
                end, n = self._write_end, self._written
            try:
                self._fsync_as_leader(end, n)
            except WalFailedError:
                log.exception("%s: background fsync failed; the log takes no more entries", self._path)
                return

    # ------------------------------------------------------------------ reading

    def _pread(self, lo: int, hi: int) -> bytes:
        """Bytes ``lo..hi`` of the file, through its descriptor while it is open."""
        with self._cond:
            fd = self._fd
            if fd >= 0:
                self._active_reads += 1
        if fd < 0:
            fd = os.open(self._path, os.O_RDONLY | O_CLOEXEC)
            try:
                data = pread_exact(fd, hi - lo, lo)
            finally:
                os.close(fd)
        else:
            try:
                data = pread_exact(fd, hi - lo, lo)
            finally:
                with self._cond:
                    self._active_reads -= 1
                    if not self._active_reads:
                        self._cond.notify_all()
        if len(data) < hi - lo:
            raise CorruptRecordError(self._path, lo + len(data), "file ends before the entries it holds")
        return data

    def _frame_bytes(self, lo: int, hi: int) -> bytes:
        return self._pread(lo, hi)

    @property
    def _where(self) -> Path:
        return self._path

    # ------------------------------------------------------------------ state

    @property
    def path(self) -> Path:
        return self._path

    @property
    def fsync_policy(self) -> FsyncPolicy:
        return self._policy

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called (appends are refused)."""
        return self._closing

    @property
    def file_bytes(self) -> int:
        """Length of the file: header and every written frame."""
        with self._cond:
            return self._write_end

    def __repr__(self) -> str:
        return (
            f"WriteAheadLog({str(self._path)!r}, ledger_id={self._ledger_id}, fsync={self._policy!r}, "
            f"entries={self._entries}, written={self._written}, closed={self._closing})"
        )


# ---------------------------------------------------------------------- helpers


def _run(value: int, n: int) -> array[int]:
    """``n`` times ``value``, built in C (``extend(repeat(...))`` costs a Python step each)."""
    return array("q", (value,)) * n


@dataclass(slots=True)
class FrameIndex:
    """The per-entry arrays of :class:`FramedEntries` as a scan of frames builds them (recovery
    of a file here, of a ledger's chunks in :mod:`ledger.object_wal`)."""

    bounds: array[int]
    cum_sizes: array[int] = field(default_factory=lambda: array("q", [0]))
    publish_times: array[int] = field(default_factory=lambda: array("q"))
    ends: array[int] = field(default_factory=lambda: array("q"))

    @property
    def entries(self) -> int:
        return len(self.publish_times)

    def add(self, end: int, n: int, size: int, publish_time: int) -> None:
        """Count the frame that ends at ``end`` (it starts where the last one ended): ``n``
        entries of ``size`` payload bytes in all (counted at the last of them)."""
        start = self.bounds[-1]
        total = self.cum_sizes[-1]
        if n > 1:
            self.bounds.extend(_run(start, n - 1))
            self.cum_sizes.extend(_run(total, n - 1))
            self.publish_times.extend(_run(publish_time, n - 1))
            self.ends.extend(_run(end, n - 1))
        self.bounds.append(end)
        self.cum_sizes.append(total + size)
        self.publish_times.append(publish_time)
        self.ends.append(end)

    def add_checked(self, end: int, item: Entry | StoredBatch) -> None:
        """Count the frame that ends at ``end`` and holds ``item`` (from :func:`check_frame`)."""
        if isinstance(item, StoredBatch):
            self.add(end, item.count, item.size, item.publish_time)
        else:
            self.add(end, 1, item.size(), item.publish_time)


@dataclass(slots=True)
class _Scan:
    index: FrameIndex
    reason: str | None  # why the frame at bounds[-1] was rejected; None if the file ended cleanly


def _scan(fd: int, path: Path, ledger_id: int, size: int) -> _Scan:
    """Walk the frames after the header; stop at the end of the file or the first bad frame."""
    index = FrameIndex(array("q", [fmt.HEADER_SIZE]))
    offset = fmt.HEADER_SIZE
    reason: str | None = None
    with open(fd, "rb", buffering=_COPY_CHUNK, closefd=False) as f:
        f.seek(offset)
        while offset < size:
            head = f.read(fmt.FRAME_HEADER_SIZE)
            if len(head) < fmt.FRAME_HEADER_SIZE:
                reason = f"torn frame header ({len(head)} of {fmt.FRAME_HEADER_SIZE} bytes)"
                break
            length, crc = fmt.decode_frame_header(head)
            real = length & ~fmt.BATCH_FRAME
            if not fmt.body_length_is_sane(real):
                reason = f"implausible frame length {length}"
                break
            if offset + fmt.FRAME_HEADER_SIZE + real > size:
                reason = f"frame of {real} bytes runs past the end of the file ({size})"
                break
            body = f.read(real)
            checked = check_frame(body, length, crc, ledger_id, index.entries)
            if isinstance(checked, str):
                reason = checked
                break
            offset += fmt.FRAME_HEADER_SIZE + real
            index.add_checked(offset, checked)
    return _Scan(index, reason)


def check_frame(
    body: fmt.Buffer, length: int, crc: int, ledger_id: int, entry_id: int
) -> Entry | StoredBatch | str:
    """What a frame holds (an entry, or a batch whose first entry is ``entry_id``), or why it
    is bad (also used by :mod:`ledger.object_wal`). ``length`` is the frame header's field,
    batch bit included."""
    real = length & ~fmt.BATCH_FRAME
    if len(body) != real:
        return f"frame body is {len(body)} bytes, header says {real}"
    if fmt.body_crc(body) != crc:
        return "CRC mismatch"
    try:
        if length & fmt.BATCH_FRAME:
            first, batch = fmt.decode_batch_body(body)
            if first != entry_id:
                return f"entry id {first} where {entry_id} was expected"
            return batch
        entry = fmt.decode_body(body, ledger_id)
    except fmt.MalformedBodyError as e:
        return f"undecodable record: {e}"
    if entry.entry_id != entry_id:
        return f"entry id {entry.entry_id} where {entry_id} was expected"
    return entry


def encode_appended(
    items: Sequence[Appended], sizes: Sequence[int] | None = None
) -> tuple[list[bytes], list[int], Sequence[int]]:
    """The frame bodies of ``items`` (entry ids left for :func:`ledger.format.encode_frames`),
    each one's entry count for it (0: a message), and each one's payload size."""
    bodies: list[bytes] = []
    counts: list[int] = []
    for item in items:
        if type(item) is StoredBatch:
            bodies.append(fmt.encode_batch_body(0, item))
            counts.append(item.count)
        else:
            bodies.append(fmt.encode_body(0, item))  # type: ignore[arg-type]
            counts.append(0)
    if sizes is None:
        sizes = [
            i.size if type(i) is StoredBatch else record_size(i.key, i.value, i.properties)  # type: ignore[union-attr]
            for i in items
        ]
    return bodies, counts, sizes


def _create_file(path: Path, header: bytes) -> None:
    """Put a file holding only ``header`` at ``path``, crash-safely (tmp, fsync, rename)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o644)
    try:
        pwrite_all(fd, header, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _quarantine(fd: int, path: Path, start: int, end: int) -> Path:
    """Copy bytes ``[start, end)`` of the log into a new quarantine file; return its path."""
    target = path.with_name(f"{path.name}{QUARANTINE_SUFFIX}-{time.time_ns()}")
    tmp = target.with_name(target.name + TMP_SUFFIX)
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o644)
    try:
        pos = start
        while pos < end:
            chunk = os.pread(fd, min(_COPY_CHUNK, end - pos), pos)
            if not chunk:
                break
            pwrite_all(out, chunk, pos - start)
            pos += len(chunk)
        os.fsync(out)
    finally:
        os.close(out)
    os.replace(tmp, target)
    # The quarantine file must be durable before the log is truncated, or a crash in between
    # could lose the bytes in both places.
    fsync_dir(path.parent)
    return target


# Bodies of at least this many bytes on average are written gathered (``os.pwritev``), smaller
# ones copied into one buffer first.
_GATHER_MIN_BODY = 2048
