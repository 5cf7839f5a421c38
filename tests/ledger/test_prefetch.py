"""Opening a Parquet file to read some of its columns, its chunks fetched in parallel from
object storage: the same rows as pyarrow reads from the file itself, and damage still found."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ledger.checksums import READ_OPTIONS, crc32c_bytes, file_checksum
from ledger.entry import Entry
from ledger.parquet_store import seal
from ledger.prefetch import chunk_ranges, coalesce, open_parquet
from ledger.storage import Storage, StoragePath

ROWS = 20_000  # row groups of 8,192 rows: three


@pytest.fixture
def sealed(storage: Storage) -> StoragePath:
    path = storage.at("topic/00000000000000000001.parquet")
    rows = [
        Entry(1, i, f"key-{i % 997}", None if i % 11 == 0 else os.urandom(64), {"p": str(i)}, 1000 + i, None)
        for i in range(ROWS)
    ]
    seal(rows, path)
    return path


def direct(path: StoragePath, columns: list[str], row_groups: list[int] | None = None) -> pa.Table:
    with pq.ParquetFile(path.fs_path, filesystem=path.fs, **READ_OPTIONS) as f:  # type: ignore[arg-type]
        return f.read_row_groups(row_groups or list(range(f.num_row_groups)), columns=columns)


CASES = [(["key", "is_tombstone"], None), (["value", "properties", "publish_time"], [0, 2])]


@pytest.mark.parametrize(("columns", "groups"), CASES)
def test_the_columns_and_row_groups_selected_read_as_from_the_file(
    sealed: StoragePath, columns: list[str], groups: list[int] | None
) -> None:
    seen: list[int] = []

    def select(meta: pq.FileMetaData) -> tuple[list[str], list[int] | None]:
        seen.append(meta.num_rows)
        return columns, groups

    f = open_parquet(sealed, select)
    assert f is not None
    with f:
        got = f.read_row_groups(groups or list(range(f.num_row_groups)), columns=columns)
    assert got.equals(direct(sealed, columns, groups))
    # The footer is read before the selection on object storage; a local file is opened as
    # pyarrow opens it, and its reader decides from its footer.
    assert seen == ([] if sealed.local is not None else [ROWS])


def test_the_columns_asked_for_as_dictionaries_read_as_such_with_the_same_values(sealed: StoragePath) -> None:
    leaves = ["properties.key_value.key", "properties.key_value.value"]
    seen: list[int] = []

    def dictionaries(meta: pq.FileMetaData) -> list[str]:
        seen.append(meta.num_rows)
        return leaves

    f = open_parquet(sealed, lambda meta: (["properties"], [1]), dictionaries=dictionaries)
    assert f is not None
    with f:
        got = f.read_row_group(1, columns=["properties"]).column("properties")
    assert pa.types.is_dictionary(got.type.key_type) and pa.types.is_dictionary(got.type.item_type)
    assert got.cast(pa.map_(pa.string(), pa.string())).to_pylist() == (
        direct(sealed, ["properties"], [1]).column("properties").to_pylist()
    )
    assert seen == [ROWS]  # decided from the footer, on a local disk as on object storage


def test_nothing_selected_opens_nothing(sealed: StoragePath) -> None:
    if sealed.local is not None:
        pytest.skip("a local file is opened whatever is selected")
    assert open_parquet(sealed, lambda meta: None) is None


def test_a_column_not_selected_is_never_read_as_if_it_were_there(sealed: StoragePath) -> None:
    if sealed.local is not None:
        pytest.skip("on a local disk every column is in the file")
    f = open_parquet(sealed, lambda meta: (["key"], None))
    assert f is not None
    with f, pytest.raises(OSError):  # a page of zeros: its header or checksum is refused
        f.read(columns=["value"])


def test_a_damaged_chunk_is_refused_by_its_page_checksum(sealed: StoragePath) -> None:
    data = bytearray(sealed.read_bytes())
    meta = pq.read_metadata(pa.BufferReader(bytes(data)))
    (start, length), *_ = chunk_ranges(meta, ["value"], [1])
    data[start + length // 2] ^= 0xFF  # inside a page of row group 1's values
    sealed.write_bytes(bytes(data))
    f = open_parquet(sealed, lambda meta: (["value"], [1]))
    assert f is not None
    with f, pytest.raises(OSError, match="(?i)checksum|corrupt"):
        f.read_row_groups([1], columns=["value"])


ALL_BUT_KEY = ["value", "is_tombstone", "properties", "publish_time"]


def _damaged(sealed: StoragePath, column: str) -> str:
    """Flip a byte inside a page of row group 1's ``column``; the damaged file's CRC32C.

    In ``value`` the byte flipped is one of a stored value's own (random, so LZ4 keeps them as
    they are): the page still decodes, and only its checksum tells. A byte of the compressed
    stream's own structure could make the page undecodable, which is not what these tests ask."""
    data = bytearray(sealed.read_bytes())
    meta = pq.read_metadata(pa.BufferReader(bytes(data)))
    (start, length), *_ = chunk_ranges(meta, [column], [1])
    at = start + length // 2
    if column == "value":
        values = pq.ParquetFile(pa.BufferReader(bytes(data))).read_row_group(1, columns=["value"]).column(0)
        value = next(v for v in values.to_pylist() if v)
        at = bytes(data).index(value, start, start + length) + len(value) // 2
    data[at] ^= 0xFF
    sealed.write_bytes(bytes(data))
    return crc32c_bytes(bytes(data))


def test_a_local_file_read_for_most_of_its_bytes_is_checked_whole_against_its_checksum(
    sealed: StoragePath,
) -> None:
    if sealed.local is None:
        pytest.skip("an object's chunks are fetched and checked page by page")
    intact = direct(sealed, ALL_BUT_KEY)
    f = open_parquet(sealed, lambda meta: (ALL_BUT_KEY, None), checksum=file_checksum(sealed))
    assert f is not None
    with f:
        assert f.read(columns=ALL_BUT_KEY).equals(intact)
    # A file that fails the whole-file check is read page-checked: the damaged page is found.
    original = file_checksum(sealed)
    _damaged(sealed, "value")
    f = open_parquet(sealed, lambda meta: (ALL_BUT_KEY, None), checksum=original)
    assert f is not None
    with f, pytest.raises(OSError, match="(?i)checksum|corrupt"):
        f.read(columns=ALL_BUT_KEY)


def test_only_the_whole_file_check_stands_between_a_read_of_most_of_a_file_and_its_bytes(
    sealed: StoragePath,
) -> None:
    # Told the damaged file's own CRC32C, the reader takes the file as checked: its pages are
    # not checked again (the check it skips is the one the whole-file check replaces).
    if sealed.local is None:
        pytest.skip("an object's chunks are fetched and checked page by page")
    claimed = _damaged(sealed, "value")
    f = open_parquet(sealed, lambda meta: (ALL_BUT_KEY, None), checksum=claimed)
    assert f is not None
    with f:
        f.read(columns=ALL_BUT_KEY)  # no page check fails


def test_a_read_of_a_small_share_of_a_file_is_checked_page_by_page_whatever_its_checksum(
    sealed: StoragePath,
) -> None:
    claimed = _damaged(sealed, "key")
    f = open_parquet(sealed, lambda meta: (["key"], None), checksum=claimed)
    assert f is not None
    with f, pytest.raises(OSError, match="(?i)checksum|corrupt"):
        f.read(columns=["key"])


def test_ranges_close_together_are_one_request_and_long_ones_several() -> None:
    assert coalesce([(100, 10), (0, 50), (60, 20)], gap=10, piece=1000) == [(0, 80), (100, 10)]
    assert coalesce([(0, 50), (55, 10)], gap=0, piece=1000) == [(0, 50), (55, 10)]
    assert coalesce([(0, 2500)], gap=0, piece=1000) == [(0, 1000), (1000, 1000), (2000, 500)]
    assert coalesce([(0, 100), (10, 20)], gap=0, piece=1000) == [(0, 100)]  # one inside another
