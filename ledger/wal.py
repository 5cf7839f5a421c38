"""The write-ahead file of one open ledger: append, make durable, read back.

The byte layout is in :mod:`ledger.format`, the index and the reading of its frames in
:mod:`ledger.framed_entries`, what opening an existing file recovers in
:mod:`ledger.wal_recovery`. This module adds the rules around it:

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

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, get_args

from ledger import format as fmt
from ledger.entry import Appended
from ledger.files import O_CLOEXEC, fsync_dir, pread_exact, pwrite_all, pwritev_all
from ledger.format import CorruptRecordError
from ledger.framed_entries import FramedEntries, FrameIndex, encode_appended
from ledger.open_log import LedgerClosedError, Recovery
from ledger.wal_recovery import recover

__all__ = [
    "CorruptRecordError",
    "FsyncPolicy",
    "WalFailedError",
    "WriteAheadLog",
]

log = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "interval", "never"]
_POLICIES: tuple[str, ...] = get_args(FsyncPolicy)

# fdatasync also flushes the file size, which is all an append changes besides data; it
# skips the mtime update a full fsync would force.
_datasync = getattr(os, "fdatasync", os.fsync)

# Called with the seconds of every group-commit fsync (the service's WAL fsync latency
# histogram); a hook, so that the ledger package knows nothing of metrics.
fsync_observer: Callable[[float], None] | None = None


class WalFailedError(LedgerClosedError):
    """An fsync (or an unrecoverable write) failed; the log takes no more entries.

    After a failed fsync the kernel may have dropped the dirty pages, so a retry could
    "succeed" without the data being on disk. The only safe course is to stop using the
    file: the owner rolls over to a new ledger, and recovery decides on the next open.
    """


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

        # ``_cond`` (the base's) guards all the state below too, and wakes sync() waiters and
        # close(); ``_write_lock`` (the base's) serialises writers, so the byte order in the
        # file is the entry order. bounds[written] is the end of the file.
        self._write_end = index.bounds[-1]
        self._durable_end = self._write_end
        self._syncing = False  # one thread at a time holds the fsync "baton"
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

    # ------------------------------------------------------------------ open

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
        place and the directory fsynced. An existing file is recovered
        (:mod:`ledger.wal_recovery`); what happened is in :attr:`recovery`. A file shorter than the header (a
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
        fd, recovery, index = recover(path, ledger_id)
        try:
            return cls(path, ledger_id, fd, fsync, fsync_interval_ms, recovery, index)
        except BaseException:
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
    def file_bytes(self) -> int:
        """Length of the file: header and every written frame."""
        with self._cond:
            return self._write_end

    def __repr__(self) -> str:
        return (
            f"WriteAheadLog({str(self._path)!r}, ledger_id={self._ledger_id}, fsync={self._policy!r}, "
            f"entries={self._entries}, written={self._written}, closed={self._closing})"
        )


# Bodies of at least this many bytes on average are written gathered (``os.pwritev``), smaller
# ones copied into one buffer first.
_GATHER_MIN_BODY = 2048
