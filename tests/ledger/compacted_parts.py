"""Compacted ledgers' part files as the compactor leaves them, for the tests of
``ledger.manifest_writer`` and ``ledger.compacted_store``."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from ledger.entry import Entry
from ledger.schema import ARROW_SCHEMA, entries_to_table


def entry(ledger_id: int, entry_id: int, *, key: str | None = None, value: bytes | None = b"v") -> Entry:
    return Entry(
        ledger_id=ledger_id,
        entry_id=entry_id,
        key=key if key is not None else f"k{ledger_id}-{entry_id}",
        value=value,
        properties={"at": f"{ledger_id}:{entry_id}"} if entry_id % 2 else {},
        publish_time=1_000 + entry_id,
        event_time=entry_id if entry_id % 3 == 0 else None,
    )


def write_parts(directory: Path, parts: list[list[Entry]], *, row_group_size: int = 3) -> None:
    """Part files as the compactor leaves them (before its manifest); empty parts allowed."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(parts):
        table = entries_to_table(rows) if rows else ARROW_SCHEMA.empty_table()
        pq.write_table(
            table, directory / f"part-{i:05d}-abc-c000.zstd.parquet", row_group_size=row_group_size
        )


def sparse_entries() -> list[Entry]:
    """Sparse ids over three ledgers, as a compaction leaves them."""
    ids = [(3, 0), (3, 2), (3, 3), (3, 7), (3, 8), (3, 9), (3, 15), (5, 1), (5, 4), (5, 5), (5, 6)]
    ids += [(9, e) for e in range(0, 40, 3)]
    return [entry(lid, eid) for lid, eid in ids]


def split(entries: list[Entry], sizes: list[int]) -> list[list[Entry]]:
    out, i = [], 0
    for n in sizes:
        out.append(entries[i : i + n])
        i += n
    assert i == len(entries)
    return out
