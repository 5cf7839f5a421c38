"""A compaction round's manifest: its part files described in order, empty ones left out,
overlapping ones refused (``ledger.manifest_writer``)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ledger.compacted_store import MANIFEST_NAME, CompactedLedger, CompactedLedgerError, Manifest
from ledger.entry import Position
from ledger.manifest_writer import write_manifest
from ledger.schema import entries_to_table
from tests.ledger.compacted_parts import sparse_entries, split, write_parts


def test_manifest_lists_parts_in_order_and_skips_empty_ones(tmp_path: Path) -> None:
    model = sparse_entries()
    parts = split(model, [4, 0, 7, 1, 13])
    write_parts(tmp_path, parts)
    manifest = write_manifest(tmp_path)

    assert [p.rows for p in manifest.parts] == [4, 7, 1, 13]
    assert [p.name for p in manifest.parts] == sorted(p.name for p in manifest.parts)
    assert [(p.first, p.last) for p in manifest.parts] == [
        (rows[0].position, rows[-1].position) for rows in parts if rows
    ]
    assert manifest.entries == len(model)
    assert manifest.size_bytes == sum((tmp_path / p.name).stat().st_size for p in manifest.parts)
    assert manifest.first_position == model[0].position
    assert manifest.last_position == model[-1].position
    # Written atomically (no temporary left) and readable back.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("part-")) == [MANIFEST_NAME]
    assert Manifest.load(tmp_path) == manifest
    assert json.loads((tmp_path / MANIFEST_NAME).read_text())["layers"][0]["parts"][0]["first"] == "3:0"


def test_part_order_is_numeric_past_five_digits(tmp_path: Path) -> None:
    model = sparse_entries()
    tmp_path.mkdir(exist_ok=True)
    pq.write_table(entries_to_table(model[:5]), tmp_path / "part-99999-x-c000.zstd.parquet")
    pq.write_table(entries_to_table(model[5:]), tmp_path / "part-100000-x-c000.zstd.parquet")
    write_manifest(tmp_path)
    ledger = CompactedLedger(tmp_path)
    assert [p.name for p in ledger.manifest.parts][0].startswith("part-99999")
    assert ledger.read(Position(0, 0), 1000) == (model, None)


def test_overlapping_parts_are_refused(tmp_path: Path) -> None:
    model = sparse_entries()
    write_parts(tmp_path, [model[5:10], model[0:5]])
    with pytest.raises(CompactedLedgerError, match="not after"):
        write_manifest(tmp_path)
    assert not (tmp_path / MANIFEST_NAME).exists()
