"""The TwoPhaseCompactor end to end on real files (after Pulsar's CompactionTest)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from compactor import CompactionJob, CompactionResult, TwoPhaseCompactor, arrow_phases, round_plan
from compactor.phases import NARROW_COLUMNS, phase_one
from compactor.spark import explain_string, get_spark, local_cores, spark_conf
from compactor.two_phase import shared_group
from ledger.checksums import file_checksum
from ledger.compacted_store import MANIFEST_NAME, CompactedLedger
from ledger.entry import Position, is_delete
from ledger.files import TMP_SUFFIX
from ledger.manifest_writer import write_manifest
from ledger.paths import compacted_dir, sealed_path
from ledger.schema import ARROW_SCHEMA, FIRST_COLUMNS
from ledger.storage import StoragePath, as_storage_path
from tests.compactor.sealed_ledgers import Msg, compaction_job

pytestmark = pytest.mark.spark

Kept = tuple[Position, str | None, bytes | None]


# ------------------------------------------------------------------ factories


@dataclass
class Topic:
    """A topic directory whose sealed ledgers are written with pyarrow, as the broker seals them."""

    root: Path
    ledgers: dict[int, Path] = field(default_factory=dict)

    def seal(
        self,
        ledger_id: int,
        messages: Sequence[Msg],
        *,
        legacy: bool = False,
        before_batches: bool = False,
        batch_size: int | None = None,
    ) -> Path:
        """``legacy``: as sealed before empty values deleted (only a null value flagged, and
        no rule in the schema metadata). ``before_batches``: without the batch columns, as
        sealed before Pulsar's batches. ``batch_size``: the messages are members of batches of
        that size, one after the other."""
        rows = [
            {
                "ledger_id": ledger_id,
                "entry_id": i,
                "key": key,
                "value": value,
                "is_tombstone": value is None if legacy else is_delete(key, value),
                "properties": [("seq", str(i))],
                "publish_time": 1_000 + i,
                "event_time": None,
                "batch_index": i % batch_size if batch_size else None,
                "batch_size": batch_size,
            }
            for i, (key, value) in enumerate(messages)
        ]
        path = sealed_path(self.root, ledger_id)
        schema = ARROW_SCHEMA.remove_metadata() if legacy else ARROW_SCHEMA
        table = pa.Table.from_pylist(rows, schema=schema)
        if before_batches:
            table = table.select(list(FIRST_COLUMNS))
        pq.write_table(table, path, row_group_size=4)
        self.ledgers[ledger_id] = path
        return path

    def job(
        self,
        output_ledger_id: int,
        *,
        horizon: Position,
        ledger_ids: Sequence[int] | None = None,
        previous: CompactionResult | None = None,
        retain_null_key: bool = False,
    ) -> CompactionJob:
        ids = sorted(self.ledgers) if ledger_ids is None else list(ledger_ids)
        return compaction_job(
            self.root, self.ledgers, ids, output_ledger_id, horizon, previous, retain_null_key=retain_null_key
        )


@pytest.fixture
def topic(tmp_path: Path) -> Topic:
    root = tmp_path / "ledgers" / "public" / "default" / "t"
    root.mkdir(parents=True)
    return Topic(root)


@pytest.fixture
def compactor(spark: SparkSession) -> TwoPhaseCompactor:
    # One group per core even for tiny topics, so every round crosses group boundaries.
    return TwoPhaseCompactor(spark, min_part_bytes=0)


def kept(result: CompactionResult | Path) -> list[Kept]:
    """What a reader of the compacted ledger sees, via the Spark-free reader."""
    directory = result if isinstance(result, Path) else result.directory
    entries, nxt = CompactedLedger(directory).read(Position(0, 0), 1_000_000)
    assert nxt is None
    return [(e.position, e.key, e.value) for e in entries]


def leftovers(topic: Topic) -> list[str]:
    return sorted(p.name for p in topic.root.iterdir() if not p.name.endswith(".parquet"))


@contextmanager
def session_conf(spark: SparkSession, **conf: str) -> Iterator[None]:
    old = {k: spark.conf.get(k) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            spark.conf.set(k, v)


P = Position


# ------------------------------------------------------------------ what is kept


def test_latest_value_per_key_keeps_its_original_id(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [("a", b"a0"), ("b", b"b0"), ("a", b"a1"), ("c", b"c0"), ("b", b"b1")])
    result = compactor.compact(topic.job(2, horizon=P(1, 4)))

    assert kept(result) == [(P(1, 2), "a", b"a1"), (P(1, 3), "c", b"c0"), (P(1, 4), "b", b"b1")]
    assert str(result.directory) == str(compacted_dir(topic.root, 2))
    assert (result.ledger_id, result.horizon) == (2, P(1, 4))
    assert (result.entries_read, result.records_kept, result.records_removed) == (5, 3, 2)
    assert result.bytes_in == topic.ledgers[1].stat().st_size
    assert result.bytes_out == result.manifest.size_bytes > 0
    assert result.phase_one_ms >= 0 and result.phase_two_ms >= 0
    # Nothing but part files, their key indexes and the manifest; no temporary directory left.
    names = sorted(p.name for p in result.directory.local.iterdir())  # type: ignore[union-attr]
    assert names[0] == MANIFEST_NAME
    assert all(n.startswith("part-") and n.endswith((".parquet", ".keys.arrow")) for n in names[1:])
    assert all(p.keys is not None for p in result.manifest.parts)
    assert leftovers(topic) == [result.directory.name]
    # Properties and times come through untouched.
    first = CompactedLedger(result.directory).read(P(1, 2), 1)[0][0]
    assert (first.properties, first.publish_time, first.event_time) == ({"seq": "2"}, 1_002, None)


@pytest.mark.parametrize("strategy", ["offset", "eventTime"])
def test_ledgers_from_before_batches_and_batch_members_compact_together(
    topic: Topic, compactor: TwoPhaseCompactor, strategy: str
) -> None:
    # An upgraded topic: ledger 1 sealed before the batch columns existed, ledger 2 with
    # members of Pulsar batches of 3. Both kinds are read in one round (the Arrow path and,
    # for the event-time strategy, Spark SQL), and members keep their index and size.
    topic.seal(1, [("a", b"a0"), ("b", b"b0"), ("c", b"c0")], before_batches=True)
    topic.seal(
        2, [("a", b"a1"), ("d", b"d0"), ("b", None), ("e", b"e0"), ("d", b"d1"), ("f", b"f0")], batch_size=3
    )
    job = dataclasses.replace(topic.job(3, horizon=P(2, 5)), strategy=strategy)
    result = compactor.compact(job)
    entries, _ = CompactedLedger(result.directory).read(P(0, 0), 100)
    assert [(e.position, e.key, e.batch_index, e.batch_size, e.message_id) for e in entries] == [
        (P(1, 2), "c", None, None, "1:2"),
        (P(2, 0), "a", 0, 3, "2:0:0"),
        (P(2, 3), "e", 0, 3, "2:3:0"),
        (P(2, 4), "d", 1, 3, "2:3:1"),
        (P(2, 5), "f", 2, 3, "2:3:2"),
    ]


def test_tombstone_removes_its_key(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [("a", b"a0"), ("b", b"b0"), ("a", None), ("c", b"c0")])
    assert kept(compactor.compact(topic.job(2, horizon=P(1, 3)))) == [
        (P(1, 1), "b", b"b0"),
        (P(1, 3), "c", b"c0"),
    ]


def test_last_key_deleted(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [("a", b"a0"), ("b", b"b0"), ("b", None)])
    assert kept(compactor.compact(topic.job(2, horizon=P(1, 2)))) == [(P(1, 0), "a", b"a0")]


def test_key_written_again_after_its_tombstone(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [("a", b"a0"), ("a", None), ("a", b"a2")])
    assert kept(compactor.compact(topic.job(2, horizon=P(1, 2)))) == [(P(1, 2), "a", b"a2")]


def test_only_tombstones_give_an_empty_compacted_ledger(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [("a", None), ("b", None)])
    result = compactor.compact(topic.job(2, horizon=P(1, 1)))
    assert kept(result) == []
    assert result.manifest.parts == ()
    assert (result.entries_read, result.records_kept, result.records_removed) == (2, 0, 2)
    ledger = CompactedLedger(result.directory)
    assert (ledger.entries, ledger.size_bytes, ledger.first_position) == (0, 0, None)


def test_no_input_at_all_gives_an_empty_compacted_ledger(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    result = compactor.compact(topic.job(5, horizon=P(4, 0), ledger_ids=[]))
    assert kept(result) == []
    assert (result.entries_read, result.bytes_in, result.bytes_out) == (0, 0, 0)


def test_an_empty_value_deletes_its_key_as_in_pulsar(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    # Pulsar's rule: a keyed message with an empty payload is a delete, as a null one is.
    topic.seal(1, [("a", b"a0"), ("b", b"b0"), ("a", b""), ("c", b""), ("b", b"b1")])
    topic.seal(2, [("d", b"d0"), ("d", b"")])
    result = compactor.compact(topic.job(3, horizon=P(2, 1)))
    assert kept(result) == [(P(1, 4), "b", b"b1")]
    assert (result.entries_read, result.records_kept, result.records_removed) == (7, 1, 6)
    # A later round: the key written again lives; an empty value deletes a compacted key.
    topic.seal(4, [("a", b"a2"), ("b", b"")])
    again = compactor.compact(topic.job(5, horizon=P(4, 1), ledger_ids=[4], previous=result))
    assert kept(again) == [(P(4, 0), "a", b"a2")]


def test_keyless_empty_values_are_kept_with_retain_null_key(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    # The rule is about keys: a keyless message is never deduplicated; only a null one drops.
    topic.seal(1, [(None, b""), ("a", b""), (None, None), (None, b"n")])
    assert kept(compactor.compact(topic.job(2, horizon=P(1, 3), retain_null_key=True))) == [
        (P(1, 0), None, b""),
        (P(1, 3), None, b"n"),
    ]


@pytest.mark.parametrize("ids", ["packed", "struct"])
def test_files_sealed_before_empty_values_deleted_are_read_by_todays_rule(
    tmp_path: Path, compactor: TwoPhaseCompactor, ids: str
) -> None:
    # Ledgers sealed by an earlier version flag only null values; their flags are derived
    # again from the values, in both paths (Arrow when ids pack, Spark SQL when they do not).
    first = 7 if ids == "packed" else 2**31 + 5
    topic = Topic(tmp_path / ids)
    topic.root.mkdir()
    topic.seal(first, [("a", b"a0"), ("b", b"b0"), ("a", b""), (None, b""), ("c", None)], legacy=True)
    topic.seal(first + 1, [("b", b""), ("d", b"d0")])
    job = topic.job(first + 2, horizon=P(first + 1, 1), retain_null_key=True)
    inputs = compactor.inputs(job)
    assert inputs.packed == (ids == "packed")
    assert inputs.derive_deletes == {as_storage_path(topic.ledgers[first])}
    result = compactor.compact(job)
    assert kept(result) == [(P(first, 3), None, b""), (P(first + 1, 1), "d", b"d0")]


def test_a_compacted_ledger_written_before_the_rule_loses_its_empty_values(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    # A compacted ledger of an earlier version may hold a key whose latest value is empty.
    topic.seal(1, [("a", b"a0"), ("b", b"b0"), ("a", b"")], legacy=True)
    directory = compacted_dir(topic.root, 2)
    directory.mkdir()
    rows = [(1, 1, "b", b"b0"), (1, 2, "a", b"")]
    old_part = pa.Table.from_pylist(
        [
            dict(
                ledger_id=lid, entry_id=eid, key=k, value=v, is_tombstone=False, properties=[], publish_time=1
            )
            for lid, eid, k, v in rows
        ],
        schema=ARROW_SCHEMA.remove_metadata(),
    )
    pq.write_table(old_part, directory / "part-00000.parquet")
    write_manifest(directory)
    assert kept(directory) == [(P(1, 1), "b", b"b0"), (P(1, 2), "a", b"")]

    @dataclass
    class Previous:
        directory: Path
        horizon: Position

    topic.seal(3, [("c", b"c0")])
    job = topic.job(4, horizon=P(3, 0), ledger_ids=[3], previous=Previous(directory, P(1, 2)))  # type: ignore[arg-type]
    assert compactor.inputs(job).derive_deletes == {as_storage_path(directory / "part-00000.parquet")}
    assert kept(compactor.compact(job)) == [(P(1, 1), "b", b"b0"), (P(3, 0), "c", b"c0")]


def test_keyless_messages_dropped_by_default(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [(None, b"n0"), ("a", b"a0"), (None, b"n1")])
    result = compactor.compact(topic.job(2, horizon=P(1, 2)))
    assert kept(result) == [(P(1, 1), "a", b"a0")]
    assert (result.entries_read, result.records_removed) == (3, 2)


def test_keyless_messages_kept_in_order_with_retain_null_key(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    topic.seal(1, [(None, b"n0"), ("a", b"a0"), (None, b"n1"), ("a", b"a1"), (None, None)])
    topic.seal(2, [(None, b"n2"), ("b", b"b0")])
    result = compactor.compact(topic.job(3, horizon=P(2, 1), retain_null_key=True))
    assert kept(result) == [
        (P(1, 0), None, b"n0"),
        (P(1, 2), None, b"n1"),
        (P(1, 3), "a", b"a1"),
        (P(2, 0), None, b"n2"),
        (P(2, 1), "b", b"b0"),
    ]


# ------------------------------------------------------------------ rounds and horizons


def test_second_round_merges_with_the_previous_compacted_ledger(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    topic.seal(1, [("once", b"long ago"), ("a", b"a0"), ("gone", b"g0")])
    first = compactor.compact(topic.job(2, horizon=P(1, 2)))
    topic.seal(3, [("a", b"a1"), ("gone", None), ("new", b"n0")])
    # Ledger 1 is still passed: its rows are at or before the previous horizon and must not count twice.
    second = compactor.compact(topic.job(4, horizon=P(3, 2), previous=first, ledger_ids=[1, 3]))

    assert kept(second) == [(P(1, 0), "once", b"long ago"), (P(3, 0), "a", b"a1"), (P(3, 2), "new", b"n0")]
    assert second.entries_read == 3 + 3  # previous compacted ledger + the new ledger
    # A delta round: it read the new ledger and the first round's key index, not its parts.
    index = first.directory / first.manifest.parts[0].keys  # type: ignore[operator]
    assert second.bytes_in == topic.ledgers[3].stat().st_size + index.size()
    assert [layer.kind for layer in second.manifest.layers] == ["base", "delta"]
    # The previous compacted ledger is the caller's to delete; the compactor left it alone.
    assert kept(first) == [(P(1, 0), "once", b"long ago"), (P(1, 1), "a", b"a0"), (P(1, 2), "gone", b"g0")]

    topic.seal(5, [("new", None)])
    third = compactor.compact(topic.job(6, horizon=P(5, 0), previous=second, ledger_ids=[5]))
    assert kept(third) == [(P(1, 0), "once", b"long ago"), (P(3, 0), "a", b"a1")]


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_incremental_round_in_one_spark_job_or_two_equals_a_full_round(
    spark: SparkSession,
    topic: Topic,
    compactor: TwoPhaseCompactor,
    monkeypatch: pytest.MonkeyPatch,
    jobs: int,
) -> None:
    # The compactor runs both phases in one job when the new rows are few; force each way.
    monkeypatch.setattr(arrow_phases, "_ONE_JOB_NEW_SHARE", 0 if jobs == 1 else 10**9)
    for lid in range(1, 7):
        topic.seal(lid, [(f"k{(lid * 5 + i) % 23}", f"{lid}:{i}".encode()) for i in range(20)])
    first = compactor.compact(topic.job(10, horizon=P(6, 19)))
    # New: overwrites, deletes (of old keys, and of a key only in the new rows), new keys.
    topic.seal(7, [("k3", b"7:0"), ("k4", None), ("fresh", b"7:2"), ("k3", b"7:3"), ("short", b"x")])
    topic.seal(8, [("short", None), ("k5", None), ("k6", b"8:2")])
    sc = spark.sparkContext
    group = f"incremental-round-{jobs}-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "counting the round's Spark jobs")
    try:
        second = compactor.compact(topic.job(11, horizon=P(8, 2), previous=first, ledger_ids=[7, 8]))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert len(sc.statusTracker().getJobIdsForGroup(group)) == jobs
    full = compactor.compact(topic.job(12, horizon=P(8, 2)))
    assert kept(second) == kept(full)
    assert {k for _, k, _ in kept(second)} == ({f"k{i}" for i in range(23)} - {"k4", "k5"}) | {"fresh"}
    assert second.entries_read == first.records_kept + 8


def test_rows_after_the_horizon_are_left_for_the_next_round(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    topic.seal(1, [("a", b"a0"), ("b", b"b0"), ("a", None), ("b", b"b1")])
    first = compactor.compact(topic.job(2, horizon=P(1, 1)))
    assert kept(first) == [(P(1, 0), "a", b"a0"), (P(1, 1), "b", b"b0")]
    assert first.entries_read == 2

    # Same ledger, horizon moved to its end: only (1,1] .. (1,3] are new.
    second = compactor.compact(topic.job(3, horizon=P(1, 3), previous=first))
    assert kept(second) == [(P(1, 3), "b", b"b1")]
    assert second.entries_read == 2 + 2


def test_ledgers_past_the_horizon_are_not_read(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [("a", b"a0")])
    topic.seal(2, [("a", b"a1")])
    result = compactor.compact(topic.job(3, horizon=P(1, 0)))
    assert kept(result) == [(P(1, 0), "a", b"a0")]
    assert result.bytes_in == topic.ledgers[1].stat().st_size


def test_large_ledger_ids_fall_back_to_struct_ids(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    small, big = 7, 2**31 + 5
    msgs: list[Msg] = [("a", b"a0"), ("b", b"b0"), ("a", None), ("c", b"c0"), (None, b"n")]
    later: list[Msg] = [("b", b"b1"), ("c", None), ("d", b"d0")]

    topic.seal(small, msgs)
    topic.seal(small + 1, later)
    assert compactor.inputs(topic.job(100, horizon=P(small + 1, 2))).packed
    expected_small = kept(compactor.compact(topic.job(100, horizon=P(small + 1, 2), retain_null_key=True)))

    other = Topic(topic.root.with_name("big"))
    other.root.mkdir()
    other.seal(big, msgs)
    other.seal(big + 1, later)
    job = other.job(big + 2, horizon=P(big + 1, 2), retain_null_key=True)
    assert not compactor.inputs(job).packed
    got = kept(compactor.compact(job))
    shift = big - small
    assert got == [(P(p.ledger_id + shift, p.entry_id), k, v) for p, k, v in expected_small]
    assert got == [(P(big, 4), None, b"n"), (P(big + 1, 0), "b", b"b1"), (P(big + 1, 2), "d", b"d0")]


@pytest.mark.parametrize("first_ledger", [2**30 - 1, 2**31 - 2], ids=["below-2^30", "near-2^31"])
def test_every_packable_ledger_id_compacts_the_same(
    topic: Topic, compactor: TwoPhaseCompactor, first_ledger: int
) -> None:
    # Phase one folds ``id << 1 | tombstone`` while ledger ids are below 2**30, and the
    # columns themselves above: the two must agree, including across that boundary.
    topic.seal(first_ledger, [("a", b"a0"), ("b", b"b0"), ("a", None), ("c", b"c0"), (None, b"n")])
    topic.seal(first_ledger + 1, [("b", b"b1"), ("c", None), ("d", b"d0"), ("e", b"e0"), ("e", None)])
    job = topic.job(first_ledger + 2, horizon=P(first_ledger + 1, 4), retain_null_key=True)
    assert compactor.inputs(job).packed
    assert kept(compactor.compact(job)) == [
        (P(first_ledger, 4), None, b"n"),
        (P(first_ledger + 1, 0), "b", b"b1"),
        (P(first_ledger + 1, 2), "d", b"d0"),
    ]


# ------------------------------------------------------------------ layout and plans


def test_output_spread_over_many_parts_stays_in_id_order(
    spark: SparkSession, topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    for lid in range(1, 5):
        topic.seal(lid, [(f"k{(lid * 7 + i) % 40}", f"{lid}:{i}".encode()) for i in range(30)])
    with session_conf(spark, **{"spark.sql.adaptive.coalescePartitions.enabled": "false"}):
        result = compactor.compact(topic.job(9, horizon=P(4, 29)))
    assert len(result.manifest.parts) > 1
    # Only the parts, their key indexes and the manifest: no scratch of the phases, no attempt files.
    assert sorted(p.name for p in result.directory.local.iterdir()) == sorted(  # type: ignore[union-attr]
        [MANIFEST_NAME, *(n for p in result.manifest.parts for n in (p.name, p.keys))]
    )
    rows = kept(result)
    assert [p for p, _, _ in rows] == sorted(p for p, _, _ in rows)
    assert len({k for _, k, _ in rows}) == len(rows) == 40
    # Every key's last write wins.
    last: dict[str, Position] = {}
    for lid in range(1, 5):
        for i in range(30):
            last[f"k{(lid * 7 + i) % 40}"] = P(lid, i)
    assert sorted(p for p, _, _ in rows) == sorted(last.values())
    # Page through all parts with a small page size: nothing lost, nothing repeated.
    ledger, start, paged = CompactedLedger(result.directory), P(0, 0), []
    while start is not None:
        page, start = ledger.read(start, 3)
        paged.extend(e.position for e in page)
    assert paged == [p for p, _, _ in rows]


def test_a_small_round_writes_one_part_by_default(spark: SparkSession, topic: Topic) -> None:
    for lid in range(1, 5):
        topic.seal(lid, [(f"k{i % 7}", f"{lid}:{i}".encode()) for i in range(30)])
    result = TwoPhaseCompactor(spark).compact(topic.job(9, horizon=P(4, 29)))
    assert len(result.manifest.parts) == 1
    assert [(p, k, v) for p, k, v in kept(result)] == [
        (P(4, i), f"k{i % 7}", f"4:{i}".encode()) for i in range(23, 30)
    ]


def test_phase_one_reads_only_the_narrow_columns(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [("a", b"a0"), ("a", b"a1")])
    first = compactor.compact(topic.job(2, horizon=P(1, 1)))
    topic.seal(3, [("b", b"b0")])
    job = topic.job(4, horizon=P(3, 0), previous=first, ledger_ids=[3])
    for df in (compactor.phase_one_frame(job), phase_one(compactor.read_input(job, NARROW_COLUMNS))):
        plan = explain_string(df)
        read_schemas = [line for line in plan.splitlines() if line.strip().startswith("ReadSchema:")]
        assert len(read_schemas) == 2  # the previous compacted ledger and the new sealed ledger
        for line in read_schemas:
            assert "value:" not in line and "properties" not in line, line
            assert "key:string" in line and "is_tombstone" in line
    # Phase two does read everything.
    assert "value:binary" in explain_string(compactor.read_input(job))


def test_compacted_parts_use_lz4_and_bounded_row_groups(
    topic: Topic, compactor: TwoPhaseCompactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("compactor.two_phase.ROW_GROUP_BYTES", 64 * 1024)
    topic.seal(1, [(f"k{i}", bytes([i % 251]) * 1000 + str(i).encode()) for i in range(400)])
    result = compactor.compact(topic.job(2, horizon=P(1, 399)))
    metas = [pq.read_metadata(p.local) for p in CompactedLedger(result.directory).part_paths()]
    columns = [m.row_group(0).column(i) for m in metas for i in range(m.num_columns)]
    assert {c.compression for c in columns} == {"LZ4"}
    by_name = {c.path_in_schema: c for c in columns}
    # Keys are unique in a compacted ledger: no dictionary is built for them, nor for values.
    assert not any("DICTIONARY" in e for name in ("key", "value") for e in by_name[name].encodings)
    assert by_name["entry_id"].is_stats_set and not by_name["value"].is_stats_set
    assert sum(m.num_row_groups for m in metas) > 1
    ledger = CompactedLedger(result.directory)
    assert [e.entry_id for e in ledger.read(P(1, 150), 120)[0]] == list(range(150, 270))

    # Ids that do not pack take the Spark SQL path: its parts are LZ4 as well.
    big = 2**31 + 5
    other = Topic(topic.root.with_name("big"))
    other.root.mkdir()
    other.seal(big, [("a", b"a0"), ("a", b"a1"), ("b", b"b0")])
    job = other.job(big + 1, horizon=P(big, 2))
    assert not compactor.inputs(job).packed
    sql = compactor.compact(job)
    assert kept(sql) == [(P(big, 1), "a", b"a1"), (P(big, 2), "b", b"b0")]
    for path in CompactedLedger(sql.directory).part_paths():
        meta = pq.read_metadata(path.local)
        assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"LZ4"}


# ------------------------------------------------------------------ the session


def test_parts_are_not_split_into_a_row_group_per_input_ledger(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    for lid in range(1, 41):
        topic.seal(lid, [(f"k{lid}", b"v"), (f"k{lid}", b"latest")])
    result = compactor.compact(topic.job(50, horizon=P(40, 1)))
    metas = [pq.read_metadata(p.local) for p in CompactedLedger(result.directory).part_paths()]
    assert sum(m.num_rows for m in metas) == 40
    assert [m.num_row_groups for m in metas] == [1] * len(metas)


def test_local_workers_start_with_the_compactor_imported(spark: SparkSession) -> None:
    def loaded(_: int) -> bool:
        import sys

        return "compactor.arrow_phases" in sys.modules and "pyarrow.parquet" in sys.modules

    assert spark.sparkContext.parallelize(range(4), 4).map(loaded).collect() == [True] * 4


def test_one_session_per_process(spark: SparkSession) -> None:
    assert get_spark() is spark
    assert get_spark(master="local[1]", shuffle_partitions=99) is spark  # later arguments are ignored
    conf = spark.conf
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert conf.get("spark.sql.adaptive.enabled") == "true"
    assert conf.get("spark.sql.shuffle.partitions") == "4"
    assert spark.sparkContext.appName == "topic-compactor"


def test_session_configuration_defaults() -> None:
    assert local_cores("local") == 1
    assert local_cores("local[3]") == 3
    assert local_cores("local[2, 4]") == 2
    assert local_cores("local[*]") == (os.cpu_count() or 1)
    assert local_cores("spark://master:7077") is None
    conf = spark_conf(master="local[3]")
    assert conf["spark.sql.shuffle.partitions"] == "6"
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs"] == "false"
    assert conf["spark.python.unix.domain.socket.enabled"] == "true"  # half the cost of a job
    # Local workers are forked with the compaction's imports done (Spark stops idle ones).
    assert conf["spark.python.daemon.module"] == "compactor.daemon"
    cluster = spark_conf(master="spark://master:7077", extra_conf={"spark.executor.memory": "8g"})
    assert "spark.sql.shuffle.partitions" not in cluster and "spark.driver.host" not in cluster
    assert "spark.python.daemon.module" not in cluster  # the executors lack the project's code
    assert cluster["spark.executor.memory"] == "8g"
    with pytest.raises(ValueError):
        spark_conf(shuffle_partitions=0)


def test_local_workers_run_with_their_imports_frozen(spark: SparkSession) -> None:
    # PySpark's worker collects garbage after every task; the daemon freezes what it imported
    # (most of a worker's objects) so that the collection leaves it out: a collection of the
    # whole heap took ~90 ms of a core per task and delayed the next task on that worker.
    frozen = spark.sparkContext.parallelize(range(2), 2).map(lambda _: _freeze_count()).collect()
    assert min(frozen) > 10_000, frozen


def _freeze_count() -> int:
    import gc

    return gc.get_freeze_count()


def test_workers_allocate_arrow_memory_without_transparent_huge_pages(spark: SparkSession) -> None:
    # pyarrow's allocator asks for huge pages on its arenas; on a kernel in THP "madvise" mode
    # the first touch of every 2 MiB then clears 2 MiB (16% of a round's CPU, measured).
    assert spark_conf()["spark.executorEnv.MIMALLOC_ALLOW_THP"] == "0"
    found = spark.sparkContext.parallelize(range(2), 2).map(lambda _: _arrow_memory_thp()).collect()
    for env, eligible in found:
        assert env == "0"
        assert eligible in (None, False), found  # None: THP is not in "madvise" mode here


def _arrow_memory_thp() -> tuple[str | None, bool | None]:
    """In a worker: its MIMALLOC_ALLOW_THP, and whether the mapping holding a fresh 64 MiB
    pyarrow buffer is eligible for transparent huge pages (when the kernel's mode is madvise)."""
    import os

    import pyarrow as pa

    env = os.environ.get("MIMALLOC_ALLOW_THP")
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[madvise]" not in f.read():
                return env, None
        buffer = pa.allocate_buffer(64 << 20)
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return env, None
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= buffer.address < hi
        elif inside and line.startswith("THPeligible:"):
            return env, line.split()[1] == "1"
    return env, None


# ------------------------------------------------------------------ failures


@pytest.mark.parametrize("phase", ["phase_one", "phase_two"])
def test_fault_in_a_phase_leaves_nothing_behind(spark: SparkSession, topic: Topic, phase: str) -> None:
    topic.seal(1, [("a", b"a0"), ("b", b"b0")])
    seen: list[str] = []

    def hook(name: str) -> None:
        seen.append(name)
        if name == phase:
            raise RuntimeError(f"injected failure in {name}")

    with pytest.raises(RuntimeError, match="injected"):
        TwoPhaseCompactor(spark, fault_hook=hook, min_part_bytes=0).compact(topic.job(2, horizon=P(1, 1)))
    assert seen[-1] == phase
    assert leftovers(topic) == []
    # The topic is as it was: a retry with the same ledger id succeeds.
    assert kept(TwoPhaseCompactor(spark, min_part_bytes=0).compact(topic.job(2, horizon=P(1, 1)))) == [
        (P(1, 0), "a", b"a0"),
        (P(1, 1), "b", b"b0"),
    ]


def _three_ledgers(topic: Topic) -> list[Kept]:
    """Three ledgers of one size (two groups on two cores: ledgers 1-2, then 3), updating keys
    across all three; what their compaction keeps."""
    latest: dict[str, tuple[Position, bytes]] = {}
    for lid in (1, 2, 3):
        messages = [(f"k{(lid * 7 + i) % 25}", f"{lid}:{i}".encode()) for i in range(20)]
        topic.seal(lid, messages)
        for i, (key, value) in enumerate(messages):
            latest[key] = (P(lid, i), value)
    return sorted((pos, key, value) for key, (pos, value) in latest.items())


def test_a_full_round_is_one_spark_job(
    topic: Topic, compactor: TwoPhaseCompactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every group's both phases in one job, the last group's task first: no phase-two job.
    expected = _three_ledgers(topic)
    rounds: list[int] = []
    real = arrow_phases.full_round

    def spied(spark: SparkSession, plan: round_plan.RoundPlan) -> round_plan.TaskResult:
        rounds.append(len(plan.groups))
        return real(spark, plan)

    def no_job(*args: object, **kwargs: object) -> None:
        raise AssertionError("a full round ran a job of its phases apart")

    monkeypatch.setattr(arrow_phases, "full_round", spied)
    monkeypatch.setattr(arrow_phases, "phase_one", no_job)
    monkeypatch.setattr(arrow_phases, "phase_two", no_job)
    result = compactor.compact(topic.job(4, horizon=P(3, 19)))
    assert rounds == [2]
    assert kept(result) == expected
    assert result.entries_read == 60 and result.records_kept == len(expected)


def _parts_read(plan: round_plan.RoundPlan) -> list[Kept]:
    """The rows of a plan's part files, in part order, as (position, key, value)."""
    out: list[Kept] = []
    for g in range(len(plan.groups)):
        local = plan.part_path(g).local
        assert local is not None and local.is_file(), f"part {g} not written"
        t = pq.read_table(local, columns=["ledger_id", "entry_id", "key", "value"])
        out += [(P(r["ledger_id"], r["entry_id"]), r["key"], r["value"]) for r in t.to_pylist()]
    return out


def _two_group_plan(topic: Topic, compactor: TwoPhaseCompactor) -> round_plan.RoundPlan:
    """The plan of a round over :func:`_three_ledgers` (two groups: ledgers 1-2, then 3), its
    output directory made, nothing run yet."""
    plan = compactor._plan_round(topic.job(4, horizon=P(3, 19)), None, cores=2).plan
    assert plan is not None and len(plan.groups) == 2
    plan.make_out_dir()
    return plan


def test_every_task_of_a_full_round_writes_its_part(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    # The last group's task runs first and waits for nothing; the first group's task writes
    # its part once the last group's partial is there.
    expected = _three_ledgers(topic)
    plan = _two_group_plan(topic, compactor)
    result = arrow_phases.full_round(compactor.spark, plan)
    assert sorted(result.written) == [0, 1]
    assert result.rows_read == 60 and result.rows_written == len(expected)
    assert _parts_read(plan) == expected


def test_a_task_whose_later_partial_does_not_come_leaves_its_phase_two_to_a_job(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    # The first group's task of a full round runs while the last group's is not running (as
    # with fewer cores than tasks): it gives up waiting and writes no part; phase two then
    # runs as its own job.
    expected = _three_ledgers(topic)
    plan = _two_group_plan(topic, compactor)
    run = arrow_phases._latest_then_write
    (first,) = arrow_phases._per_group(compactor.spark, plan, run, groups=[0])
    assert first.written == () and first.rows_read == 40 and first.rows_written == 0
    assert plan.partial_path(0).is_file() and not plan.part_path(0).is_file()
    (last,) = arrow_phases._per_group(compactor.spark, plan, run, groups=[1])
    assert last.written == (1,)
    arrow_phases.phase_two(compactor.spark, plan, [0])
    assert _parts_read(plan) == expected


def test_a_round_whose_last_group_starts_late_still_writes_every_part(
    topic: Topic, compactor: TwoPhaseCompactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last group's task starts after the first group's task has given up waiting for its
    # partial: the driver runs that group's phase two as a job once the round's job ends.
    expected = _three_ledgers(topic)
    late: list[list[int]] = []
    real_two = arrow_phases.phase_two

    def late_last(spark: SparkSession, plan: round_plan.RoundPlan) -> round_plan.TaskResult:
        last = len(plan.groups) - 1

        def work(p: round_plan.RoundPlan, group: int) -> round_plan.TaskResult:
            if group == last:
                time.sleep(2)  # beyond the half second a task of tiny groups waits
            return arrow_phases._latest_then_write(p, group)

        order = range(last, -1, -1)
        return round_plan.TaskResult.of(arrow_phases._per_group(spark, plan, work, groups=order))

    def spied_two(
        spark: SparkSession, plan: round_plan.RoundPlan, groups: Sequence[int] | None = None
    ) -> round_plan.TaskResult:
        late.append(list(groups) if groups is not None else [])
        return real_two(spark, plan, groups)

    monkeypatch.setattr(arrow_phases, "full_round", late_last)
    monkeypatch.setattr(arrow_phases, "phase_two", spied_two)
    result = compactor.compact(topic.job(4, horizon=P(3, 19)))
    assert late == [[0]]
    assert kept(result) == expected
    assert result.entries_read == 60 and result.records_kept == len(expected)


def test_a_job_ships_only_the_footers_of_the_groups_its_tasks_open(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    # Every task of a job gets the job's closure: the last group's job need not carry the
    # first group's footers, nor the others' job the last group's.
    _three_ledgers(topic)
    plan = _two_group_plan(topic, compactor)
    assert all(s.footer is not None for g in plan.groups for s in g)
    shipped = round_plan._for_tasks_of(plan, [1])
    assert [[s.footer is not None for s in g] for g in shipped.groups] == [[False, False], [True]]
    assert [[s.path for s in g] for g in shipped.groups] == [[s.path for s in g] for g in plan.groups]
    assert len(pickle.dumps(shipped)) < len(pickle.dumps(plan))
    # What a task does with it: the footer it was given, read from the bytes shipped.
    footer = pickle.loads(pickle.dumps(shipped)).groups[1][0].footer
    assert footer is not None and footer.meta.num_rows == 20
    # A job carries the plan compressed (footers are much alike), and its tasks get it whole.
    packed = arrow_phases._Packed.of(plan)
    assert len(packed.data) < len(pickle.dumps(plan)) / 2
    unpacked = packed.unpack()
    assert unpacked.groups == plan.groups and unpacked.out_dir == plan.out_dir
    metas = [s.footer_meta for g in unpacked.groups for s in g]
    assert metas == [s.footer_meta for g in plan.groups for s in g] and None not in metas


@pytest.mark.parametrize("phase", ["phase_one", "phase_two"])
def test_a_fault_around_a_full_rounds_job_leaves_nothing_behind(
    spark: SparkSession, topic: Topic, phase: str
) -> None:
    # Before the job nothing is written; after it, every group's partial and part are: the
    # round removes them all, and a retry at the same ledger id succeeds.
    expected = _three_ledgers(topic)

    def hook(name: str) -> None:
        if name == phase:
            raise RuntimeError(f"injected failure in {name}")

    with pytest.raises(RuntimeError, match="injected"):
        TwoPhaseCompactor(spark, fault_hook=hook, min_part_bytes=0).compact(topic.job(4, horizon=P(3, 19)))
    assert leftovers(topic) == []
    retried = TwoPhaseCompactor(spark, min_part_bytes=0).compact(topic.job(4, horizon=P(3, 19)))
    assert kept(retried) == expected


def test_a_failed_round_waits_for_its_other_tasks_before_removing_its_files(
    topic: Topic, compactor: TwoPhaseCompactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One task of the round's job fails while another is still at work: Spark fails the job
    # at once, but the other task writes on (a Python task ends when it ends, or when Spark
    # kills its worker seconds later). The round removes its files only after that task.
    expected = _three_ledgers(topic)

    def failing_first(spark: SparkSession, plan: round_plan.RoundPlan) -> round_plan.TaskResult:
        def work(p: round_plan.RoundPlan, group: int) -> round_plan.TaskResult:
            if group == 0:
                raise OSError("injected: the first group's input is unreadable")
            time.sleep(1)
            return arrow_phases._latest_then_write(p, group)

        order = range(len(plan.groups) - 1, -1, -1)
        return round_plan.TaskResult.of(arrow_phases._per_group(spark, plan, work, groups=order))

    monkeypatch.setattr(arrow_phases, "full_round", failing_first)
    with pytest.raises(Exception, match="injected"):
        compactor.compact(topic.job(4, horizon=P(3, 19)))
    assert leftovers(topic) == []
    time.sleep(1.5)  # when the other task would have written, had the round not waited
    assert leftovers(topic) == []
    monkeypatch.undo()
    assert kept(compactor.compact(topic.job(4, horizon=P(3, 19)))) == expected


@pytest.mark.parametrize("damaged", [1, 3])
def test_a_damaged_page_in_either_task_fails_the_round_and_leaves_nothing(
    topic: Topic, compactor: TwoPhaseCompactor, damaged: int
) -> None:
    # Ledger 3 is the last group's (the job's first task), ledger 1 the first group's: a
    # damaged key page fails phase one in one task while the other task runs on.
    _three_ledgers(topic)
    path = topic.ledgers[damaged]
    table = pq.read_table(path)
    pq.write_table(table, path, write_page_checksum=True, compression="none", use_dictionary=False)
    meta = pq.read_metadata(path)
    key = next(i for i in range(meta.num_columns) if meta.row_group(0).column(i).path_in_schema == "key")
    chunk = meta.row_group(0).column(key)
    with open(path, "r+b") as f:  # a byte of the first key page's data, past its header
        f.seek(chunk.data_page_offset + chunk.total_compressed_size - 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(Exception, match="CRC|checksum"):
        compactor.compact(topic.job(4, horizon=P(3, 19)))
    assert leftovers(topic) == []


def _value_page_damaged(path: Path, back: int = 0) -> str:
    """Rewrite the ledger at ``path`` uncompressed and plain (so that a flipped byte stays a
    value's), then flip a byte of the value ``back`` values before its last (values of 2,000
    bytes, each after its 4-byte length); the CRC32C of the file before the damage, as sealing
    recorded it."""
    table = pq.read_table(path)
    pq.write_table(table, path, write_page_checksum=True, compression="none", use_dictionary=False)
    before = file_checksum(path)
    meta = pq.read_metadata(path)
    value = next(i for i in range(meta.num_columns) if meta.row_group(0).column(i).path_in_schema == "value")
    chunk = meta.row_group(0).column(value)
    with open(path, "r+b") as f:
        f.seek(chunk.data_page_offset + chunk.total_compressed_size - 2 - back * (4 + 2_000))
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    return before


@pytest.mark.parametrize("told", ["sealed", "damaged"])
def test_phase_two_checks_a_ledger_it_reads_mostly_against_its_whole_file_checksum(
    topic: Topic, compactor: TwoPhaseCompactor, told: str
) -> None:
    # Values of 2 KB: phase two decodes most of each ledger's bytes, so a task checks the whole
    # file against the CRC32C the round was given (as the service gives the one it recorded at
    # sealing) instead of each page. Ledger 2 holds winners: entries 2-6 (keys k16-k20, which
    # ledger 3 does not update); entry 6's value is damaged, 13 values before the last.
    latest: dict[str, tuple[Position, bytes]] = {}
    for lid in (1, 2, 3):
        messages = [(f"k{(lid * 7 + i) % 25}", bytes([lid, i]) * 1_000) for i in range(20)]
        topic.seal(lid, messages)
        latest.update((key, (P(lid, i), value)) for i, (key, value) in enumerate(messages))
    sealed = _value_page_damaged(topic.ledgers[2], back=13)
    damaged = file_checksum(topic.ledgers[2])
    checksums = {lid: file_checksum(path) for lid, path in topic.ledgers.items()}
    checksums[2] = sealed if told == "sealed" else damaged
    job = dataclasses.replace(topic.job(4, horizon=P(3, 19)), input_checksums=checksums)
    if told == "sealed":
        # The file is not the one sealed: it is read page-checked, and the damaged page found.
        with pytest.raises(Exception, match="CRC|checksum"):
            compactor.compact(job)
        assert leftovers(topic) == []
        return
    # Told the damaged file's own checksum (as if it had been sealed so), the task takes the
    # whole-file check for the pages' and decodes the bytes it checked: entry 6's value comes
    # out with the flipped byte, where a page check would have refused it.
    result = compactor.compact(job)
    got = {key: (position, value) for position, key, value in kept(result)}
    assert got.keys() == latest.keys()
    assert [key for key, (_, value) in latest.items() if got[key][1] != value] == ["k20"]
    assert got["k20"][0] == P(2, 6)


def test_failure_while_writing_removes_the_temporary_directory(
    topic: Topic, compactor: TwoPhaseCompactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic.seal(1, [("a", b"a0")])

    def broken(directory: StoragePath, **_: object) -> None:
        assert directory.name.endswith(TMP_SUFFIX) and any(directory.local.iterdir())  # type: ignore[union-attr]
        raise OSError("disk full")

    monkeypatch.setattr("compactor.two_phase.write_manifest", broken)
    with pytest.raises(OSError, match="disk full"):
        compactor.compact(topic.job(2, horizon=P(1, 0)))
    assert leftovers(topic) == []


def test_stale_temporary_directory_is_replaced(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [("a", b"a0")])
    stale = compacted_dir(topic.root, 2).with_name(compacted_dir(topic.root, 2).name + TMP_SUFFIX)
    stale.mkdir()
    (stale / "part-00000-stale.parquet").write_bytes(b"garbage")
    assert kept(compactor.compact(topic.job(2, horizon=P(1, 0)))) == [(P(1, 0), "a", b"a0")]
    assert leftovers(topic) == [compacted_dir(topic.root, 2).name]


def test_existing_output_is_never_overwritten(topic: Topic, compactor: TwoPhaseCompactor) -> None:
    topic.seal(1, [("a", b"a0")])
    compactor.compact(topic.job(2, horizon=P(1, 0)))
    with pytest.raises(FileExistsError):
        compactor.compact(topic.job(2, horizon=P(1, 0)))
    assert kept(compacted_dir(topic.root, 2)) == [(P(1, 0), "a", b"a0")]


# ------------------------------------------------------------------ several rounds in one job


def _partitions(tmp_path: Path, n: int) -> list[Topic]:
    out = []
    for i in range(n):
        root = tmp_path / "ledgers" / "public" / "default" / f"orders-partition-{i}"
        root.mkdir(parents=True)
        out.append(Topic(root))
    return out


def _latest(messages: Sequence[tuple[Position, str, bytes | None]]) -> list[Kept]:
    """The model: each key's latest message, in id order, keys whose latest deletes dropped."""
    latest: dict[str, tuple[Position, bytes | None]] = {}
    for pos, key, value in messages:
        latest[key] = (pos, value)
    return sorted((pos, key, value) for key, (pos, value) in latest.items() if not is_delete(key, value))


def _fill(
    t: Topic, i: int, ledger_ids: Sequence[int], count: int = 14
) -> list[tuple[Position, str, bytes | None]]:
    sent = []
    for lid in ledger_ids:
        msgs: list[Msg] = [
            (f"k{(i * 3 + lid + j) % 9}", None if j % 5 == 4 else f"{i}:{lid}:{j}".encode())
            for j in range(count)
        ]
        t.seal(lid, msgs)
        sent += [(P(lid, j), k, v) for j, (k, v) in enumerate(msgs) if k is not None]
    return sent


def _jobs_in(spark: SparkSession, jobs: Sequence[CompactionJob]) -> int:
    """Spark jobs run by the rounds of ``jobs`` that shared their work."""
    first = min(jobs, key=lambda j: j.output_ledger_id)
    group = shared_group(first.topic_root, first.output_ledger_id, len(jobs))
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_the_rounds_of_every_partition_are_one_spark_job_each_equal_to_the_model(
    spark: SparkSession, tmp_path: Path
) -> None:
    compactor = TwoPhaseCompactor(spark, min_part_bytes=0)
    parts = _partitions(tmp_path, 4)
    sent = [_fill(t, i, [1, 2]) for i, t in enumerate(parts)]
    jobs = [t.job(10 + i, horizon=P(2, 13)) for i, t in enumerate(parts)]

    results = compactor.compact_many(jobs)

    assert _jobs_in(spark, jobs) == 1
    for result, messages in zip(results, sent, strict=True):
        assert isinstance(result, CompactionResult)
        assert kept(result) == _latest(messages)
        assert result.entries_read == 28
    # A later round of each, on top of its first: delta layers, again one job for all.
    for i, t in enumerate(parts):
        sent[i] += _fill(t, i + 5, [3], count=6)  # a few keys: the base keeps live rows
    later = [
        t.job(20 + i, horizon=P(3, 5), previous=r, ledger_ids=[3])  # type: ignore[arg-type]
        for i, (t, r) in enumerate(zip(parts, results, strict=True))
    ]
    again = compactor.compact_many(later)
    assert _jobs_in(spark, later) == 1
    for result, messages in zip(again, sent, strict=True):
        assert isinstance(result, CompactionResult)
        assert [layer.kind for layer in result.manifest.layers] == ["base", "delta"]
        assert kept(result) == _latest(messages)


def test_rounds_too_big_for_one_task_each_share_a_phase_two_job(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One round on two cores: two groups, and (forced) the two phases apart.
    monkeypatch.setattr(arrow_phases, "_ONE_JOB_NEW_SHARE", 10**9)
    compactor = TwoPhaseCompactor(spark, min_part_bytes=0)
    (t,) = _partitions(tmp_path, 1)
    sent = _fill(t, 0, [1, 2, 3])
    job = t.job(10, horizon=P(3, 13))
    (result,) = compactor.compact_many([job])
    assert isinstance(result, CompactionResult)
    assert _jobs_in(spark, [job]) == 2
    assert kept(result) == _latest(sent)


def test_a_partition_whose_task_fails_leaves_the_others_committed_and_says_why(
    spark: SparkSession, tmp_path: Path
) -> None:
    compactor = TwoPhaseCompactor(spark, min_part_bytes=0)
    parts = _partitions(tmp_path, 3)
    sent = [_fill(t, i, [1]) for i, t in enumerate(parts)]
    # Partition 1's pages are garbage (its footer, which planning reads, is intact): its
    # task fails when it decodes them.
    damaged = parts[1].ledgers[1]
    data = bytearray(damaged.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[4 : len(data) - 8 - footer] = bytes(len(data) - 12 - footer)
    damaged.write_bytes(bytes(data))
    jobs = [t.job(10 + i, horizon=P(1, 13)) for i, t in enumerate(parts)]

    results = compactor.compact_many(jobs)

    assert _jobs_in(spark, jobs) == 1
    failed = results[1]
    assert isinstance(failed, arrow_phases.TaskFailed)
    assert "\n" not in str(failed) and str(failed)
    assert str(damaged) in str(failed.__cause__)
    final = compacted_dir(parts[1].root, 11)
    assert not final.exists() and not final.with_name(final.name + TMP_SUFFIX).exists()
    for i in (0, 2):
        result = results[i]
        assert isinstance(result, CompactionResult)
        assert kept(result) == _latest(sent[i])
