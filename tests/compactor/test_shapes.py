"""A full round on every shape of data the benchmarks use (issue 28), small, against a model.

The benchmarks compare the project's output with DuckDB's at millions of messages; here each
shape (long keys with properties, big values, keyless messages, skewed, unique and few keys)
is generated at a small size with several row groups per ledger, compacted by the
``TwoPhaseCompactor`` over several groups, and read back with the Spark-free reader: it must
hold exactly the latest message of every key (tombstoned and keyless ones dropped), with its
id, key, value and properties, in id order. Their values are random bytes, which do not
compress: the parts store them uncompressed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from compactor import CompactionJob, TwoPhaseCompactor
from ledger.checksums import file_checksum
from ledger.compacted_store import CompactedLedger
from ledger.entry import Position
from ledger.paths import sealed_path
from ledger.schema import ARROW_SCHEMA
from tests.benchmarks.workload import Shape, WorkloadSpec, generate, shapes
from tests.compactor.test_segments import _ledger_table, _overflowing, _repeating, _write_ledger

pytestmark = pytest.mark.spark

# 3 ledgers of 20,000 entries, each sealed in row groups of 8,192: the few-keys shape's
# winners all lie in the last row group, the others' in most of them.
SMALL = WorkloadSpec(60_000, 3_000, entries_per_ledger=20_000)
SHAPES = [
    dataclasses.replace(s, spec=dataclasses.replace(s.spec, value_bytes=min(s.spec.value_bytes, 600)))
    for s in shapes(SMALL)
]

Row = tuple[Position, str, bytes, dict[str, str]]


def model(ledgers: list[tuple[int, Path]]) -> list[Row]:
    """The latest message of every key in ``ledgers`` (id, path), tombstones and keyless
    messages dropped, in id order."""
    latest: dict[str, Row | None] = {}
    for ledger_id, path in ledgers:
        table = pq.read_table(path)
        for row in table.to_pylist():
            key = row["key"]
            if key is None:
                continue
            position = Position(ledger_id, row["entry_id"])
            latest[key] = (
                None if row["is_tombstone"] else (position, key, row["value"], dict(row["properties"]))
            )
    return sorted((r for r in latest.values() if r is not None), key=lambda r: r[0])


def compacted(directory: Path) -> list[Row]:
    entries, nxt = CompactedLedger(directory).read(Position(0, 0), 1_000_000)
    assert nxt is None
    return [(e.position, e.key, e.value, dict(e.properties)) for e in entries]  # type: ignore[misc]


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_a_full_round_on_each_shape_keeps_the_latest_message_of_every_key(
    spark: SparkSession, tmp_path: Path, shape: Shape
) -> None:
    w = generate(tmp_path / "ledgers" / "public" / "default" / "t", shape.spec)
    job = CompactionJob(
        topic_root=w.topic_root,
        inputs=w.paths,
        input_ledger_ids=w.ledger_ids,
        previous_compacted=None,
        previous_horizon=None,
        horizon=w.horizon,
        output_ledger_id=w.ledgers[-1][0] + 1,
        # As the service passes the checksums it recorded at sealing: phase two checks the
        # ledgers whole rather than page by page.
        input_checksums={lid: file_checksum(path) for lid, path in w.ledgers},
    )
    # One group per core even at this size, so that winners cross group boundaries.
    result = TwoPhaseCompactor(spark, min_part_bytes=0).compact(job)
    expected = model(w.ledgers)
    assert expected, "a shape whose model keeps nothing tests nothing"
    assert compacted(result.directory) == expected
    assert result.records_kept == len(expected)
    assert result.entries_read == shape.spec.messages
    # Random values do not compress: the parts store them as they are, and the rest as LZ4.
    for part in CompactedLedger(result.directory).part_paths():
        group = pq.read_metadata(part.local).row_group(0)
        codecs = {
            group.column(i).path_in_schema: group.column(i).compression for i in range(group.num_columns)
        }
        assert codecs.pop("value") == "UNCOMPRESSED"
        assert set(codecs.values()) == {"LZ4"}


def test_entry_ids_are_decoded_where_the_statistics_do_not_show_consecutive_entries(
    spark: SparkSession, tmp_path: Path
) -> None:
    # A sealed ledger's id columns are made from its row groups' statistics, not decoded, when
    # they show one ledger's consecutive entries; here the second row group has a gap.
    root = tmp_path / "ledgers" / "public" / "default" / "t"
    root.mkdir(parents=True)
    entries = [0, 1, 2, 3, 4, 5, 6, 9, 10, 11]
    keys = ["a", "b", "a", "c", "b", "a", "d", "c", "e", "d"]
    table = pa.table(
        {
            "ledger_id": [1] * len(entries),
            "entry_id": entries,
            "key": keys,
            "value": [f"v{e}".encode() for e in entries],
            "is_tombstone": [False] * len(entries),
            "properties": [[("n", str(e))] for e in entries],
            "publish_time": [1_000 + e for e in entries],
            "event_time": [None] * len(entries),
            "batch_index": [None] * len(entries),
            "batch_size": [None] * len(entries),
            "producer_name": [None] * len(entries),
            "sequence_id": [None] * len(entries),
            "deliver_at_time": [None] * len(entries),
            "ordering_key": [None] * len(entries),
            "schema_version": [None] * len(entries),
        },
        schema=ARROW_SCHEMA,
    )
    path = sealed_path(root, 1)
    pq.write_table(table, path, row_group_size=5)
    job = CompactionJob(
        topic_root=root,
        inputs=[path],
        input_ledger_ids=[1],
        previous_compacted=None,
        previous_horizon=None,
        horizon=Position(1, 11),
        output_ledger_id=2,
    )
    result = TwoPhaseCompactor(spark, min_part_bytes=0).compact(job)
    assert compacted(result.directory) == [
        (Position(1, 4), "b", b"v4", {"n": "4"}),
        (Position(1, 5), "a", b"v5", {"n": "5"}),
        (Position(1, 9), "c", b"v9", {"n": "9"}),
        (Position(1, 10), "e", b"v10", {"n": "10"}),
        (Position(1, 11), "d", b"v11", {"n": "11"}),
    ]


# ---------------------------------------------------------------- properties as dictionaries


def test_a_round_keeps_the_properties_of_ledgers_read_as_dictionaries_and_of_ledgers_not(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Two groups of two ledgers: one ledger's properties come as dictionaries, the other's
    # (plain pages) as strings, so each part's writer gets chunks of both kinds. Every ledger
    # has keys of its own: each holds winners.
    root = tmp_path / "ledgers" / "public" / "default" / "t"
    tables = {
        lid: _ledger_table(lid, (_repeating if lid % 2 else _overflowing)(3_000), keys=f"l{lid}-")
        for lid in (1, 2, 3, 4)
    }
    paths = {lid: _write_ledger(sealed_path(root, lid), table, 1_000) for lid, table in tables.items()}
    job = CompactionJob(
        topic_root=root,
        inputs=list(paths.values()),
        input_ledger_ids=list(paths),
        previous_compacted=None,
        previous_horizon=None,
        horizon=Position(4, 2_999),
        output_ledger_id=5,
    )
    result = TwoPhaseCompactor(spark, min_part_bytes=0).compact(job)
    expected = model(list(paths.items()))
    assert {e[0].ledger_id for e in expected} == {1, 2, 3, 4}
    assert compacted(result.directory) == expected
    assert len(CompactedLedger(result.directory).part_paths()) == 2
