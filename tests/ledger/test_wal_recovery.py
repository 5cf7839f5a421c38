"""Opening a write-ahead file that a crash left behind (``ledger.wal_recovery``): a torn or
damaged tail is cut and kept in a quarantine file, a torn header rewritten, a file that is
not this ledger's refused and left alone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger import format as fmt
from ledger.files import TMP_SUFFIX
from ledger.paths import wal_path
from ledger.wal import CorruptRecordError, WriteAheadLog
from tests.ledger.wal_records import LEDGER, as_entry, quarantine_files, rec, write_records


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return wal_path(tmp_path, LEDGER)


@pytest.fixture
def five(path: Path) -> Iterator[tuple[bytes, int, int]]:
    """A closed log of five records: its bytes, and where the last frame starts and ends."""
    ends = write_records(path, [rec(i) for i in range(5)])
    yield path.read_bytes(), ends[3], ends[4]


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(1, id="one-byte-of-frame-header"),
        pytest.param(fmt.FRAME_HEADER_SIZE - 1, id="mid-frame-header"),
        pytest.param(fmt.FRAME_HEADER_SIZE, id="frame-header-without-body"),
        pytest.param(fmt.FRAME_HEADER_SIZE + 5, id="mid-fixed-body"),
        pytest.param(fmt.FRAME_HEADER_SIZE + fmt.BODY_HEADER_SIZE + 3, id="mid-key-or-value"),
        pytest.param(-1, id="last-byte-missing"),
    ],
)
def test_torn_tail_is_cut_and_quarantined(path: Path, five: tuple[bytes, int, int], cut: int) -> None:
    original, last_start, last_end = five
    cut_at = last_start + cut if cut > 0 else last_end + cut
    assert last_start < cut_at < last_end
    path.write_bytes(original[:cut_at])

    with WriteAheadLog.open(path, LEDGER) as wal:
        r = wal.recovery
        assert r.entries == wal.entries == 4
        assert r.truncated_at == last_start
        assert r.truncated_bytes == cut_at - last_start
        assert r.quarantine_path is not None and quarantine_files(path) == [r.quarantine_path]
        assert r.quarantine_path.read_bytes() == original[last_start:cut_at]
        assert path.stat().st_size == last_start
        assert wal.read_all() == [as_entry(i, rec(i)) for i in range(4)]
        assert wal.append_and_sync([rec(100)]) == 4
        assert wal.append_and_sync([rec(101)]) == 5

    with WriteAheadLog.open(path, LEDGER) as wal:
        assert wal.recovery.truncated_bytes == 0
        assert wal.read_all() == [as_entry(i, rec(i)) for i in range(4)] + [
            as_entry(4, rec(100)),
            as_entry(5, rec(101)),
        ]
    assert len(quarantine_files(path)) == 1
    assert not list(path.parent.glob(f"*{TMP_SUFFIX}"))


def test_flipped_byte_in_last_record(path: Path, five: tuple[bytes, int, int]) -> None:
    original, last_start, last_end = five
    damaged = bytearray(original)
    damaged[last_end - 2] ^= 0x40  # inside the value
    path.write_bytes(bytes(damaged))

    with WriteAheadLog.open(path, LEDGER) as wal:
        assert wal.entries == 4
        assert "CRC" in (wal.recovery.reason or "")
        assert wal.recovery.quarantine_path is not None
        assert wal.recovery.quarantine_path.read_bytes() == bytes(damaged[last_start:])
        assert wal.append_and_sync([rec(9)]) == 4


def test_flipped_byte_in_middle_record_cuts_everything_after(path: Path) -> None:
    ends = write_records(path, [rec(i) for i in range(6)])
    original = path.read_bytes()
    damaged = bytearray(original)
    damaged[ends[1] + fmt.FRAME_HEADER_SIZE + 12] ^= 0x01  # record 2's publish time
    path.write_bytes(bytes(damaged))

    with WriteAheadLog.open(path, LEDGER) as wal:
        r = wal.recovery
        assert r.entries == 2 and r.truncated_at == ends[1]
        assert r.truncated_bytes == len(original) - ends[1]
        assert r.quarantine_path is not None
        assert r.quarantine_path.read_bytes() == bytes(damaged[ends[1] :])
        assert wal.read_all() == [as_entry(0, rec(0)), as_entry(1, rec(1))]
        assert path.stat().st_size == ends[1]


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(os.urandom(100), id="random"),
        pytest.param(bytes(4096), id="zeros"),  # what a crash can leave after a file grew
        pytest.param(b"\xff" * 8, id="absurd-length"),
        pytest.param(fmt.encode_record(7, rec(7)), id="valid-frame-wrong-entry-id"),
        pytest.param(
            fmt.encode_record(5, rec(5))[:4] + b"\0\0\0\0" + fmt.encode_record(5, rec(5))[8:], id="wrong-crc"
        ),
    ],
)
def test_garbage_after_valid_records(path: Path, five: tuple[bytes, int, int], garbage: bytes) -> None:
    original, _, last_end = five
    path.write_bytes(original + garbage)

    with WriteAheadLog.open(path, LEDGER) as wal:
        assert wal.entries == 5
        assert wal.recovery.truncated_at == last_end
        assert wal.recovery.quarantine_path is not None
        assert wal.recovery.quarantine_path.read_bytes() == garbage
        assert path.read_bytes() == original
        assert wal.append_and_sync([rec(5)]) == 5


def test_undecodable_body_with_good_crc_is_cut(path: Path, five: tuple[bytes, int, int]) -> None:
    original, _, _ = five
    body = fmt.encode_body(5, rec(5)) + b"extra"  # CRC is right, but the body does not parse
    frame = fmt.encode_frames(5, [body])
    path.write_bytes(original + frame)
    with WriteAheadLog.open(path, LEDGER) as wal:
        assert wal.entries == 5
        assert "undecodable" in (wal.recovery.reason or "")


@pytest.mark.parametrize("keep", [0, 5, fmt.HEADER_SIZE - 1])
def test_torn_file_header_is_rewritten(path: Path, keep: int) -> None:
    path.write_bytes(fmt.encode_header(LEDGER)[:keep])
    with WriteAheadLog.open(path, LEDGER) as wal:
        assert wal.recovery.header_rewritten and wal.entries == 0
        wal.append_and_sync([rec(0)])
    with WriteAheadLog.open(path, LEDGER) as wal:
        assert wal.read_all() == [as_entry(0, rec(0))]


def test_short_file_that_is_not_our_header_is_refused(path: Path) -> None:
    path.write_bytes(b"hello")
    with pytest.raises(CorruptRecordError, match=str(path)):
        WriteAheadLog.open(path, LEDGER)
    assert path.read_bytes() == b"hello"


def test_wrong_magic_is_refused_and_left_alone(path: Path) -> None:
    write_records(path, [rec(0)])
    original = path.read_bytes()
    path.write_bytes(b"PAR1" + original[4:])
    with pytest.raises(CorruptRecordError) as info:
        WriteAheadLog.open(path, LEDGER)
    assert str(path) in str(info.value) and info.value.offset == 0
    assert path.read_bytes() == b"PAR1" + original[4:]
    assert quarantine_files(path) == []


def test_other_ledgers_file_is_refused(path: Path) -> None:
    write_records(path, [rec(0)])
    with pytest.raises(CorruptRecordError, match="ledger 3, expected ledger 4"):
        WriteAheadLog.open(path, LEDGER + 1)
