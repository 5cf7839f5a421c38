"""Sealed ledgers written in steps (``SealWriter``): the same file as sealing at once, in order,
no descriptor held between steps, nothing under the final name until it is complete."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ledger.entry import Entry, Record
from ledger.parquet_store import ROW_GROUP_SIZE, SealedLedger, SealWriter, seal_table
from ledger.paths import sealed_path
from ledger.schema import (
    BATCH_INDEX,
    DELIVER_AT_TIME,
    EVENT_TIME,
    FIRST_COLUMNS,
    ORDERING_KEY,
    PRODUCER_NAME,
    SCHEMA_VERSION,
    declared_null,
    records_to_table,
)

LEDGER = 9


def rows(first: int, n: int) -> list[Record]:
    return [
        Record(key=f"k{i % 500}", value=f"v{i}".encode(), properties={"p": "1"} if i % 7 == 0 else {})
        for i in range(first, first + n)
    ]


def open_paths() -> set[str]:
    fds = Path("/proc/self/fd")
    out = set()
    for fd in os.listdir(fds):
        with contextlib.suppress(OSError):  # closed since the listing
            out.add(os.readlink(fds / fd))
    return out


def test_a_ledger_sealed_in_steps_is_the_ledger_sealed_at_once(tmp_path: Path) -> None:
    n = 2 * ROW_GROUP_SIZE + 123
    whole = records_to_table(LEDGER, rows(0, n))
    at_once = seal_table(whole, tmp_path / "once.parquet")

    path = tmp_path / "steps.parquet"
    writer = SealWriter(path)
    writer.write(records_to_table(LEDGER, rows(0, ROW_GROUP_SIZE), 0))
    writer.write(records_to_table(LEDGER, rows(ROW_GROUP_SIZE, ROW_GROUP_SIZE), ROW_GROUP_SIZE))
    tmp = path.with_name(path.name + ".tmp")
    # Written ahead, but nothing under the final name, and the file is not held open.
    assert tmp.stat().st_size > 0 and not path.exists()
    assert str(tmp) not in open_paths()
    info = writer.finish(records_to_table(LEDGER, rows(2 * ROW_GROUP_SIZE, 123), 2 * ROW_GROUP_SIZE))

    assert info.entries == at_once.entries == n and not tmp.exists()
    assert pq.read_table(path).equals(pq.read_table(tmp_path / "once.parquet"))
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [ROW_GROUP_SIZE] * 2 + [123]
    ledger = SealedLedger(path, ledger_id=LEDGER)
    try:
        got = ledger.read(ROW_GROUP_SIZE - 2, 4)
        assert [(e.entry_id, e.key, e.value) for e in got] == [
            (i, f"k{i % 500}", f"v{i}".encode()) for i in range(ROW_GROUP_SIZE - 2, ROW_GROUP_SIZE + 2)
        ]
    finally:
        ledger.close()


def test_rows_out_of_order_are_refused_and_an_abandoned_writer_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.parquet"
    writer = SealWriter(path)
    writer.write(records_to_table(LEDGER, rows(0, 10), 0))
    with pytest.raises(ValueError, match="entry 10 comes next"):
        writer.write(records_to_table(LEDGER, rows(11, 5), 11))
    # The refused rows changed nothing: the ledger goes on from entry 10.
    writer.write(records_to_table(LEDGER, rows(10, 5), 10))
    assert writer.rows == 15
    writer.abandon()
    assert not path.with_name(path.name + ".tmp").exists() and not path.exists()
    with pytest.raises(RuntimeError, match="abandoned"):
        writer.finish(records_to_table(LEDGER, rows(15, 1), 15))


def test_a_stale_temporary_file_from_a_crash_is_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "l.parquet"
    path.with_name(path.name + ".tmp").write_bytes(b"left by a crashed attempt" * 1000)
    info = SealWriter(path).finish(records_to_table(LEDGER, rows(0, 3)))
    assert info.entries == 3
    assert pq.read_table(path).column("entry_id").to_pylist() == [0, 1, 2]


@pytest.mark.parametrize("page", [1000, 3001, 9000])
def test_pages_across_row_groups_read_back_every_entry_in_order(tmp_path: Path, page: int) -> None:
    # A consumer's pages cross row-group boundaries; the reader keeps the groups it decoded
    # and joins them with the next ones: every entry must come back once, in order.
    n = 3 * ROW_GROUP_SIZE + 123
    records = rows(0, n)
    seal_table(records_to_table(LEDGER, records), tmp_path / "l.parquet")
    ledger = SealedLedger(tmp_path / "l.parquet", ledger_id=LEDGER)
    try:
        got = []
        for start in range(0, n, page):
            got.extend(ledger.read(start, page))
        assert [e.entry_id for e in got] == list(range(n))
        sent = [(r.key, r.value, r.properties) for r in records]
        assert [(e.key, e.value, e.properties) for e in got] == sent
        # Going back to a group no longer held decodes it again.
        assert [e.entry_id for e in ledger.read(5, 3)] == [5, 6, 7]
    finally:
        ledger.close()


def test_a_sealed_ledger_of_the_format_before_batches_still_reads(tmp_path: Path) -> None:
    # Written before the batch columns existed: the first columns only. No file is rewritten
    # for a format change; readers fill the columns it lacks.
    table = records_to_table(LEDGER, rows(0, 20)).select(list(FIRST_COLUMNS))
    path = tmp_path / "old.parquet"
    pq.write_table(table, path, row_group_size=8)
    ledger = SealedLedger(path, ledger_id=LEDGER)
    try:
        entries = ledger.read(0, 20)
    finally:
        ledger.close()
    assert [(e.entry_id, e.key, e.batch_index, e.batch_size) for e in entries] == [
        (i, f"k{i}", None, None) for i in range(20)
    ]


def test_columns_without_values_are_declared_and_read_back_as_nulls(tmp_path: Path) -> None:
    """A sealed ledger names the sparse columns no row has a value in (a compaction round makes
    them nulls instead of decoding them), and reads back the same entries."""
    records = [Record(f"k{i}", b"v", event_time=None) for i in range(10)]
    records[3] = Record("k3", b"v", producer_name="p", sequence_id=7, ordering_key=b"o")
    path = sealed_path(tmp_path, 1)
    seal_table(records_to_table(1, records), path)
    declared = declared_null(pq.ParquetFile(path).metadata.metadata)
    assert PRODUCER_NAME not in declared and ORDERING_KEY not in declared  # one row has them
    assert {EVENT_TIME, BATCH_INDEX, SCHEMA_VERSION, DELIVER_AT_TIME} <= declared
    ledger = SealedLedger(path, ledger_id=1)
    try:
        got = ledger.read(0, 10)
    finally:
        ledger.close()
    assert got == [
        Entry(
            1,
            i,
            r.key,
            r.value,
            {},
            r.publish_time,
            None,
            None,
            None,
            r.producer_name,
            r.sequence_id,
            None,
            r.ordering_key,
        )
        for i, r in enumerate(records)
    ]
    # A file from before the declaration says nothing: every column is decoded.
    assert declared_null(None) == frozenset() and declared_null({b"other": b"x"}) == frozenset()
