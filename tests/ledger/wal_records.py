"""Records, and write-ahead files of them, for the tests of the write-ahead file
(``tests/ledger/test_wal.py``) and of its recovery (``tests/ledger/test_wal_recovery.py``)."""

from __future__ import annotations

from pathlib import Path

from ledger.entry import Entry, Record
from ledger.files import QUARANTINE_SUFFIX
from ledger.wal import WriteAheadLog

LEDGER = 3


def rec(i: int, **overrides: object) -> Record:
    """A distinct, recognisable record; sizes vary so frame boundaries do too."""
    fields: dict[str, object] = {
        "key": f"key-{i % 7}",
        "value": f"value-{i}-".encode() * (1 + i % 4),
        "properties": {"i": str(i)} if i % 2 else {},
        "publish_time": 1_700_000_000_000 + i,
        "event_time": 1_600_000_000_000 + i if i % 3 else None,
    }
    fields.update(overrides)
    return Record(**fields)


def as_entry(entry_id: int, r: Record) -> Entry:
    return Entry(LEDGER, entry_id, r.key, r.value, dict(r.properties), r.publish_time, r.event_time)


def quarantine_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}{QUARANTINE_SUFFIX}-*"))


def write_records(path: Path, records: list[Record]) -> list[int]:
    """Write ``records`` one per append into a fresh log; return the file length after each."""
    ends = []
    with WriteAheadLog.open(path, LEDGER, fsync="never") as wal:
        for r in records:
            wal.append([r])
            ends.append(wal.file_bytes)
    return ends
