"""What is left of a damaged sealed ledger once an operator accepts the loss.

A sealed ledger whose row group fails a check (``ledger.checksums``) is never rewritten: its
file stays as evidence and its intact row groups stay readable in place. When an operator
accepts the loss (``skip-damaged``), the row groups that fail are listed as **lost ranges** of
entry ids, and the intact rows are copied, verified, into a **salvage file** beside it, which
compactions read instead of the damaged file (Spark would stop at the first bad page).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from ledger.checksums import IntegrityError
from ledger.parquet_store import SealedLedger, seal_table
from ledger.schema import ARROW_SCHEMA
from ledger.storage import StoragePath


class LostRanges(tuple[tuple[int, int], ...]):
    """Inclusive entry-id ranges ``(first, last)`` lost to damage, in order, not overlapping."""

    def skip(self, entry_id: int) -> int | None:
        """The first entry after the lost range holding ``entry_id`` (None: it is not lost)."""
        for first, last in self:
            if first <= entry_id <= last:
                return last + 1
        return None

    def room(self, entry_id: int) -> int:
        """How many entries from ``entry_id`` (not lost) come before the next lost range."""
        for first, _ in self:
            if first > entry_id:
                return first - entry_id
        return 2**62

    def count(self) -> int:  # type: ignore[override]
        return sum(last - first + 1 for first, last in self)

    def to_text(self) -> str:
        return ",".join(f"{a}-{b}" for a, b in self)

    @classmethod
    def parse(cls, text: str | None) -> LostRanges:
        if not text:
            return cls()
        pairs = (part.split("-") for part in text.split(","))
        return cls((int(a), int(b)) for a, b in pairs)


def write_salvage(
    sealed: Path | StoragePath, target: Path | StoragePath, ledger_id: int, entries: int
) -> tuple[LostRanges, int, str]:
    """Decode every row group of the sealed ledger at ``sealed`` (``entries`` entries) with
    every check; write the intact ones to ``target`` (page checksums, read back and compared,
    fsynced, published) and return the lost ranges, the entries kept and the salvage file's
    CRC32C. A file whose footer is unreadable loses every entry."""
    lost: list[tuple[int, int]] = []
    kept: list[pa.Table] = []
    try:
        reader = SealedLedger(sealed, ledger_id=ledger_id)
    except (IntegrityError, FileNotFoundError):
        return _write(target, [], [(0, entries - 1)] if entries else [])
    try:
        for rg, (first, last) in enumerate(reader.row_groups()):
            try:
                kept.append(reader.row_group(rg))
            except IntegrityError:
                if lost and lost[-1][1] + 1 == first:
                    lost[-1] = (lost[-1][0], last)
                else:
                    lost.append((first, last))
    finally:
        reader.close()
    return _write(target, kept, lost)


def _write(
    target: Path | StoragePath, kept: list[pa.Table], lost: list[tuple[int, int]]
) -> tuple[LostRanges, int, str]:
    # Written and verified exactly as a sealed ledger is (temporary name, fsync, read back).
    table = pa.concat_tables(kept) if kept else ARROW_SCHEMA.empty_table()
    sealed = seal_table(table, target)
    return LostRanges(lost), sealed.entries, sealed.checksum
