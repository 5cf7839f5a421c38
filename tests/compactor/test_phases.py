"""Phase one and phase two as pure DataFrame functions, against small hand-made inputs and a model."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from compactor.phases import (
    LATEST_ID,
    MAX_PACKED_ENTRY_ID,
    MAX_PACKED_LEDGER_ID,
    NARROW_COLUMNS,
    can_pack,
    pack,
    packed_id_col,
    phase_one,
    phase_two,
    unpack,
)
from ledger.entry import Position
from ledger.schema import COLUMNS, SPARK_DDL

pytestmark = pytest.mark.spark

Spec = tuple[int, int, str | None, bytes | None]  # ledger_id, entry_id, key, value (None = tombstone)


def full_row(lid: int, eid: int, key: str | None, value: bytes | None) -> tuple[object, ...]:
    return (
        lid,
        eid,
        key,
        value,
        value is None,
        {"n": f"{lid}:{eid}"},
        1_000 + eid,
        # event time, batch index and size, producer, sequence id, delivery time, ordering key,
        # schema version
        *(None,) * 8,
    )


def full_df(spark: SparkSession, specs: Sequence[Spec]) -> DataFrame:
    return spark.createDataFrame([full_row(*s) for s in specs], SPARK_DDL)


def narrow(df: DataFrame) -> DataFrame:
    return df.select(*NARROW_COLUMNS)


def latest_value(lid: int, eid: int, *, packed: bool) -> object:
    return pack(Position(lid, eid)) if packed else Row(ledger_id=lid, entry_id=eid)


def model(specs: Sequence[Spec], *, retain_null_key: bool) -> list[tuple[object, ...]]:
    """What a compaction keeps, computed the obvious way."""
    latest: dict[str, Spec] = {}
    for s in sorted(specs, key=lambda s: (s[0], s[1])):
        if s[2] is not None:
            latest[s[2]] = s
    kept = [s for s in latest.values() if s[3] is not None]
    if retain_null_key:
        kept += [s for s in specs if s[2] is None and s[3] is not None]
    return [full_row(*s) for s in sorted(kept, key=lambda s: (s[0], s[1]))]


BASIC: list[Spec] = [
    (1, 0, "a", b"a0"),
    (1, 1, "b", b"b0"),
    (1, 2, None, b"n0"),
    (1, 3, "a", b"a1"),
    (1, 4, "c", b"c0"),
    (2, 0, "b", None),  # deletes b
    (2, 1, None, None),  # a keyless tombstone
    (2, 2, "c", None),
    (2, 3, "c", b"c1"),  # c comes back after its tombstone
    (2, 4, None, b"n1"),
]


# ------------------------------------------------------------------ ids


@given(
    a=st.tuples(st.integers(0, MAX_PACKED_LEDGER_ID), st.integers(0, MAX_PACKED_ENTRY_ID)),
    b=st.tuples(st.integers(0, MAX_PACKED_LEDGER_ID), st.integers(0, MAX_PACKED_ENTRY_ID)),
)
def test_packing_preserves_order(a: tuple[int, int], b: tuple[int, int]) -> None:
    pa_, pb = pack(Position(*a)), pack(Position(*b))
    assert 0 <= pa_ < 2**63 and 0 <= pb < 2**63
    assert (pa_ < pb) == (a < b)
    assert unpack(pa_) == Position(*a)


def test_can_pack_bounds() -> None:
    assert can_pack(MAX_PACKED_LEDGER_ID, MAX_PACKED_ENTRY_ID)
    assert not can_pack(MAX_PACKED_LEDGER_ID + 1, 0)
    assert not can_pack(1, MAX_PACKED_ENTRY_ID + 1)
    assert not can_pack(5, 5, min_entry_id=-1)


def test_packed_id_column_matches_python(spark: SparkSession) -> None:
    ids = [(1, 0), (1, 1), (2, 0), (MAX_PACKED_LEDGER_ID, MAX_PACKED_ENTRY_ID), (0, MAX_PACKED_ENTRY_ID)]
    df = spark.createDataFrame(ids, "ledger_id BIGINT, entry_id BIGINT").select(packed_id_col().alias("p"))
    assertDataFrameEqual(df, [Row(p=pack(Position(*i))) for i in ids])


# ------------------------------------------------------------------ phase one


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "struct"])
def test_phase_one_latest_id_per_key(spark: SparkSession, packed: bool) -> None:
    latest = phase_one(narrow(full_df(spark, BASIC)), packed=packed).drop("latest_publish_time")
    expected = spark.createDataFrame(
        [
            ("a", latest_value(1, 3, packed=packed), False, 2),
            ("b", latest_value(2, 0, packed=packed), True, 2),
            ("c", latest_value(2, 3, packed=packed), False, 3),
        ],
        latest.schema,
    )
    assertDataFrameEqual(latest, expected)


def test_phase_one_of_keyless_or_empty_input_is_empty(spark: SparkSession) -> None:
    only_keyless = full_df(spark, [(1, 0, None, b"x"), (1, 1, None, None)])
    assert phase_one(narrow(only_keyless)).count() == 0
    assert phase_one(narrow(full_df(spark, []))).count() == 0


def test_phase_one_orders_ids_across_ledgers_not_by_entry(spark: SparkSession) -> None:
    """(2, 0) is later than (1, 99): the ledger id decides first."""
    specs: list[Spec] = [(1, 99, "k", b"old"), (2, 0, "k", None), (1, 5, "j", None), (1, 7, "j", b"new")]
    for packed in (True, False):
        rows = {r["key"]: r for r in phase_one(narrow(full_df(spark, specs)), packed=packed).collect()}
        assert rows["k"][LATEST_ID] == latest_value(2, 0, packed=packed)
        assert rows["k"]["latest_is_tombstone"] is True
        assert rows["j"][LATEST_ID] == latest_value(1, 7, packed=packed)
        assert rows["j"]["latest_is_tombstone"] is False


# ------------------------------------------------------------------ phase two


@pytest.mark.parametrize("retain_null_key", [False, True], ids=["drop-keyless", "retain-keyless"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "struct"])
def test_phase_two_keeps_latest_of_live_keys(
    spark: SparkSession, packed: bool, retain_null_key: bool
) -> None:
    full = full_df(spark, BASIC)
    kept = phase_two(full, phase_one(narrow(full), packed=packed), retain_null_key=retain_null_key)
    assert tuple(kept.columns) == COLUMNS
    expected = [(1, 3, "a", b"a1"), (2, 3, "c", b"c1")]
    if retain_null_key:
        expected = [(1, 2, None, b"n0"), (1, 3, "a", b"a1"), (2, 3, "c", b"c1"), (2, 4, None, b"n1")]
    assertDataFrameEqual(
        kept, spark.createDataFrame([full_row(*s) for s in expected], SPARK_DDL), checkRowOrder=True
    )


def test_phase_two_result_has_the_ledger_schema(spark: SparkSession) -> None:
    full = full_df(spark, BASIC)
    kept = phase_two(full, phase_one(narrow(full)), retain_null_key=True)
    assert [(f.name, f.dataType) for f in kept.schema] == [(f.name, f.dataType) for f in full.schema]


def test_phase_two_only_tombstones_is_empty(spark: SparkSession) -> None:
    full = full_df(spark, [(1, 0, "a", None), (1, 1, "b", None), (1, 2, None, None)])
    assert phase_two(full, phase_one(narrow(full)), retain_null_key=True).count() == 0


def test_phase_two_keeps_keys_that_differ_only_in_case_or_space(spark: SparkSession) -> None:
    """Exact keys decide: near-identical keys are distinct keys."""
    specs: list[Spec] = [
        (1, 0, "k", b"1"),
        (1, 1, "K", b"2"),
        (1, 2, "k ", b"3"),
        (1, 3, "", b"4"),
        (1, 4, "k", b"5"),
    ]
    full = full_df(spark, specs)
    kept = phase_two(full, phase_one(narrow(full)), retain_null_key=False)
    assertDataFrameEqual(kept, [Row(*full_row(*s)) for s in specs[1:]], checkRowOrder=True)


@pytest.mark.parametrize("seed", [7, 11])
def test_phases_match_the_model_on_random_input(spark: SparkSession, seed: int) -> None:
    rnd = random.Random(seed)
    specs: list[Spec] = []
    for lid in (3, 4, 9):
        for eid in range(rnd.randint(20, 80)):
            key = None if rnd.random() < 0.1 else f"key-{rnd.randint(0, 25)}"
            value = None if rnd.random() < 0.15 else f"{lid}:{eid}".encode()
            specs.append((lid, eid, key, value))
    rnd.shuffle(specs)  # phase results must not depend on input order
    full = full_df(spark, specs)
    for packed in (True, False):
        latest = phase_one(narrow(full), packed=packed)
        for retain in (False, True):
            got = [tuple(r) for r in phase_two(full, latest, retain_null_key=retain).collect()]
            assert got == model(specs, retain_null_key=retain), (packed, retain)


# ------------------------------------------------------------------ strategies and delete retention


def row(lid: int, eid: int, key: str, value: bytes | None, *, props=None, event_time=None, publish=1_000):
    return (lid, eid, key, value, value is None, props or {}, publish, event_time, *(None,) * 7)


def kept_values(spark: SparkSession, rows, strategy: str, **kw) -> list[tuple[str, bytes | None]]:
    from compactor.phases import narrow_columns

    full = spark.createDataFrame(rows, SPARK_DDL)
    latest = phase_one(full.select(*narrow_columns(strategy)), strategy=strategy)
    return [(r["key"], r["value"]) for r in phase_two(full, latest, retain_null_key=False, **kw).collect()]


def test_event_time_strategy_keeps_the_latest_event_not_the_latest_arrival(spark: SparkSession) -> None:
    rows = [
        row(1, 0, "a", b"t=5", event_time=5),
        row(1, 1, "a", b"t=9", event_time=9),
        row(1, 2, "a", b"t=7 late arrival", event_time=7),  # arrives last, happened earlier
        row(1, 3, "b", b"t=3", event_time=3),
        row(1, 4, "b", b"t=3 again", event_time=3),  # a tie: the later id wins
    ]
    assert kept_values(spark, rows, "eventTime") == [("a", b"t=9"), ("b", b"t=3 again")]
    assert kept_values(spark, rows, "offset") == [("a", b"t=7 late arrival"), ("b", b"t=3 again")]


def test_property_strategy_keeps_the_highest_version(spark: SparkSession) -> None:
    rows = [
        row(1, 0, "a", b"v2", props={"version": "2"}),
        row(1, 1, "a", b"v10", props={"version": "10"}),  # numeric, not lexical, order
        row(1, 2, "a", b"v3", props={"version": "3"}),
        row(1, 3, "b", b"v1", props={"version": "1"}),
        row(1, 4, "b", b"no version"),  # ranks below any versioned record
        row(1, 5, "c", b"v5", props={"version": "5"}),
        row(1, 6, "c", None),  # an unversioned delete always wins
        row(1, 7, "d", b"v5", props={"version": "5"}),
        row(1, 8, "d", None, props={"version": "4"}),  # a stale versioned delete loses
    ]
    assert kept_values(spark, rows, "property:version") == [("a", b"v10"), ("b", b"v1"), ("d", b"v5")]


def test_delete_retention_keeps_recent_tombstones(spark: SparkSession) -> None:
    rows = [
        row(1, 0, "a", b"1", publish=100),
        row(1, 1, "a", None, publish=500),  # deleted recently
        row(1, 2, "b", b"1", publish=100),
        row(1, 3, "b", None, publish=200),  # deleted long ago
    ]
    assert kept_values(spark, rows, "offset", keep_tombstones_since=400) == [("a", None)]
    assert kept_values(spark, rows, "offset", keep_tombstones_since=600) == []
    assert kept_values(spark, rows, "offset") == []
