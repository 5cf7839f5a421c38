"""Layered compacted ledgers (issue 17): delta rounds, deletion vectors, key indexes and
consolidation, against real Spark and real files.

The property behind most tests: however a compacted ledger came to be -- one full round, or a
chain of delta and consolidating rounds -- a reader sees the same records, those of one full
round over the whole log.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from compactor import CompactionJob, CompactionResult, TwoPhaseCompactor
from ledger.compacted_store import CompactedLedger
from ledger.entry import Position
from ledger.paths import compacted_dir, sealed_path
from ledger.schema import ARROW_SCHEMA
from tests.compactor.sealed_ledgers import Msg, compaction_job, ledger_rows

pytestmark = pytest.mark.spark

P = Position


class Log:
    """A topic's sealed ledgers, written as the broker seals them; ledger ``n``'s messages are
    published at ``1000 * n + i``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ledgers: dict[int, Path] = {}

    def seal(
        self, ledger_id: int, messages: list[Msg], *, properties: list[dict[str, str]] | None = None
    ) -> Path:
        rows = ledger_rows(ledger_id, messages, properties)
        path = sealed_path(self.root, ledger_id)
        pq.write_table(pa.Table.from_pylist(rows, schema=ARROW_SCHEMA), path, row_group_size=5)
        self.ledgers[ledger_id] = path
        return path

    def last(self, ledger_id: int) -> Position:
        return P(ledger_id, pq.read_metadata(self.ledgers[ledger_id]).num_rows - 1)

    def job(
        self, output: int, horizon: Position, previous: CompactionResult | None = None, **kw: object
    ) -> CompactionJob:
        ids = sorted(i for i in self.ledgers if i <= horizon.ledger_id)
        return compaction_job(self.root, self.ledgers, ids, output, horizon, previous, **kw)


def seen(directory: Path) -> list[tuple[Position, str | None, bytes | None]]:
    entries, nxt = CompactedLedger(directory).read(P(0, 0), 1_000_000)
    assert nxt is None
    return [(e.position, e.key, e.value) for e in entries]


def checksums(root: Path) -> dict[str, str]:
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }


@pytest.fixture
def log(tmp_path: Path) -> Log:
    root = tmp_path / "ledgers" / "public" / "default" / "t"
    root.mkdir(parents=True)
    return Log(root)


@pytest.fixture
def compactor(spark: SparkSession) -> TwoPhaseCompactor:
    return TwoPhaseCompactor(spark, min_part_bytes=0)


def random_messages(rng: random.Random, keys: int, n: int) -> list[Msg]:
    out: list[Msg] = []
    for _ in range(n):
        r = rng.random()
        key = None if r < 0.08 else f"k{rng.randrange(keys)}"
        value = None if 0.08 <= r < 0.2 else (b"" if r < 0.23 else rng.randbytes(rng.randrange(1, 6)))
        out.append((key, value))
    return out


# ------------------------------------------------------------------ the model


@pytest.mark.parametrize(
    ("seed", "retain_null_key", "delete_retention_ms"),
    [(1, False, 0), (2, True, 0), (3, False, 1500), (4, True, 2500)],
    ids=["plain", "retainNullKey", "deleteRetention", "both"],
)
def test_many_rounds_of_deltas_and_consolidations_equal_one_full_round(
    log: Log, compactor: TwoPhaseCompactor, seed: int, retain_null_key: bool, delete_retention_ms: int
) -> None:
    chain_equals_full_rounds(log, compactor, seed, retain_null_key, delete_retention_ms)


@pytest.mark.parametrize(
    ("min_part_bytes", "seed", "retain_null_key", "delete_retention_ms"),
    [(64 << 20, 5, False, 0), (64 << 20, 6, True, 2500), (0, 7, True, 1500)],
    ids=["one group", "one group, both", "groups"],
)
def test_a_probe_shared_by_several_tasks_finds_the_same_dead_rows(
    log: Log,
    spark: SparkSession,
    min_part_bytes: int,
    seed: int,
    retain_null_key: bool,
    delete_retention_ms: int,
) -> None:
    # One share of the probe per core: the older layers' key indexes are cut between tasks
    # (with one group, one of them only probes), each probing with every group's new keys.
    assert spark.sparkContext.defaultParallelism >= 2
    compactor = TwoPhaseCompactor(spark, min_part_bytes=min_part_bytes, probe_rows=1)
    chain_equals_full_rounds(log, compactor, seed, retain_null_key, delete_retention_ms)


def chain_equals_full_rounds(
    log: Log, compactor: TwoPhaseCompactor, seed: int, retain_null_key: bool, delete_retention_ms: int
) -> None:
    """Eight rounds, each layered on the one before (deltas and consolidations), each equal
    to a full round over the same messages."""
    rng = random.Random(seed)
    previous: CompactionResult | None = None
    kinds: list[tuple[str, ...]] = []
    for lid in range(1, 9):
        log.seal(lid, random_messages(rng, keys=25, n=rng.randrange(1, 30)))
        common = {
            "retain_null_key": retain_null_key,
            "delete_retention_ms": delete_retention_ms,
            "now_ms": 1000 * lid + 1000,
        }
        layered = compactor.compact(
            log.job(
                100 + lid,
                log.last(lid),
                previous,
                max_deltas=rng.choice([1, 2, 3, 8]),
                consolidation_ratio=rng.choice([0.2, 0.5, 1.0]),
                **common,
            )
        )
        full = compactor.compact(log.job(500 + lid, log.last(lid), **common))
        assert seen(layered.directory) == seen(full.directory), f"round {lid}"
        assert layered.records_kept == full.records_kept == len(seen(full.directory))
        kinds.append(tuple(layer.kind for layer in layered.manifest.layers))
        full.directory.delete_tree()
        previous = layered
    # The chain did both: rounds that added deltas, and rounds that consolidated them.
    assert any("delta" in k for k in kinds)
    assert any(k == ("base",) for k in kinds[1:])


@pytest.mark.parametrize("strategy", ["eventTime", "property:version"])
def test_the_other_strategies_read_a_layered_ledger_through_its_deletion_vectors(
    log: Log, compactor: TwoPhaseCompactor, strategy: str
) -> None:
    """eventTime and property rounds rewrite (their winner can be an older row); on a ledger
    that offset rounds layered, they must see exactly its live rows."""
    rng = random.Random(7)
    layered: CompactionResult | None = None
    versions = [{"version": str(v)} for v in range(9)]
    for lid in range(1, 5):
        log.seal(lid, random_messages(rng, keys=12, n=20), properties=rng.choices(versions, k=20))
        layered = compactor.compact(log.job(100 + lid, log.last(lid), layered, consolidation_ratio=1.0))
    assert layered is not None and layered.manifest.deltas == 3 and layered.manifest.dead > 0
    plain = compactor.compact(log.job(200, log.last(4)))  # the same rows, one base, nothing dead
    assert seen(plain.directory) == seen(layered.directory)
    log.seal(5, random_messages(rng, keys=12, n=20), properties=rng.choices(versions, k=20))
    on_layers = compactor.compact(log.job(300, log.last(5), layered, strategy=strategy))
    on_base = compactor.compact(log.job(301, log.last(5), plain, strategy=strategy))
    assert seen(on_layers.directory) == seen(on_base.directory)
    assert [layer.kind for layer in on_layers.manifest.layers] == ["base"]


# ------------------------------------------------------------------ what a delta round reads and writes


def test_a_delta_round_reads_key_indexes_never_the_older_parts(
    log: Log, compactor: TwoPhaseCompactor
) -> None:
    log.seal(1, [(f"k{i}", b"v1") for i in range(30)])
    first = compactor.compact(log.job(10, log.last(1)))
    log.seal(2, [("k3", b"v2"), ("k4", None), ("new", b"n")])
    # Every part of the base made unreadable for the round: only its key index may be read.
    parts = [first.directory.local / p.name for p in first.manifest.parts]  # type: ignore[operator]
    for p in parts:
        p.rename(p.with_name(p.name + ".away"))
    try:
        second = compactor.compact(log.job(11, log.last(2), first))
    finally:
        for p in parts:
            p.with_name(p.name + ".away").rename(p)
    assert [layer.kind for layer in second.manifest.layers] == ["base", "delta"]
    assert second.manifest.layers[0].dead == 2  # k3 superseded, k4 deleted
    got = seen(second.directory)
    assert [(k, v) for _, k, v in got] == [(f"k{i}", b"v1") for i in range(30) if i not in (3, 4)] + [
        ("k3", b"v2"),
        ("new", b"n"),
    ]
    # The delta wrote only its own files: the new part, its key index, the base's new deletion
    # vector, the manifest.
    names = sorted(f.name for f in second.directory.local.iterdir())  # type: ignore[union-attr]
    deletes = f"deletes-{first.directory.name}.npy"
    assert names == sorted(["_manifest.json", deletes, "part-00000.parquet", "part-00000.keys.arrow"])


def test_a_layer_left_without_live_rows_is_dropped(log: Log, compactor: TwoPhaseCompactor) -> None:
    log.seal(1, [("a", b"1"), ("b", b"1")])
    first = compactor.compact(log.job(10, log.last(1)))
    log.seal(2, [("a", b"2"), ("c", b"2")])
    second = compactor.compact(log.job(11, log.last(2), first))
    log.seal(3, [("b", None), ("a", None), ("c", b"3")])
    third = compactor.compact(log.job(12, log.last(3), second))
    assert seen(third.directory) == [(P(3, 2), "c", b"3")]
    assert [layer.dir for layer in third.manifest.layers] == [third.directory.name]
    log.seal(4, [("c", None)])
    fourth = compactor.compact(log.job(13, log.last(4), third))
    assert seen(fourth.directory) == [] and fourth.manifest.layers == ()


def test_consolidation_when_deltas_or_dead_rows_reach_their_bound(
    log: Log, compactor: TwoPhaseCompactor
) -> None:
    log.seal(1, [(f"k{i}", b"1") for i in range(20)])
    result = compactor.compact(log.job(10, log.last(1)))
    kinds = []
    for lid in range(2, 6):
        log.seal(lid, [(f"k{lid}", b"%d" % lid)])  # one dead row per round: 5% of 20
        result = compactor.compact(log.job(10 + lid, log.last(lid), result, max_deltas=2))
        kinds.append(len(result.manifest.layers))
    assert kinds == [2, 3, 1, 2]  # two deltas, then a new base, then a delta on it
    # k0..k7 die in the base (k5 was dead already) and the delta holding k5 dies whole.
    log.seal(6, [(f"k{i}", b"6") for i in range(8)])
    result = compactor.compact(log.job(16, log.last(6), result, consolidation_ratio=0.25))
    assert [(layer.rows, layer.dead) for layer in result.manifest.layers] == [(20, 8), (8, 0)]
    log.seal(7, [("k19", b"7")])  # 8 of 28 stored rows are dead: past 25%, so it consolidates
    result = compactor.compact(log.job(17, log.last(7), result, consolidation_ratio=0.25))
    assert [layer.kind for layer in result.manifest.layers] == ["base"] and result.manifest.dead == 0


# ------------------------------------------------------------------ crash safety


@pytest.mark.parametrize("step", ["phase_one", "phase_two", "manifest", "rename"])
def test_a_failed_delta_round_changes_no_file_of_the_previous_ledger(
    spark: SparkSession, log: Log, step: str
) -> None:
    compactor = TwoPhaseCompactor(spark, min_part_bytes=0)
    log.seal(1, [(f"k{i}", b"1") for i in range(10)])
    first = compactor.compact(log.job(10, log.last(1)))
    log.seal(2, [("k1", b"2"), ("k2", None)])
    second = compactor.compact(log.job(11, log.last(2), first))
    before = checksums(log.root)
    expected = seen(second.directory)
    log.seal(3, [("k3", b"3"), ("k1", None)])

    def crash(at: str) -> None:
        if at == step:
            raise RuntimeError(f"crash at {at}")

    with pytest.raises(RuntimeError, match="crash"):
        TwoPhaseCompactor(spark, min_part_bytes=0, fault_hook=crash).compact(log.job(12, log.last(3), second))
    after = checksums(log.root)
    # The old ledgers' files are untouched and nothing of the failed round is left.
    assert {k: v for k, v in after.items() if not k.endswith(".parquet") or "/" in k} == {
        k: v for k, v in before.items() if not k.endswith(".parquet") or "/" in k
    }
    assert not compacted_dir(log.root, 12).exists()
    assert seen(second.directory) == expected
