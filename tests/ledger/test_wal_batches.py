"""Pulsar batches in the write-ahead log: one frame per batch, entries per member, as before.

A batch is appended whole, as its producer sent it (``StoredBatch``); every read of entries,
every restart and every sealing sees its members as if each had been stored alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from api.pulsar import pulsar_api_pb2 as pb
from ledger import format as fmt
from ledger.batches import appended_table, batch_entries, small_batch_entries
from ledger.entry import Entry, Record, StoredBatch
from ledger.files import QUARANTINE_SUFFIX
from ledger.paths import wal_path
from ledger.schema import records_to_table
from ledger.wal import WriteAheadLog
from tests.batches import PUBLISH, batch

LEDGER = 5


def single(i: int) -> Record:
    return Record(f"k{i}", f"v{i}".encode(), {}, PUBLISH)


def entries_of(records: list[Record], first: int) -> list[Entry]:
    """What reads must return for ``records`` stored from entry ``first`` on."""
    from ledger.schema import table_to_entries

    return table_to_entries(records_to_table(LEDGER, records, first))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return wal_path(tmp_path, LEDGER)


def test_a_batch_is_one_frame_and_reads_as_its_members(path: Path) -> None:
    b, members = batch(7)
    before, after = single(0), single(1)
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        first, token = wal.append([before, b, after])
        wal.sync(token)
        assert first == 0
        assert wal.entries == 9
        expected = entries_of([before, *members, after], 0)
        assert wal.read(0, 100) == expected
        # Reads that start and end inside the batch see exactly those members.
        assert wal.read(3, 2) == expected[3:5]
        assert wal.read(7, 5) == expected[7:]
        assert wal.size_bytes == sum(e.size() for e in expected)
    # One frame for the batch: three frames after the header.
    data = path.read_bytes()
    pos, frames = fmt.HEADER_SIZE, 0
    while pos < len(data):
        length, _ = fmt.decode_frame_header(data, pos)
        pos += fmt.FRAME_HEADER_SIZE + (length & ~fmt.BATCH_FRAME)
        frames += 1
    assert frames == 3


def test_batches_survive_a_restart_and_take_appends_after_them(path: Path) -> None:
    b1, m1 = batch(4, tag="a")
    b2, m2 = batch(3, tag="b", compression=pb.ZSTD)
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        wal.append_and_sync([b1])
        wal.append_and_sync([b2])
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        assert wal.recovery.entries == 7
        assert wal.recovery.truncated_bytes == 0
        assert wal.append_and_sync([single(9)]) == 7
        assert wal.read(0, 100) == entries_of([*m1, *m2, single(9)], 0)
        # Sealing reads the frames as appended, and builds the same rows from them.
        appended = wal.read_appended()
        assert [type(a) for a in appended] == [StoredBatch, StoredBatch, Entry]
        assert appended_table(LEDGER, appended).equals(records_to_table(LEDGER, [*m1, *m2, single(9)]))


@pytest.mark.parametrize("cut", [1, 9, 60, -1])
def test_a_torn_batch_frame_is_cut_whole_and_quarantined(path: Path, cut: int) -> None:
    """A crash in the middle of a batch's write loses the whole batch (it was never
    acknowledged), never part of it; the bytes go to quarantine."""
    b, _ = batch(6)
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        wal.append_and_sync([single(0)])
        good = wal.file_bytes
        wal.append_and_sync([b])
        end = wal.file_bytes
    with open(path, "r+b") as f:
        f.truncate(good + cut if cut > 0 else end + cut)
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        assert wal.recovery.entries == 1
        assert wal.entries == 1
        assert wal.read(0, 10) == entries_of([single(0)], 0)
        assert wal.append_and_sync([single(1)]) == 1
    assert list(path.parent.glob(f"{path.name}{QUARANTINE_SUFFIX}-*"))


def test_a_flipped_byte_in_a_batch_payload_cuts_it(path: Path) -> None:
    b, _ = batch(5)
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        wal.append_and_sync([single(0)])
        good = wal.file_bytes
        wal.append_and_sync([b])
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        assert wal.entries == 1
        assert wal.recovery.truncated_at == good
        assert wal.recovery.reason == "CRC mismatch"


def test_a_version_1_file_is_read_and_appended_to(path: Path) -> None:
    """Files written before batch frames (magic version 1) open as before."""
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        wal.append_and_sync([single(0), single(1)])
    data = bytearray(path.read_bytes())
    data[: len(fmt.MAGIC_V1)] = fmt.MAGIC_V1
    path.write_bytes(bytes(data))
    b, members = batch(3)
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        assert wal.entries == 2
        wal.append_and_sync([b])
        assert wal.read(0, 10) == entries_of([single(0), single(1), *members], 0)


def test_batch_entries_name_members_by_batch_and_index() -> None:
    b, members = batch(4, first_seq=10)
    got = batch_entries(LEDGER, 20, b)
    assert [(e.entry_id, e.batch_index, e.batch_size, e.sequence_id) for e in got] == [
        (20 + i, i, 4, 10 + i) for i in range(4)
    ]
    assert [e.message_id for e in got] == [f"{LEDGER}:20:{i}" for i in range(4)]
    assert [(e.key, e.value) for e in got] == [(r.key, r.value) for r in members]


def _rich_batch(n: int) -> StoredBatch:
    """Members with every field a member may carry: event times, own sequence ids, ordering
    keys, unicode keys and properties, null and empty values."""
    import struct as _struct

    parts = []
    for i in range(n):
        single = pb.SingleMessageMetadata()
        if i % 4:
            single.partition_key = f"clé-{i % 5}-✓"
        if i % 3 == 0:
            single.properties.add(key="ü", value=str(i))
            single.properties.add(key="b", value="")
        if i % 2:
            single.event_time = 1_600_000_000_000 + i
        if i % 5 == 1:
            single.sequence_id = 10_000 + i
        if i % 6 == 2:
            single.ordering_key = bytes([i % 256, 0, 255])
        value = b"" if i % 7 == 3 else f"v{i}".encode() * (i % 4)
        if i % 9 == 8:
            single.null_value = True
        single.payload_size = len(value)
        meta = single.SerializeToString()
        parts += [_struct.pack(">I", len(meta)), meta, value]
    payload = b"".join(parts)
    return StoredBatch(
        metadata=b"",
        payload=payload,
        count=n,
        size=0,
        uncompressed_size=len(payload),
        producer_name="p-ü",
        sequence_id=77,
        deliver_at_time=123 if n % 2 else None,
        ordering_key=b"batch-ok" if n % 3 else None,
        schema_version=b"\x00\x01",
        publish_time=PUBLISH,
    )


@pytest.mark.parametrize("n", [1, 2, 7, 31, 63])
def test_small_reads_decode_members_one_by_one_to_the_same_entries(n: int) -> None:
    """A small batch read from the open ledger skips Arrow (its fixed cost dominates a small
    read): the entries are the same as the bulk decoder's, field for field."""
    b = _rich_batch(n)
    assert small_batch_entries(LEDGER, 40, b) == batch_entries(LEDGER, 40, b)


def test_small_and_large_reads_of_a_log_agree(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER, fsync="never") as wal:
        wal.append([_rich_batch(5), single(0), _rich_batch(40), _rich_batch(70)])
        everything = wal.read(0, 1000)  # above SMALL_READ: through Arrow
        assert len(everything) == 116
        for start in range(0, 116, 7):
            assert wal.read(start, 9) == everything[start : start + 9]


def test_appends_of_large_and_of_small_frames_read_back_alike(path: Path) -> None:
    # Large bodies (batches) are written gathered, many small ones copied into one buffer:
    # either way the same frames, through a restart.
    big, big_members = batch(600, tag="big")
    assert len(big.payload) > 2048
    small = [single(i) for i in range(300)]
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        wal.sync(wal.append([big])[1])
        wal.sync(wal.append(small)[1])
        wal.sync(wal.append([big, single(300)])[1])
    expected = entries_of([*big_members, *small, *big_members, single(300)], 0)
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        assert wal.read(0, 10_000) == expected
