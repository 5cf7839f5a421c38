"""The entries of an open ledger as frames (the byte layout of :mod:`ledger.format`), whichever
write-ahead log keeps their bytes: a local file (:mod:`ledger.wal`) or memory group-committed
to object storage (:mod:`ledger.object_wal`).

Both logs are a :class:`FramedEntries`: the index of entries to frames (:class:`FrameIndex`,
built by a log's recovery scan and by its appends), and the reading of entries and batches back
from a run of frames. Both encode what they append with :func:`encode_appended` and check each
frame they read with :func:`check_frame`.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ledger import format as fmt
from ledger.batches import SMALL_READ, appended_table, small_batch_entries
from ledger.entry import Appended, BatchEntry, Entry, LedgerItem, StoredBatch, record_size
from ledger.format import CorruptRecordError
from ledger.schema import table_to_entries

__all__ = ["RECENT_BATCHES", "FrameIndex", "FramedEntries", "check_frame", "encode_appended"]

# Batches an open ledger keeps as sent for the consumers that follow it (``stored_batch``).
RECENT_BATCHES = 1024


class FramedEntries:
    """The in-memory index of an open ledger's frames, whichever log holds their bytes (the
    file of :mod:`ledger.wal`, or :mod:`ledger.object_wal`'s memory): what its readers and its
    roll-over ask of it, and the decoding of a run of frames; and the writer's lock and closing
    flag, which both logs keep alike.

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
        # Serialises writers so the byte order of the frames is the entry order. Lock order:
        # _write_lock before _cond, never the other way round.
        self._write_lock = threading.Lock()
        self._closing = False  # set under _write_lock: no append may start after it
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
    def closed(self) -> bool:
        """Whether :meth:`close` has been called (appends are refused)."""
        return self._closing

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


def _run(value: int, n: int) -> array[int]:
    """``n`` times ``value``, built in C (``extend(repeat(...))`` costs a Python step each)."""
    return array("q", (value,)) * n


@dataclass(slots=True)
class FrameIndex:
    """The per-entry arrays of :class:`FramedEntries` as a scan of frames builds them (recovery
    of a file in :mod:`ledger.wal_recovery`, of a ledger's chunks in :mod:`ledger.object_wal`)."""

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


def check_frame(
    body: fmt.Buffer, length: int, crc: int, ledger_id: int, entry_id: int
) -> Entry | StoredBatch | str:
    """What a frame holds (an entry, or a batch whose first entry is ``entry_id``), or why it
    is bad (by both logs: reading, and recovering). ``length`` is the frame header's field,
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
