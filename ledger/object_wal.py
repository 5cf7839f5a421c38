"""The write-ahead log of open ledgers on object storage (``COMPACTOR_WAL=object``).

No local disk: every open ledger of a process keeps its frames (the byte layout of
:mod:`ledger.format`, without the file header) in memory, and one :class:`GroupCommitter`
stores what the ledgers appended since its last flush as one object every ``flush_ms`` (or
sooner, once ``flush_bytes`` wait), under a key no other flush uses. An entry is acknowledged
(readable, and its producer answered) once the object is stored *and* the service's commit
callback has recorded where each ledger's frames are in it (its index: a chunk per ledger per
object, in the metadata database). Recovery, on this instance or on another one that takes
the topic over, reads a ledger's chunks back (:meth:`ObjectLog.recover`).

Invariants:

* Entry ids are consecutive per ledger; the chunks of a ledger cover ``[0, entries)`` in
  order (a chunk recorded twice, after a commit whose answer was lost, overlaps the next one
  with the same bytes; recovery skips the overlap).
* A ledger's ``entries`` (what readers see) only grows when a flush holding its frames was
  committed, and flushes are taken and committed one at a time in append order across
  ledgers: a topic's next ledger never becomes readable before the tail of the one before.
* A flush that fails (the store or the database away) changes nothing: its frames stay
  pending and go with the next attempt, and the producers waiting on them get the error
  (their messages may still be stored by that attempt: at least once, as a timed-out produce
  in Kafka or Pulsar). A ledger the commit refuses (its owner was fenced off) takes no more
  entries.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from array import array
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ledger import format as fmt
from ledger.entry import Appended, StoredBatch
from ledger.format import CorruptRecordError
from ledger.framed_entries import FramedEntries, FrameIndex, check_frame, encode_appended
from ledger.open_log import LedgerClosedError, Recovery

if TYPE_CHECKING:
    from ledger.storage import Storage

__all__ = ["Chunk", "CommitChunks", "GroupCommitter", "ObjectLog"]

log = logging.getLogger(__name__)

# Ranges of a ledger's write-ahead objects read at once when it is recovered.
RECOVERY_READERS = 16
# A failed flush is tried again after this long, doubling up to the maximum.
RETRY_S = 0.05
RETRY_MAX_S = 2.0


@dataclass(frozen=True, slots=True)
class Chunk:
    """Where entries ``[first_entry, first_entry + entries)`` of a ledger are: ``length``
    bytes at ``offset`` of the object ``key`` (a key of the ledger storage)."""

    ledger_id: int
    first_entry: int
    entries: int
    key: str
    offset: int
    length: int


#: Records a flush's chunks, each with its log's ``owner`` (the service's fence), in one
#: transaction; returns the ledgers it refused, with why (their owner lost the topic). Raises
#: if nothing could be recorded.
CommitChunks = Callable[[Sequence[tuple[Chunk, Any]]], dict[int, BaseException]]

# Called with the seconds of every flush (object stored and chunks committed); a hook, so that
# the ledger package knows nothing of metrics.
flush_observer: Callable[[float], None] | None = None


class ObjectLog(FramedEntries):
    """The open ledger ``ledger_id`` of this process on object storage: the interface of
    :class:`ledger.wal.WriteAheadLog`, durability by its :class:`GroupCommitter`.

    Thread-safe. ``entries <= taken <= written``: entries below ``entries`` are durable, those
    up to ``taken`` are in a flush under way, the rest wait for the next one.
    """

    def __init__(
        self,
        ledger_id: int,
        committer: GroupCommitter,
        *,
        owner: Any = None,
        frames: bytearray | None = None,
        index: FrameIndex | None = None,
    ) -> None:
        """Use :meth:`GroupCommitter.create` or :meth:`GroupCommitter.recover`."""
        index = index if index is not None else FrameIndex(array("q", [0]))
        super().__init__(ledger_id, index)
        self._committer = committer
        self.owner = owner
        """What the commit callback checks before it records this ledger's chunks (a fence)."""
        self._buf = frames if frames is not None else bytearray()
        self._taken = self._written
        self._failure: BaseException | None = None  # for good: no more entries
        self._error: BaseException | None = None  # of the last flush attempt, cleared by the next good one
        self._attempts = 0  # flush attempts that held frames of this log and failed
        self.recovery = Recovery(entries=self._written)

    # ------------------------------------------------------------------ writing

    def append(self, records: Sequence[Appended], sizes: Sequence[int] | None = None) -> tuple[int, int]:
        """Add ``records`` (messages, and whole Pulsar batches: one frame each) as consecutive
        entries; return ``(first_entry_id, token)``; pass the token to :meth:`sync` before
        answering the producer."""
        bodies, counts, sizes = encode_appended(records, sizes)
        with self._write_lock:
            with self._cond:
                self._check_writable()
                first = self._written
                if not bodies:
                    return first, self._written
            data = fmt.encode_frames(first, bodies, counts)
            with self._cond:
                offset = len(self._buf)
                self._buf += data
                self._index_frames(offset, bodies, sizes, records)
                token = self._written
        self._committer.pending(self, len(data))
        return first, token

    def sync(self, token: int) -> None:
        """Block until the entries before ``token`` are durable; raises the error of a flush
        attempt that held them and failed (they go with the next attempt all the same), or
        the reason this log takes no more entries."""
        with self._cond:
            attempts = self._attempts
            while self._entries < token:
                if self._failure is not None:
                    raise self._failure
                if self._attempts != attempts and self._error is not None:
                    raise self._error
                self._cond.wait()

    def flush(self) -> None:
        """Block until every written entry is durable (a flush is asked for now)."""
        with self._cond:
            token = self._written
            durable = self._entries >= token
        if not durable:
            self._committer.urge()
            self.sync(token)

    def close(self) -> None:
        """Take no more entries and wait until those written are durable. Reads go on."""
        with self._write_lock, self._cond:
            self._closing = True
        self.flush()

    def discard(self) -> None:
        """Forget the frames (the ledger is sealed, or its topic gone); its chunks are the
        service's to delete."""
        with self._write_lock, self._cond:
            self._closing = True
            if self._failure is None:
                self._failure = LedgerClosedError(f"ledger {self._ledger_id} was discarded")
            self._cond.notify_all()
        self._committer.forget(self)

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise LedgerClosedError(f"ledger {self._ledger_id} is closed")

    # ------------------------------------------------------------------ the committer's side

    def _take(self) -> tuple[int, int, bytes] | None:
        """The frames a flush stores: ``(first entry, entries, bytes)`` (None if none wait)."""
        with self._cond:
            if self._failure is not None or self._taken >= self._written:
                return None
            first, stop = self._taken, self._written
            self._taken = stop
            return first, stop - first, bytes(memoryview(self._buf)[self._bounds[first] : self._bounds[stop]])

    def _committed(self, stop: int) -> None:
        with self._cond:
            self._entries = max(self._entries, stop)
            self._error = None
            self._cond.notify_all()

    def _flush_failed(self, error: BaseException) -> None:
        with self._cond:
            self._taken = self._entries
            self._error = error
            self._attempts += 1
            self._cond.notify_all()

    def _refused(self, error: BaseException) -> None:
        with self._cond:
            self._failure = self._failure or error
            self._cond.notify_all()

    def _waiting(self) -> bool:
        with self._cond:
            return self._failure is None and self._taken < self._written

    # ------------------------------------------------------------------ reading

    def _frame_bytes(self, lo: int, hi: int) -> bytes:
        # A bad frame here is memory gone bad: nothing a retry mends.
        with self._cond:
            return bytes(memoryview(self._buf)[lo:hi])

    @property
    def _where(self) -> str:
        return f"ledger {self._ledger_id} (in memory)"

    # ------------------------------------------------------------------ state

    @property
    def file_bytes(self) -> int:
        """Bytes of the frames written (what a write-ahead file would hold after its header)."""
        with self._cond:
            return self._bounds[self._written]

    def __repr__(self) -> str:
        return f"ObjectLog(ledger_id={self._ledger_id}, entries={self._entries}, written={self._written})"


class GroupCommitter:
    """Stores the pending frames of every open ledger of a process as one object per flush,
    then records its chunks through ``commit``. One thread; start with :meth:`start`.

    Objects are named ``{prefix}/{writer}/{sequence}.wal``: ``writer`` is new for every
    committer (set by :meth:`start`), so no two flushes (of this process or another, an old
    owner's included) ever write the same key. Flushes run one at a time, in sequence order;
    ``completed`` is the sequence of the last one that is over (committed or failed).
    """

    def __init__(
        self,
        storage: Storage,
        commit: CommitChunks,
        *,
        prefix: str = "wal",
        flush_ms: int = 100,
        flush_bytes: int = 8 << 20,
    ) -> None:
        self.storage = storage
        self._commit = commit
        self.prefix = prefix.strip("/")
        self.writer = uuid.uuid4().hex
        self.completed = 0
        self._flush_s = flush_ms / 1000
        self._flush_bytes = flush_bytes
        self._sequence = itertools.count(1)
        self._cond = threading.Condition(threading.Lock())
        # Logs with frames to store, in the order they first had some (a topic's next ledger
        # after the one before it): a flush takes them in this order.
        self._dirty: dict[int, ObjectLog] = {}
        self._pending_bytes = 0
        # When the last flush started: the next one starts ``flush_ms`` after it (at once if
        # that is past), so a flush every ``flush_ms`` under load, and no wait when idle.
        self._last_start = float("-inf")
        self._urgent = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.flushes = 0
        self.failures = 0

    # ------------------------------------------------------------------ logs

    def create(self, ledger_id: int, owner: Any = None) -> ObjectLog:
        """A new, empty ledger's log."""
        return ObjectLog(ledger_id, self, owner=owner)

    def recover(self, ledger_id: int, chunks: Iterable[Chunk], owner: Any = None) -> ObjectLog:
        """A ledger's log as its chunks (from the index, in entry order) hold it: every entry
        durable. Raises ``CorruptRecordError`` naming the object when a chunk is missing,
        out of order, or its bytes are not the frames it should hold."""
        buf = bytearray()
        index = FrameIndex(array("q", [0]))
        ordered = sorted(chunks, key=lambda c: c.first_entry)
        needed: list[Chunk] = []
        covered = 0
        for chunk in ordered:
            if chunk.first_entry > covered:
                raise CorruptRecordError(
                    self.storage.path(chunk.key),
                    chunk.offset,
                    f"ledger {ledger_id}: entries {covered}..{chunk.first_entry - 1} are in no object",
                )
            if chunk.first_entry + chunk.entries > covered:  # else recorded twice: skipped
                needed.append(chunk)
                covered = chunk.first_entry + chunk.entries
        # A ledger of a topic that gets a trickle of messages has a chunk per flush: its ranges
        # are read at once, not one round trip after another.
        with ThreadPoolExecutor(max_workers=RECOVERY_READERS, thread_name_prefix="wal-recovery") as pool:
            for chunk, data in zip(needed, pool.map(self._read_chunk, needed), strict=True):
                where = self.storage.path(chunk.key)
                _scan_chunk(data, chunk, ledger_id, where, buf, index)
        return ObjectLog(ledger_id, self, owner=owner, frames=buf, index=index)

    def _read_chunk(self, chunk: Chunk) -> bytes:
        try:
            with self.storage.open(chunk.key) as f:
                return f.read_at(chunk.length, chunk.offset)  # type: ignore[no-any-return]
        except FileNotFoundError:
            raise CorruptRecordError(
                self.storage.path(chunk.key), 0, f"ledger {chunk.ledger_id}: the object is missing"
            ) from None

    def pending(self, wal: ObjectLog, nbytes: int) -> None:
        with self._cond:
            self._dirty.setdefault(wal.ledger_id, wal)
            self._pending_bytes += nbytes
            if self._pending_bytes >= self._flush_bytes:
                self._urgent = True
            self._cond.notify_all()

    def urge(self) -> None:
        """Flush now rather than at the end of the interval (a ledger is closing)."""
        with self._cond:
            self._urgent = True
            self._cond.notify_all()

    def forget(self, wal: ObjectLog) -> None:
        with self._cond:
            if self._dirty.get(wal.ledger_id) is wal:
                del self._dirty[wal.ledger_id]

    def key(self, sequence: int) -> str:
        return f"{self.prefix}/{self.writer}/{sequence:016d}.wal"

    # ------------------------------------------------------------------ the thread

    def start(self, writer: str | None = None) -> None:
        """Start flushing, as ``writer`` (a name no other committer has had) if given."""
        if writer is not None:
            self.writer = writer
        self._thread = threading.Thread(target=self._run, name="wal-group-commit", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Flush what waits (once), then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        delay = RETRY_S
        while True:
            with self._cond:
                while True:
                    if self._dirty:
                        due = self._last_start + self._flush_s - time.monotonic()
                        if self._urgent or self._stopping or due <= 0:
                            break
                        self._cond.wait(due)
                    elif self._stopping:
                        return
                    else:
                        self._cond.wait()
                logs = list(self._dirty.values())
                self._pending_bytes = 0
                self._last_start = time.monotonic()
                self._urgent = False
                stopping = self._stopping
            ok = self._flush(logs)
            with self._cond:
                # Frames appended during the flush go with the next one; a failed flush's
                # frames too (after the back-off below).
                for wal in logs:
                    if not wal._waiting() and self._dirty.get(wal.ledger_id) is wal:
                        del self._dirty[wal.ledger_id]
            if stopping and not ok:
                log.error("stopping with write-ahead frames that could not be stored (never acknowledged)")
                return
            if ok:
                delay = RETRY_S
            else:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, delay)
                delay = min(RETRY_MAX_S, delay * 2)

    def _flush(self, logs: list[ObjectLog]) -> bool:
        """Store and commit one object with the frames ``logs`` have waiting; False if it failed."""
        taken: list[tuple[ObjectLog, int, int, bytes]] = []
        for wal in logs:
            got = wal._take()
            if got is not None:
                taken.append((wal, *got))
        if not taken:
            return True
        sequence = next(self._sequence)
        key = self.key(sequence)
        chunks: list[tuple[Chunk, Any]] = []
        offset = 0
        for wal, first, n, data in taken:
            chunks.append((Chunk(wal.ledger_id, first, n, key, offset, len(data)), wal.owner))
            offset += len(data)
        t0 = time.perf_counter()
        try:
            self.storage.put(key, b"".join(data for *_, data in taken))
            refused = self._commit(chunks)
        except Exception as e:  # noqa: BLE001 - every waiter gets it; the frames go with the next attempt
            self.failures += 1
            log.warning("storing write-ahead object %s failed: %s", key, e)
            for wal, *_ in taken:
                wal._flush_failed(e)
            self.completed = sequence
            return False
        self.completed = sequence
        if flush_observer is not None:
            flush_observer(time.perf_counter() - t0)
        self.flushes += 1
        for wal, first, n, _ in taken:
            error = refused.get(wal.ledger_id)
            if error is not None:
                wal._refused(error)
            else:
                wal._committed(first + n)
        return True


def _scan_chunk(
    data: bytes,
    chunk: Chunk,
    ledger_id: int,
    where: str,
    buf: bytearray,
    index: FrameIndex,
) -> None:
    """Append the frames of ``chunk`` (``data``) that come after those already in ``buf``."""
    if len(data) != chunk.length:
        raise CorruptRecordError(
            where, chunk.offset, f"chunk of {chunk.length} bytes, the object ends after {len(data)}"
        )
    view, pos = memoryview(data), 0
    entry_id, stop = chunk.first_entry, chunk.first_entry + chunk.entries
    while entry_id < stop:
        if pos + fmt.FRAME_HEADER_SIZE > len(data):
            raise CorruptRecordError(where, chunk.offset + pos, "chunk ends inside a frame header")
        length, crc = fmt.decode_frame_header(view, pos)
        real = length & ~fmt.BATCH_FRAME
        end = pos + fmt.FRAME_HEADER_SIZE + real
        if not fmt.body_length_is_sane(real) or end > len(data):
            raise CorruptRecordError(where, chunk.offset + pos, f"implausible frame length {length}")
        body = view[pos + fmt.FRAME_HEADER_SIZE : end]
        checked = check_frame(body, length, crc, ledger_id, entry_id)
        if isinstance(checked, str):
            raise CorruptRecordError(where, chunk.offset + pos, f"ledger {ledger_id}: {checked}")
        if entry_id >= index.entries:  # past the overlap with a chunk recorded before
            buf += view[pos:end]
            index.add_checked(len(buf), checked)
        entry_id += checked.count if type(checked) is StoredBatch else 1
        pos = end
    if entry_id != stop:
        raise CorruptRecordError(where, chunk.offset + pos, "a batch runs past the chunk's entries")
    if pos != len(data):
        raise CorruptRecordError(where, chunk.offset + pos, "bytes after the chunk's last frame")
