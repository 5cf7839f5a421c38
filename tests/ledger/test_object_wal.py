"""The write-ahead log on object storage: group commit, acknowledgement only once stored and
recorded, recovery from the chunks on another committer, failed and refused flushes. On both
backends (a local directory, and the S3-compatible server when the tests are given one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from ledger.entry import Record
from ledger.format import CorruptRecordError
from ledger.object_wal import Chunk, GroupCommitter, ObjectLog
from ledger.open_log import LedgerClosedError
from ledger.storage import Storage
from tests.batches import batch


class Index:
    """The chunks a committer recorded (the service keeps them in its database)."""

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.fail_next: BaseException | None = None
        self.refuse: dict[int, BaseException] = {}
        self.lock = threading.Lock()

    def commit(self, chunks: Sequence[tuple[Chunk, Any]]) -> dict[int, BaseException]:
        with self.lock:
            if self.fail_next is not None:
                error, self.fail_next = self.fail_next, None
                raise error
            refused = {c.ledger_id: self.refuse[c.ledger_id] for c, _ in chunks if c.ledger_id in self.refuse}
            self.chunks += [c for c, _ in chunks if c.ledger_id not in refused]
            return refused

    def of(self, ledger_id: int) -> list[Chunk]:
        with self.lock:
            return [c for c in self.chunks if c.ledger_id == ledger_id]


@pytest.fixture
def index() -> Index:
    return Index()


@pytest.fixture
def committer(storage: Storage, index: Index) -> Iterator[GroupCommitter]:
    c = GroupCommitter(storage, index.commit, flush_ms=20)
    c.start()
    yield c
    c.stop()


def records(n: int, tag: str = "v") -> list[Record]:
    return [Record(key=f"k{i}", value=f"{tag}{i}".encode(), publish_time=1000 + i) for i in range(n)]


def append(wal: ObjectLog, recs: list[Record]) -> int:
    first, token = wal.append(recs)
    wal.sync(token)
    return first


def test_appends_of_several_ledgers_share_one_object_and_are_read_only_once_stored(
    committer: GroupCommitter, index: Index, storage: Storage
) -> None:
    a, b = committer.create(1), committer.create(2)
    first, token = a.append(records(3))
    assert (first, a.written_entries, a.entries) == (0, 3, 0)  # written, not acknowledged
    assert a.read(0, 10) == []
    b.append(records(2, "b"))
    a.sync(token)
    b.flush()
    assert [e.value for e in a.read(0, 10)] == [b"v0", b"v1", b"v2"]
    assert [e.value for e in b.read(0, 10)] == [b"b0", b"b1"]
    # One flush took both ledgers' frames: one object, a chunk for each.
    assert {c.key for c in index.chunks} == {index.of(1)[0].key}
    assert [f.key for f in storage.list("wal")] == [index.of(1)[0].key]
    assert (a.first_publish_time, a.last_publish_time, a.first_entry_at_or_after(1001)) == (1000, 1002, 1)


def test_concurrent_producers_are_group_committed(committer: GroupCommitter, index: Index) -> None:
    wal = committer.create(7)
    ids: list[int] = []
    lock = threading.Lock()

    def produce(i: int) -> None:
        for j in range(10):
            first = append(wal, [Record(key=f"p{i}", value=f"{i}-{j}".encode())])
            with lock:
                ids.append(first)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ids) == list(range(80))
    assert wal.entries == 80
    # Far fewer objects than acknowledgements: waiting producers shared flushes.
    assert len({c.key for c in index.chunks}) < 40
    covered = sorted((c.first_entry, c.first_entry + c.entries) for c in index.chunks)
    assert covered[0][0] == 0 and covered[-1][1] == 80
    assert all(x[1] == y[0] for x, y in zip(covered, covered[1:], strict=False))


def test_a_ledger_is_read_back_from_its_chunks_by_another_committer(
    committer: GroupCommitter, index: Index, storage: Storage
) -> None:
    wal = committer.create(3)
    for n in (5, 1, 7):
        append(wal, records(n, f"r{n}-"))
    other = GroupCommitter(storage, index.commit, flush_ms=20)
    other.start()
    try:
        taken = other.recover(3, index.of(3))
        assert [(e.entry_id, e.key, e.value) for e in taken.read_all()] == [
            (e.entry_id, e.key, e.value) for e in wal.read_all()
        ]
        assert (taken.entries, taken.size_bytes, taken.file_bytes) == (13, wal.size_bytes, wal.file_bytes)
        assert taken.last_publish_time == wal.last_publish_time
        # The new owner goes on from the next entry.
        assert append(taken, records(2, "new")) == 13
        again = other.recover(3, index.of(3))
        assert [e.value for e in again.read(13, 5)] == [b"new0", b"new1"]
    finally:
        other.stop()


def test_a_failed_flush_acknowledges_nothing_and_its_frames_go_with_the_next_attempt(
    committer: GroupCommitter, index: Index
) -> None:
    wal = committer.create(4)
    index.fail_next = OSError("AWS Error NETWORK_CONNECTION during PutObject operation")
    first, token = wal.append(records(3))
    with pytest.raises(OSError, match="AWS Error"):
        wal.sync(token)
    # Not acknowledged, not readable, but kept: the next attempt stores it.
    deadline = time.monotonic() + 10
    while wal.entries < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert wal.entries == 3
    assert [(c.first_entry, c.entries) for c in index.of(4)] == [(0, 3)]
    wal.sync(token)
    assert append(wal, records(1)) == 3


def test_a_ledger_whose_owner_was_fenced_off_takes_no_more_entries_and_others_go_on(
    committer: GroupCommitter, index: Index
) -> None:
    fenced, other = committer.create(5), committer.create(6)
    append(fenced, records(2))
    index.refuse[5] = RuntimeError("this instance no longer owns the topic")
    first, token = fenced.append(records(2, "late"))
    other_token = other.append(records(2))[1]
    with pytest.raises(RuntimeError, match="no longer owns"):
        fenced.sync(token)
    other.sync(other_token)
    assert fenced.entries == 2  # the late entries were never acknowledged nor recorded
    assert [(c.first_entry, c.entries) for c in index.of(5)] == [(0, 2)]
    with pytest.raises(RuntimeError, match="no longer owns"):
        fenced.append(records(1))
    assert other.entries == 2


def test_close_stores_what_was_written_and_refuses_more(committer: GroupCommitter, index: Index) -> None:
    wal = committer.create(8)
    wal.append(records(4))
    wal.close()
    assert wal.entries == 4
    assert sum(c.entries for c in index.of(8)) == 4
    with pytest.raises(LedgerClosedError):
        wal.append(records(1))
    assert len(wal.read_all()) == 4


def test_recovery_skips_a_chunk_recorded_twice_and_names_what_is_missing(
    committer: GroupCommitter, index: Index, storage: Storage
) -> None:
    wal = committer.create(9)
    append(wal, records(3))
    append(wal, records(2, "x"))
    first, second = index.of(9)
    # A commit whose answer was lost, recorded again by the next flush with more frames.
    assert [e.value for e in committer.recover(9, [first, first, second]).read_all()] == [
        e.value for e in wal.read_all()
    ]
    with pytest.raises(CorruptRecordError, match="entries 0..2 are in no object"):
        committer.recover(9, [second])
    storage.delete(second.key)
    with pytest.raises(CorruptRecordError, match="the object is missing") as missing:
        committer.recover(9, [first, second])
    assert second.key in str(missing.value)


def test_a_chunk_whose_bytes_are_not_its_ledgers_frames_is_named(
    committer: GroupCommitter, index: Index, storage: Storage
) -> None:
    wal = committer.create(10)
    append(wal, records(3))
    (chunk,) = index.of(10)
    with pytest.raises(CorruptRecordError, match="CRC mismatch|entry id|undecodable"):
        bad = bytearray(storage.read(chunk.key))
        bad[chunk.offset + 20] ^= 0xFF
        storage.put(chunk.key, bytes(bad))
        committer.recover(10, [chunk])


def test_a_discarded_log_fails_its_waiters_and_is_forgotten(committer: GroupCommitter) -> None:
    wal = committer.create(11)
    append(wal, records(1))
    wal.discard()
    with pytest.raises(LedgerClosedError):
        wal.append(records(1))


def test_batches_are_one_frame_each_and_read_back_by_another_committer(
    committer: GroupCommitter, index: Index, storage: Storage
) -> None:
    """A Pulsar batch on object storage: one frame, its members' entries, read back whole."""
    b1, m1 = batch(6, tag="a")
    b2, m2 = batch(4, tag="b")
    wal = committer.create(4)
    assert append(wal, [b1, *records(2)]) == 0
    assert append(wal, [b2]) == 8
    assert [e.value for e in wal.read(4, 4)] == [m.value for m in m1[4:]] + [b"v0", b"v1"]
    other = GroupCommitter(storage, index.commit, flush_ms=20)
    other.start()
    try:
        taken = other.recover(4, index.of(4))
        assert taken.entries == 12 and taken.size_bytes == wal.size_bytes
        assert [(e.entry_id, e.key, e.value, e.batch_index) for e in taken.read_all()] == [
            (e.entry_id, e.key, e.value, e.batch_index) for e in wal.read_all()
        ]
        assert [e.value for e in taken.read(8, 4)] == [m.value for m in m2]
        assert [type(a).__name__ for a in taken.read_appended()] == [
            "StoredBatch",
            "Entry",
            "Entry",
            "StoredBatch",
        ]
    finally:
        other.stop()
