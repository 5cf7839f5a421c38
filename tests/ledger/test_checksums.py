"""Checksums of stored files: page checksums verified on read, damage confined to the row groups
it hits, sealing's read-back comparison, the salvage of an accepted loss, whole-file checks."""

from __future__ import annotations

import errno
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ledger.checksums import (
    FILE_CHECKSUM,
    MISSING,
    PAGE_CHECKSUM,
    READ_BACK,
    ROW_IDS,
    IntegrityError,
    damage_of,
    file_checksum,
    verify_file,
)
from ledger.compacted_store import CompactedLedger, CompactedLedgerError, Manifest
from ledger.entry import Entry, Position
from ledger.manifest_writer import write_manifest
from ledger.parquet_store import SealedLedger, seal, verify_written
from ledger.salvage import LostRanges, write_salvage
from ledger.schema import ARROW_SCHEMA, entries_to_table

LEDGER = 7


def entries(n: int, ledger_id: int = LEDGER) -> list[Entry]:
    return [
        Entry(ledger_id, i, f"k{i}", f"value-{i}-".encode() * 30, {"n": str(i)}, 1000 + i, None)
        for i in range(n)
    ]


def flip_value_page(path: Path, row_group: int) -> None:
    chunk = pq.read_metadata(path).row_group(row_group).column(ARROW_SCHEMA.names.index("value"))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    # The chunk's last bytes are page data (its first are page headers and their statistics).
    data[start + chunk.total_compressed_size - 4] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def sealed(tmp_path: Path) -> Path:
    path = tmp_path / "00000000000000000007.parquet"
    info = seal(entries(12), path, row_group_size=4)
    assert info.checksum == file_checksum(path)
    assert all(
        pq.ParquetFile(path).metadata.row_group(0).column(i).total_compressed_size > 0
        for i in range(len(ARROW_SCHEMA))
    )
    return path


def test_a_damaged_page_fails_its_row_group_only(sealed: Path) -> None:
    flip_value_page(sealed, 1)
    reader = SealedLedger(sealed, ledger_id=LEDGER)
    try:
        assert [e.entry_id for e in reader.read(0, 4)] == [0, 1, 2, 3]
        assert [e.value for e in reader.read(8, 4)] == [e.value for e in entries(12)[8:]]
        with pytest.raises(IntegrityError) as caught:
            reader.read(4, 4)
        assert caught.value.check == PAGE_CHECKSUM and caught.value.path == sealed
        assert "\n" not in str(caught.value)
        with pytest.raises(IntegrityError):
            reader.read(2, 4)  # a page that spans into the damaged row group
    finally:
        reader.close()
    with pytest.raises(IntegrityError) as caught:
        verify_file(sealed, seal(entries(12), sealed.with_name("other.parquet"), row_group_size=4).checksum)
    assert caught.value.check == FILE_CHECKSUM


def test_another_ledgers_file_in_place_fails_the_row_id_check(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    seal(entries(4, ledger_id=LEDGER + 1), path)
    reader = SealedLedger(path, ledger_id=LEDGER)
    with pytest.raises(IntegrityError) as caught:
        reader.read(0, 1)
    assert caught.value.check == ROW_IDS
    reader.close()


def test_salvage_keeps_the_intact_row_groups_and_names_the_lost_entries(sealed: Path, tmp_path: Path) -> None:
    flip_value_page(sealed, 1)
    target = tmp_path / "00000000000000000007.salvage"
    lost, kept, checksum = write_salvage(sealed, target, LEDGER, 12)
    assert lost == LostRanges([(4, 7)]) and kept == 8 and lost.count() == 4
    assert checksum == file_checksum(target)
    rows = pq.read_table(target, page_checksum_verification=True)
    assert rows.column("entry_id").to_pylist() == [0, 1, 2, 3, 8, 9, 10, 11]
    # A file whose footer is gone loses everything, and says so.
    sealed.write_bytes(sealed.read_bytes()[:100])
    lost, kept, _ = write_salvage(sealed, target, LEDGER, 12)
    assert lost == LostRanges([(0, 11)]) and kept == 0


def test_lost_ranges_tell_a_reader_where_to_go_on() -> None:
    lost = LostRanges.parse("4-7,12-15")
    assert lost.to_text() == "4-7,12-15"
    assert lost.skip(5) == 8 and lost.skip(8) is None
    assert lost.room(0) == 4 and lost.room(8) == 4 and lost.room(16) > 10**9
    assert LostRanges.parse(None) == LostRanges() and not LostRanges.parse("")


def test_sealing_compares_what_it_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "s.parquet"
    seal(entries(8), path, row_group_size=4)
    assert verify_written(path, entries_to_table(entries(8))) == (file_checksum(path), path.stat().st_size)
    with pytest.raises(IntegrityError) as caught:
        verify_written(path, entries_to_table(entries(8)[:7]))
    assert caught.value.check == READ_BACK
    flip_value_page(path, 0)
    with pytest.raises(IntegrityError) as caught:
        verify_written(path, entries_to_table(entries(8)))
    assert caught.value.check == READ_BACK and "CRC checksum" in caught.value.detail


def test_files_without_page_checksums_are_still_read(tmp_path: Path) -> None:
    path = tmp_path / "old.parquet"
    pq.write_table(entries_to_table(entries(5)), path)  # as sealed before page checksums
    reader = SealedLedger(path, ledger_id=LEDGER)
    assert [e.entry_id for e in reader.read(0, 10)] == [0, 1, 2, 3, 4]
    reader.close()


def test_whole_file_checks_and_what_is_not_damage(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    assert file_checksum(path) == "crc32c:364b3fb7"
    with pytest.raises(IntegrityError) as caught:
        verify_file(tmp_path / "gone", "crc32c:00000000")
    assert caught.value.check == MISSING
    # Out of descriptors, or a file deleted under a read: not damage.
    assert damage_of(path, OSError(errno.EMFILE, "Too many open files")) is None
    assert damage_of(path, FileNotFoundError(path)) is None
    assert damage_of(path, OSError("CRC checksum verification failed")).check == PAGE_CHECKSUM  # type: ignore[union-attr]


def test_a_manifest_carries_its_parts_checksums_and_is_checked_against_its_own(tmp_path: Path) -> None:
    directory = tmp_path / "compacted-00000000000000000009"
    directory.mkdir()
    pq.write_table(entries_to_table(entries(6)), directory / "part-00000.parquet", write_page_checksum=True)
    manifest = write_manifest(directory)
    assert manifest.parts[0].checksum == file_checksum(directory / "part-00000.parquet")
    recorded = file_checksum(directory / "_manifest.json")
    assert Manifest.load(directory, checksum=recorded) == manifest
    with pytest.raises(CompactedLedgerError) as caught:
        Manifest.load(directory, checksum="crc32c:00000000")
    assert "manifest checksum" in str(caught.value)


def test_a_compacted_ledger_read_in_order_meets_damage_where_it_lies(tmp_path: Path) -> None:
    # An in-order reader has the next row group decoded ahead: damage there must reach the
    # reader when it gets there (and each time it tries), never spoil the pages before it.
    directory = tmp_path / "compacted-00000000000000000009"
    directory.mkdir()
    part = directory / "part-00000.parquet"
    pq.write_table(entries_to_table(entries(20)), part, row_group_size=4, write_page_checksum=True)
    flip_value_page(part, 3)  # entries 12..15
    write_manifest(directory)
    ledger = CompactedLedger(directory)
    got: list[Entry] = []
    at: Position | None = Position(0, 0)
    with pytest.raises(IntegrityError) as caught:
        while at is not None:
            page, at = ledger.read(at, 3)
            got.extend(page)
    assert caught.value.check == PAGE_CHECKSUM and caught.value.path == part
    assert got == entries(20)[:12]
    with pytest.raises(IntegrityError):
        ledger.read(Position(LEDGER, 12), 3)
    assert ledger.read(Position(LEDGER, 16), 10)[0] == entries(20)[16:]
