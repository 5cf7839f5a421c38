"""A compacted topic's Iceberg table (``ledger.iceberg_table``) against real compacted ledgers
(the compactor on the session's Spark) and real readers: pyiceberg and DuckDB's iceberg
extension, both reading the metadata file a commit wrote.

The property behind the tests: after every round, the table's current snapshot holds exactly
the live rows of the compacted view (tombstones absent), row for row in message-id order, and
the snapshot before it the previous round's view."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import StaticTable
from pyspark.sql import SparkSession

from compactor import CompactionJob, CompactionResult, TwoPhaseCompactor
from ledger import iceberg_table
from ledger.compacted_store import CompactedLedger
from ledger.entry import Position, is_delete
from ledger.iceberg_io import location, path_at
from ledger.iceberg_schema import MESSAGE_FIELDS, MESSAGE_LAST_COLUMN_ID, table_schema
from ledger.iceberg_table import GRACE_MS, Committed, RoundState, commit_round, garbage, pinned, read_metadata
from ledger.layers import Manifest
from ledger.manifest_writer import describe_parts
from ledger.paths import sealed_path, table_dir
from ledger.schema import ARROW_SCHEMA
from ledger.storage import Storage, StoragePath
from tests.compactor.sealed_ledgers import Msg, compaction_job, ledger_rows
from tests.iceberg_readers import duckdb_connection

pytestmark = pytest.mark.spark

P = Position
COLUMNS = [
    "partition",
    "ledger_id",
    "entry_id",
    "batch_index",
    "key",
    "value",
    "properties",
    "publish_time",
    "event_time",
    "producer_name",
    "sequence_id",
]
DAY_MS = 24 * 3600 * 1000
Row = tuple[Any, ...]


class Topic:
    """A topic (or one partition of one) in a storage: its sealed ledgers, compacted by rounds
    whose results commit to the table at ``table``."""

    def __init__(self, storage: Storage, name: str, partition: int = -1) -> None:
        self.storage = storage
        self.partition = partition
        local = name if partition < 0 else f"{name}-partition-{partition}"
        self.root = storage.at(f"ledgers/public/default/{local}")
        self.table = table_dir(storage.at(""), "public", "default", name)
        self.ledgers: dict[int, StoragePath] = {}
        self.rounds: list[CompactionResult] = []

    def seal(self, ledger_id: int, messages: list[Msg], *, batch_size: int | None = None) -> None:
        rows = ledger_rows(ledger_id, messages)
        for i, row in enumerate(rows):
            row["batch_index"] = i % batch_size if batch_size else None
            row["batch_size"] = batch_size
            row["producer_name"] = "p" if i % 2 else None
            row["sequence_id"] = i if i % 2 else None
        path = sealed_path(self.root, ledger_id)
        staged = path.staging()
        pq.write_table(pa.Table.from_pylist(rows, schema=ARROW_SCHEMA), staged, row_group_size=5)
        path.publish(staged)
        self.ledgers[ledger_id] = path

    def compact(self, compactor: TwoPhaseCompactor, output: int, **kw: Any) -> CompactionResult:
        last = max(self.ledgers)
        rows = pq.read_metadata(self.ledgers[last].open()).num_rows
        previous = self.rounds[-1] if self.rounds else None
        job: CompactionJob = compaction_job(
            self.root, self.ledgers, sorted(self.ledgers), output, P(last, rows - 1), previous, **kw
        )
        result = compactor.compact(job)
        self.rounds.append(result)
        return result

    def state(self, result: CompactionResult | None = None, **kw: Any) -> RoundState:
        result = result or self.rounds[-1]
        return RoundState(
            partition=self.partition,
            ledger_dir=result.directory,
            ledger_id=result.ledger_id,
            horizon=result.horizon,
            round=len(self.rounds),
            **kw,
        )


def view(result: CompactionResult, partition: int = -1) -> list[Row]:
    """The compacted view's rows as the table must have them: what readCompacted delivers,
    less the tombstones it keeps, in message-id order."""
    entries, nxt = CompactedLedger(result.directory).read(P(0, 0), 1_000_000)
    assert nxt is None
    return [
        (
            partition,
            e.ledger_id,
            e.entry_id,
            e.batch_index,
            e.key,
            e.value,
            dict(e.properties),
            e.publish_time,
            e.event_time,
            e.producer_name,
            e.sequence_id,
        )
        for e in entries
        if not is_delete(e.key, e.value)
    ]


def _props(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        if set(value) == {"key", "value"} and isinstance(value["key"], list):
            return dict(zip(value["key"], value["value"], strict=True))
        return dict(value)
    return dict(value)


def _normal(rows: list[dict[str, Any]]) -> list[Row]:
    out = [tuple(_props(r[c]) if c == "properties" else r[c] for c in COLUMNS) for r in rows]
    return [tuple(bytes(v) if isinstance(v, bytearray | memoryview) else v for v in r) for r in out]


def io_properties(storage: Storage) -> dict[str, str]:
    """pyiceberg's FileIO settings to reach the storage's files (none on a local disk)."""
    if storage.local or storage.s3 is None:
        return {}
    props = {"s3.endpoint": storage.s3.endpoint_url or "", "s3.region": storage.s3.region or "us-east-1"}
    return {k: v for k, v in props.items() if v}


def pyiceberg_rows(
    storage: Storage, metadata: str, snapshot_id: int | None = None, where: str = ""
) -> list[Row]:
    table = StaticTable.from_metadata(metadata, properties=io_properties(storage))
    scan = (
        table.scan(snapshot_id=snapshot_id, row_filter=where)
        if where
        else table.scan(snapshot_id=snapshot_id)
    )
    got = (
        scan.to_arrow()
        .select(COLUMNS)
        .sort_by([("partition", "ascending"), ("ledger_id", "ascending"), ("entry_id", "ascending")])
    )
    return _normal(got.to_pylist())


def duckdb_for(storage: Storage) -> Any:
    """A DuckDB connection that reaches the storage's files."""
    return duckdb_connection(storage.s3 if not storage.local else None)


def duckdb_rows(storage: Storage, metadata: str) -> list[Row]:
    cols = ", ".join(f'"{c}"' for c in COLUMNS)
    cur = duckdb_for(storage).execute(
        f"SELECT {cols} FROM iceberg_scan(?) ORDER BY partition, ledger_id, entry_id", [metadata]
    )
    names = [d[0] for d in cur.description]
    return _normal([dict(zip(names, r, strict=True)) for r in cur.fetchall()])


def snapshots(storage: Storage, metadata: str) -> list[Any]:
    return sorted(read_metadata(storage, metadata).snapshots, key=lambda s: s.sequence_number)


@pytest.fixture
def compactor(spark: SparkSession) -> TwoPhaseCompactor:
    return TwoPhaseCompactor(spark, min_part_bytes=0)


def commit(
    topic: Topic, current: str | None, *, now_ms: int = 10_000, kept: int = 10, **kw: Any
) -> Committed:
    return commit_round(
        topic.table, current, topic.state(**kw), now_ms=now_ms, snapshots_kept=kept, max_age_ms=DAY_MS
    )


# ------------------------------------------------------------------ a topic's rounds


def test_every_round_is_a_snapshot_equal_to_the_compacted_view(
    storage: Storage, compactor: TwoPhaseCompactor
) -> None:
    """A full round (keyed, keyless and batched messages, tombstones kept by deleteRetentionMs),
    deltas whose deletion vectors grow, and a consolidation that replaces the base: after each,
    pyiceberg and DuckDB read the view, and the previous snapshot the previous view."""
    topic = Topic(storage, "t")
    kw = {"retain_null_key": True, "delete_retention_ms": 1500, "max_deltas": 3, "consolidation_ratio": 1.0}
    rounds: list[tuple[list[Msg], int | None]] = [
        (
            [(f"k{i}", b"v%d" % i) for i in range(12)] + [(None, b"keyless"), ("gone", b"x"), ("gone", None)],
            3,
        ),
        ([("k1", b"new"), ("k2", None), (None, b"keyless2"), ("k20", b"n")], None),
        ([("k3", b"newer"), ("k4", None), ("k5", b""), ("k20", None)], 2),
    ]
    current: str | None = None
    previous_view: list[Row] | None = None
    previous_snapshot: int | None = None
    for i, (messages, batch) in enumerate(rounds, start=1):
        topic.seal(i, messages, batch_size=batch)
        result = topic.compact(compactor, 100 + i, now_ms=1000 * i + 1000, **kw)
        committed = commit(topic, current, now_ms=1_000_000 + i)
        current = committed.metadata_location
        expected = view(result)
        assert pyiceberg_rows(storage, current) == expected, f"round {i}"
        assert duckdb_rows(storage, current) == expected, f"round {i}"
        if previous_view is not None:
            assert pyiceberg_rows(storage, current, previous_snapshot) == previous_view
        previous_view, previous_snapshot = expected, committed.snapshot_id
        summary = snapshots(storage, current)[-1].summary
        assert summary is not None
        assert (summary["compactor.round"], summary["compactor.ledger"], summary["compactor.partition"]) == (
            str(i),
            str(100 + i),
            "-1",
        )
        assert summary["compactor.horizon"] == f"{result.horizon.ledger_id}:{result.horizon.entry_id}"
        assert json.loads(summary["compactor.ledgers"]) == {"-1": 100 + i}
    manifest = topic.rounds[-1].manifest
    # The rounds did what the test is about: kept tombstones, deltas with dead rows, batches.
    assert [layer.kind for layer in manifest.layers] == ["base", "delta", "delta"]
    assert manifest.layers[0].dead > 0
    kept = CompactedLedger(topic.rounds[-1].directory).read(P(0, 0), 1000)[0]
    assert any(is_delete(e.key, e.value) for e in kept) and any(e.key is None for e in kept)
    assert any(e.batch_index is not None for e in kept)
    # The data files are the parts themselves, where they are.
    table = StaticTable.from_metadata(current, properties=io_properties(storage))
    data_files = {t.file.file_path for t in table.scan().plan_files()}
    assert data_files == {location(p) for p in CompactedLedger(topic.rounds[-1].directory).part_paths()}

    # A consolidation: one new base, the old layers and their delete files leave the table.
    topic.seal(4, [("k6", b"last")])
    result = topic.compact(
        compactor, 104, now_ms=5000, retain_null_key=True, delete_retention_ms=1500, max_deltas=0
    )
    assert [layer.kind for layer in result.manifest.layers] == ["base"]
    committed = commit(topic, current, now_ms=1_000_004)
    assert pyiceberg_rows(storage, committed.metadata_location) == view(result)
    assert duckdb_rows(storage, committed.metadata_location) == view(result)
    assert pyiceberg_rows(storage, committed.metadata_location, previous_snapshot) == previous_view
    assert committed.pinned == {-1: {101, 102, 103, 104}}


def test_a_delete_file_is_written_once_per_layer_and_vector(
    storage: Storage, compactor: TwoPhaseCompactor
) -> None:
    topic = Topic(storage, "t")
    topic.seal(1, [(f"k{i}", b"1") for i in range(10)])
    topic.compact(compactor, 11)
    first = commit(topic, None)
    topic.seal(2, [("k1", b"2")])  # the base gets a vector: one delete file
    topic.compact(compactor, 12, consolidation_ratio=1.0)
    second = commit(topic, first.metadata_location)
    topic.seal(3, [("k20", b"3")])  # a delta without deletes: the base's vector stays
    topic.compact(compactor, 13, consolidation_ratio=1.0)
    # Layers already in the table are not read again: their parts made unreadable, it commits.
    base = topic.rounds[0].directory
    away = [base / p.name for p in topic.rounds[0].manifest.parts]
    for p in away:
        p.with_name(p.name + ".away").write_bytes(p.read_bytes())
        p.unlink()
    try:
        third = commit(topic, second.metadata_location)
    finally:
        for p in away:
            p.write_bytes(p.with_name(p.name + ".away").read_bytes())
            p.with_name(p.name + ".away").unlink()
    deletes = [f.key for f in storage.list(topic.table.key + "/deletes")]
    assert len(deletes) == 1 and deletes[0].endswith(".parquet")
    topic.seal(4, [("k2", b"4")])  # the vector grows: a new file, the old one still named by snapshot 2
    topic.compact(compactor, 14, consolidation_ratio=1.0)
    fourth = commit(topic, third.metadata_location)
    assert len(storage.list(topic.table.key + "/deletes")) == 2
    assert pyiceberg_rows(storage, fourth.metadata_location) == view(topic.rounds[-1])
    assert pyiceberg_rows(storage, fourth.metadata_location, third.snapshot_id) == view(topic.rounds[-2])
    # A commit on the same state again (as after a lost compare-and-swap) does not take up the
    # file the first one wrote: no snapshot of its table names it, garbage being collected.
    retry = commit(topic, third.metadata_location)
    assert len(storage.list(topic.table.key + "/deletes")) == 3
    assert pyiceberg_rows(storage, retry.metadata_location) == view(topic.rounds[-1])
    # A table's files are written under new names only: nothing of an older commit changed.
    assert first.metadata_location != second.metadata_location
    assert read_metadata(storage, second.metadata_location).current_snapshot_id == second.snapshot_id


def test_a_partitioned_topic_is_one_table_partitioned_by_index(
    storage: Storage, compactor: TwoPhaseCompactor
) -> None:
    p0, p1 = Topic(storage, "pt", 0), Topic(storage, "pt", 1)
    p0.seal(1, [("a", b"0"), ("b", b"0"), ("a", b"1")])
    p1.seal(2, [("a", b"p1"), ("c", b"p1")])
    p0.compact(compactor, 10)
    p1.compact(compactor, 20)
    first = commit(p0, None)
    second = commit(p1, first.metadata_location)
    assert pyiceberg_rows(storage, second.metadata_location) == view(p0.rounds[-1], 0) + view(
        p1.rounds[-1], 1
    )
    p0.seal(3, [("b", None), ("d", b"0")])
    p0.compact(compactor, 11, consolidation_ratio=1.0)
    third = commit(p0, second.metadata_location)
    expected = view(p0.rounds[-1], 0) + view(p1.rounds[-1], 1)
    assert pyiceberg_rows(storage, third.metadata_location) == expected
    assert duckdb_rows(storage, third.metadata_location) == expected
    assert pyiceberg_rows(storage, third.metadata_location, where="partition = 1") == view(p1.rounds[-1], 1)
    # Partition 1's files keep their entries (and sequence numbers) when partition 0 commits.
    table = StaticTable.from_metadata(third.metadata_location, properties=io_properties(storage))
    sequences = {t.file.partition[0]: t.file for t in table.scan().plan_files()}
    assert set(sequences) == {0, 1}
    entries = {
        e.data_file.file_path: e.sequence_number
        for m in table.current_snapshot().manifests(table.io)  # type: ignore[union-attr]
        for e in m.fetch_manifest_entry(table.io)
    }
    p1_parts = [location(p) for p in CompactedLedger(p1.rounds[-1].directory).part_paths()]
    assert {entries[p] for p in p1_parts} == {2}
    summary = snapshots(storage, third.metadata_location)[-1].summary
    assert summary is not None and json.loads(summary["compactor.ledgers"]) == {"0": 11, "1": 20}
    assert pinned(storage, third.metadata_location) == {0: {10, 11}, 1: {20}}


def test_a_round_that_deletes_every_key_leaves_an_empty_table(
    storage: Storage, compactor: TwoPhaseCompactor
) -> None:
    topic = Topic(storage, "t")
    topic.seal(1, [("a", b"1"), ("b", b"1")])
    topic.compact(compactor, 10)
    first = commit(topic, None)
    topic.seal(2, [("a", None), ("b", b"")])
    assert topic.compact(compactor, 11).manifest.layers == ()
    second = commit(topic, first.metadata_location)
    assert (
        pyiceberg_rows(storage, second.metadata_location)
        == duckdb_rows(storage, second.metadata_location)
        == []
    )
    assert pyiceberg_rows(storage, second.metadata_location, first.snapshot_id) == view(topic.rounds[0])
    assert second.pinned == {-1: {10, 11}}


# ------------------------------------------------------------------ expiry, pins and garbage


@pytest.fixture
def one_ledger(storage: Storage, compactor: TwoPhaseCompactor) -> Iterator[Topic]:
    topic = Topic(storage, "e")
    topic.seal(1, [(f"k{i}", b"1") for i in range(5)])
    topic.compact(compactor, 11)
    yield topic


def rounds_of(
    topic: Topic, compactor: TwoPhaseCompactor, n: int, *, kept: int, step_ms: int
) -> list[Committed]:
    out: list[Committed] = []
    for i in range(n):
        if i:
            topic.seal(1 + i, [(f"k{i}", b"%d" % i)])
            topic.compact(compactor, 11 + i, consolidation_ratio=1.0)
        current = out[-1].metadata_location if out else None
        out.append(commit(topic, current, now_ms=1_000_000 + i * step_ms, kept=kept))
    return out


def test_expiry_keeps_the_newest_snapshots_and_pins_their_ledgers(
    storage: Storage, one_ledger: Topic, compactor: TwoPhaseCompactor
) -> None:
    done = rounds_of(one_ledger, compactor, 4, kept=2, step_ms=1)
    last = done[-1].metadata_location
    assert [s.snapshot_id for s in snapshots(storage, last)] == [done[2].snapshot_id, done[3].snapshot_id]
    assert done[-1].pinned == pinned(storage, last) == {-1: {13, 14}}
    assert pyiceberg_rows(storage, last, done[2].snapshot_id) == view(one_ledger.rounds[2])


def test_expiry_by_age_keeps_the_current_snapshot(
    storage: Storage, one_ledger: Topic, compactor: TwoPhaseCompactor
) -> None:
    table_dir_ = one_ledger.table
    first = commit(one_ledger, None, now_ms=1_000_000)
    one_ledger.seal(2, [("k1", b"2")])
    one_ledger.compact(compactor, 12, consolidation_ratio=1.0)
    young = commit_round(
        table_dir_,
        first.metadata_location,
        one_ledger.state(),
        now_ms=1_000_500,
        snapshots_kept=10,
        max_age_ms=1000,
    )
    assert len(snapshots(storage, young.metadata_location)) == 2  # 500 ms old: kept
    old = commit_round(
        table_dir_,
        young.metadata_location,
        one_ledger.state(),
        now_ms=1_000_000 + 5000,
        snapshots_kept=10,
        max_age_ms=1000,
    )
    assert [s.snapshot_id for s in snapshots(storage, old.metadata_location)] == [old.snapshot_id]
    assert old.pinned == {-1: {12}}


def test_garbage_is_what_the_kept_snapshots_no_longer_name(
    storage: Storage, one_ledger: Topic, compactor: TwoPhaseCompactor
) -> None:
    done = rounds_of(one_ledger, compactor, 4, kept=2, step_ms=1)
    last = done[-1].metadata_location
    table = one_ledger.table
    found = {location(p) for p in garbage(table, last, grace_ms=0)}
    # The two older metadata files go; the current one and the one before it stay.
    assert done[0].metadata_location in found and done[1].metadata_location in found
    assert last not in found and done[2].metadata_location not in found
    assert [e.metadata_file for e in read_metadata(storage, last).metadata_log] == [done[2].metadata_location]
    expired = snapshots(storage, done[1].metadata_location)
    assert all(
        s.manifest_list in found
        for s in expired
        if s.snapshot_id in (done[0].snapshot_id, done[1].snapshot_id)
    )
    # A failed commit's files (written, never swapped in) are garbage too, once older than a
    # commit in progress could be; younger, they may be another partition's commit's.
    failed = commit(one_ledger, last, now_ms=2_000_000, kept=2)
    assert failed.metadata_location not in {location(p) for p in garbage(table, last)}
    later = int(time.time() * 1000) + GRACE_MS + 1
    found = {location(p) for p in garbage(table, last, now_ms=later)}
    assert failed.metadata_location in found
    for p in garbage(table, last, now_ms=later):
        p.unlink()
    assert garbage(table, last, now_ms=later) == []
    assert pyiceberg_rows(storage, last) == view(one_ledger.rounds[-1])
    assert pyiceberg_rows(storage, last, done[2].snapshot_id) == view(one_ledger.rounds[2])
    assert duckdb_rows(storage, last) == view(one_ledger.rounds[-1])
    assert path_at(storage, last).is_file()


def test_locations_name_files_of_the_storage(storage: Storage) -> None:
    path = storage.at("tables/a/b/c/metadata/x.json")
    assert path_at(storage, location(path)) == path
    with pytest.raises(ValueError):
        path_at(storage, "/elsewhere/x.json" if storage.local else "s3://other-bucket/x.json")
    assert iceberg_table.LEDGERS == "compactor.ledgers"


# ------------------------------------------------------------------ typed value columns


def test_a_typed_column_keeps_its_id_while_its_name_and_type_stay() -> None:
    first, last = table_schema(
        pa.schema([("name", pa.string()), ("age", pa.int64())]), None, MESSAGE_LAST_COLUMN_ID
    )
    assert [f.name for f in first.fields][-2:] == ["name", "age"] and first.schema_id == 0
    ids = {f.name: f.field_id for f in first.fields}
    assert last == max(ids.values()) > MESSAGE_LAST_COLUMN_ID
    same, again = table_schema(pa.schema([("name", pa.string()), ("age", pa.int64())]), first, last)
    assert same is first and again == last
    nested = pa.struct([("city", pa.string()), ("zip", pa.int32())])
    changed, newest = table_schema(
        pa.schema([("name", pa.string()), ("age", pa.string()), ("home", nested)]), first, last
    )
    new_ids = {f.name: f.field_id for f in changed.fields}
    assert changed.schema_id == 1
    assert new_ids["name"] == ids["name"] and new_ids["age"] > last and new_ids["home"] > last
    assert newest == changed.highest_field_id
    # The message columns never change.
    assert all(new_ids[f.name] == ids[f.name] for f in MESSAGE_FIELDS)
    with pytest.raises(ValueError, match="key"):
        table_schema(pa.schema([("key", pa.string())]), None, MESSAGE_LAST_COLUMN_ID)


def typed_ledger(topic: Topic, source: CompactionResult, ledger_id: int, columns: pa.Schema) -> StoragePath:
    """A compacted ledger like ``source`` whose one part also holds typed value columns (as
    the compactor writes them for a topic with a JSON schema): ``name`` and ``age`` from the
    value ``name:age``, null where the value is not of that form."""
    directory = topic.root / f"compacted-{ledger_id:020d}"
    table = pa.concat_tables(pq.read_table(p.open()) for p in CompactedLedger(source.directory).part_paths())
    values = [v.decode() if v else "" for v in table.column("value").to_pylist()]
    parsed = [v.split(":") if v.count(":") == 1 else [None, None] for v in values]
    table = table.append_column("name", pa.array([p[0] for p in parsed], pa.string()))
    table = table.append_column("age", pa.array([int(p[1]) if p[1] else None for p in parsed], pa.int64()))
    part = directory / "part-00000.parquet"
    staged = part.staging()
    pq.write_table(
        table.select([*ARROW_SCHEMA.names, *[n for n in columns.names if n in table.column_names]]), staged
    )
    part.publish(staged)
    Manifest(layers=(describe_parts(directory),)).write(directory)
    return directory


def test_typed_value_columns_read_by_name_and_null_in_parts_without_them(
    storage: Storage, compactor: TwoPhaseCompactor
) -> None:
    topic = Topic(storage, "typed")
    topic.seal(1, [("a", b"ann:31"), ("b", b"bob:42"), ("c", b"not json"), (None, b"eve:7")])
    result = topic.compact(compactor, 10, retain_null_key=True)
    columns = pa.schema([("name", pa.string()), ("age", pa.int64())])
    directory = typed_ledger(topic, result, 11, columns)
    state = RoundState(-1, directory, 11, result.horizon, 1, value_columns=columns)
    first = commit_round(topic.table, None, state, now_ms=1, snapshots_kept=5, max_age_ms=DAY_MS)
    expected = [("ann", 31), ("bob", 42), (None, None), ("eve", 7)]
    table = StaticTable.from_metadata(first.metadata_location, properties=io_properties(storage))
    got = table.scan(selected_fields=("entry_id", "name", "age")).to_arrow().sort_by("entry_id")
    assert list(zip(got.column("name").to_pylist(), got.column("age").to_pylist(), strict=True)) == expected
    rows = duckdb_for(storage).execute(
        "SELECT name, age FROM iceberg_scan(?) ORDER BY entry_id", [first.metadata_location]
    )
    assert rows.fetchall() == expected
    # A later schema adds a column: the others keep their ids, the new one reads null in
    # parts written before it; a round of parts without typed columns reads nulls throughout.
    wider = columns.append(pa.field("city", pa.string()))
    second = commit_round(
        topic.table,
        first.metadata_location,
        replace(state, value_columns=wider, round=2),
        now_ms=2,
        snapshots_kept=5,
        max_age_ms=DAY_MS,
    )
    before, after = (read_metadata(storage, c.metadata_location).schema() for c in (first, second))
    assert after.schema_id == before.schema_id + 1
    assert after.find_field("age").field_id == before.find_field("age").field_id
    table = StaticTable.from_metadata(second.metadata_location, properties=io_properties(storage))
    got = table.scan(selected_fields=("entry_id", "name", "city")).to_arrow().sort_by("entry_id")
    assert got.column("name").to_pylist() == ["ann", "bob", None, "eve"]
    assert got.column("city").to_pylist() == [None] * 4
    plain = commit_round(
        topic.table,
        second.metadata_location,
        replace(topic.state(), value_columns=wider),
        now_ms=3,
        snapshots_kept=5,
        max_age_ms=DAY_MS,
    )
    table = StaticTable.from_metadata(plain.metadata_location, properties=io_properties(storage))
    got = table.scan(selected_fields=("key", "name", "age")).to_arrow()
    assert got.column("name").null_count == got.num_rows == len(view(result))
