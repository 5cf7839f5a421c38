"""The compactor on both backends of ``ledger.storage``: a local directory, and a real
S3-compatible bucket (``.ci/s3``; skipped without ``COMPACTOR_TEST_S3_SETTINGS``). The same
rounds -- full, delta, consolidating, several topics in one job, the other strategies -- give the
same compacted ledgers as on a plain local topic directory; a failed round leaves nothing."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from compactor import CompactionJob, CompactionResult, TwoPhaseCompactor
from compactor.cluster import PROBE_PREFIX, check_executors
from compactor.inputs import NEEDS_ARROW
from compactor.two_phase import SCRATCH_DIR
from ledger.checksums import file_checksum
from ledger.compacted_store import MANIFEST_NAME, CompactedLedger
from ledger.entry import Position
from ledger.files import TMP_SUFFIX
from ledger.manifest_writer import describe_parts
from ledger.paths import compacted_dir, sealed_path
from ledger.schema import ARROW_SCHEMA
from ledger.storage import Storage, StoragePath, as_storage_path
from tests.compactor.sealed_ledgers import Msg, compaction_job, ledger_rows

pytestmark = pytest.mark.spark

P = Position
Seen = list[tuple[Position, str | None, bytes | None]]


class Topic:
    """A topic's sealed ledgers under ``root`` (a directory of a storage, or a local path), each
    written locally as the broker seals them and then published."""

    def __init__(self, root: StoragePath) -> None:
        self.root = root
        self.ledgers: dict[int, StoragePath] = {}

    def seal(self, ledger_id: int, messages: list[Msg]) -> None:
        rows = ledger_rows(ledger_id, messages)
        path = sealed_path(self.root, ledger_id)
        staged = path.staging()
        pq.write_table(pa.Table.from_pylist(rows, schema=ARROW_SCHEMA), staged, row_group_size=5)
        path.publish(staged)
        self.ledgers[ledger_id] = path

    def job(
        self, output: int, horizon: Position, previous: CompactionResult | None = None, **kw: object
    ) -> CompactionJob:
        ids = sorted(i for i in self.ledgers if i <= horizon.ledger_id)
        return compaction_job(self.root, self.ledgers, ids, output, horizon, previous, **kw)


def seen(directory: StoragePath) -> Seen:
    entries, nxt = CompactedLedger(directory).read(P(0, 0), 1_000_000)
    assert nxt is None
    return [(e.position, e.key, e.value) for e in entries]


def files_under(directory: StoragePath) -> list[str]:
    """Every file under ``directory``, at any depth, relative to it."""
    return [f.key[len(directory.key) + 1 :] for f in directory.storage.list(directory.key)]


def messages(rng: random.Random, keys: int, n: int) -> list[Msg]:
    out: list[Msg] = []
    for _ in range(n):
        r = rng.random()
        key = None if r < 0.05 else f"k{rng.randrange(keys)}"
        out.append((key, None if r > 0.85 else rng.randbytes(rng.randrange(1, 8))))
    return out


@pytest.fixture
def topic(storage: Storage) -> Topic:
    return Topic(storage.at("ledgers/public/default/t"))


@pytest.fixture
def reference(tmp_path: Path) -> Topic:
    """The same topic as plain local paths, as the compactor was always given it."""
    root = tmp_path / "reference" / "t"
    root.mkdir(parents=True)
    return Topic(as_storage_path(root))


@pytest.fixture
def compactor(spark: SparkSession) -> TwoPhaseCompactor:
    # Two groups on two cores (partials written and read through the storage), and a delta
    # round's probe shared by two tasks (their dead rows too).
    return TwoPhaseCompactor(spark, min_part_bytes=0, probe_rows=1)


def test_full_delta_and_consolidating_rounds_equal_the_same_rounds_on_a_local_disk(
    topic: Topic, reference: Topic, compactor: TwoPhaseCompactor
) -> None:
    rng = random.Random(11)
    batches = [messages(rng, keys=30, n=40) for _ in range(4)]
    results: list[CompactionResult] = []
    expected: list[CompactionResult] = []
    # Full (base), delta, delta, then past max_deltas a consolidation into one base again.
    for lid, batch in enumerate(batches, start=1):
        kw = {"max_deltas": 2, "consolidation_ratio": 1.0, "retain_null_key": True}
        for t, out in ((topic, results), (reference, expected)):
            t.seal(lid, batch)
            out.append(
                compactor.compact(t.job(100 + lid, P(lid, len(batch) - 1), out[-1] if out else None, **kw))
            )
    assert [[layer.kind for layer in r.manifest.layers] for r in results] == [
        ["base"],
        ["base", "delta"],
        ["base", "delta", "delta"],
        ["base"],
    ]
    for got, want in zip(results, expected, strict=True):
        assert str(got.directory) == str(compacted_dir(topic.root, got.ledger_id))
        assert seen(got.directory) == seen(want.directory)
        assert [(la.rows, la.dead) for la in got.manifest.layers] == [
            (la.rows, la.dead) for la in want.manifest.layers
        ]
        assert (got.entries_read, got.records_kept, got.bytes_out) == (
            want.entries_read,
            want.records_kept,
            want.bytes_out,
        )
        # Only the ledger's own files: its parts, their key indexes, the deletion vectors it
        # wrote and the manifest -- no scratch of the phases, no staging file.
        names = files_under(got.directory)
        assert MANIFEST_NAME in names and not any(n.startswith(SCRATCH_DIR) for n in names)
        assert all(n.endswith((".parquet", ".keys.arrow", ".npy", MANIFEST_NAME)) for n in names)
        # Every file the manifest names is there, with the checksum the manifest records.
        for f in got.manifest.checked_files():
            if f.checksum is not None:
                assert file_checksum(f.path(topic.root)) == f.checksum
        # The new layer's lines (on object storage as the tasks described their parts) are
        # what reading the files gives; a line that does not fit its file is not taken.
        newest = got.manifest.layers[-1]
        assert newest.parts == describe_parts(got.directory, kind=newest.kind).parts
        wrong = {p.name: replace(p, size=p.size + 1, checksum="crc32c:00000000") for p in newest.parts}
        assert describe_parts(got.directory, kind=newest.kind, described=wrong).parts == newest.parts
    # Nothing was left under a temporary name, and the sealed ledgers are as they were written.
    assert not any(TMP_SUFFIX in name for name in files_under(topic.root))
    # The deletion vectors of the delta rounds were read from the storage too.
    assert any(layer.deletes is not None for r in results[1:3] for layer in r.manifest.layers)


def test_several_topics_in_one_job_and_the_other_strategies(
    topic: Topic, reference: Topic, compactor: TwoPhaseCompactor, storage: Storage
) -> None:
    rng = random.Random(5)
    other = Topic(storage.at("ledgers/public/default/u"))
    other_reference = Topic(as_storage_path(reference.root.local.with_name("u")))  # type: ignore[union-attr]
    for t, ref in ((topic, reference), (other, other_reference)):
        for lid in (1, 2):
            batch = messages(rng, keys=12, n=25)
            t.seal(lid, batch)
            ref.seal(lid, batch)
    got = compactor.compact_many([topic.job(10, P(2, 24)), other.job(11, P(2, 24))])
    want = compactor.compact_many([reference.job(10, P(2, 24)), other_reference.job(11, P(2, 24))])
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, CompactionResult) and isinstance(w, CompactionResult)
        assert seen(g.directory) == seen(w.directory)
    # The event-time strategy: phase one in Spark SQL, over input that Arrow tasks read on
    # object storage, then phase two written by Arrow tasks.
    event = compactor.compact(topic.job(12, P(2, 24), strategy="eventTime"))
    event_reference = compactor.compact(reference.job(12, P(2, 24), strategy="eventTime"))
    assert seen(event.directory) == seen(event_reference.directory)
    assert compactor.read_input(topic.job(13, P(2, 24))).count() == 50


def test_what_only_spark_sql_can_write_is_refused_on_object_storage_before_anything_is_written(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    big = 2**31 + 5  # ids that do not pack into one BIGINT
    topic.seal(big, [("a", b"a0"), ("a", b"a1"), ("b", b"b0")])
    topic.seal(1, [("a", b"a0"), (None, b"n"), ("a", b"a1")])
    unpacked = topic.job(big + 1, P(big, 2))
    retained = topic.job(big + 2, P(1, 2), strategy="eventTime", retain_null_key=True)
    if topic.root.local is not None:  # a local disk: Spark SQL does it
        assert seen(compactor.compact(unpacked).directory) == [
            (P(big, 1), "a", b"a1"),
            (P(big, 2), "b", b"b0"),
        ]
        assert seen(compactor.compact(retained).directory) == [(P(1, 1), None, b"n"), (P(1, 2), "a", b"a1")]
        return
    for job in (unpacked, retained):
        with pytest.raises(ValueError, match="needs the Arrow path") as e:
            compactor.compact(job)
        assert str(e.value) == NEEDS_ARROW
        assert files_under(compacted_dir(topic.root, job.output_ledger_id)) == []


@pytest.mark.parametrize("step", ["phase_two", "manifest", "rename"])
def test_a_failed_round_leaves_nothing_under_its_prefix_and_a_retry_succeeds(
    spark: SparkSession, topic: Topic, compactor: TwoPhaseCompactor, step: str
) -> None:
    topic.seal(1, [(f"k{i}", b"1") for i in range(10)])
    first = compactor.compact(topic.job(10, P(1, 9)))
    expected = seen(first.directory)
    topic.seal(2, [("k3", b"2"), ("k1", None), ("new", b"n")])
    before = {f.key: f.size for f in topic.root.storage.list(topic.root.key)}

    def crash(at: str) -> None:
        if at == step:
            raise RuntimeError(f"crash at {at}")

    failing = TwoPhaseCompactor(spark, min_part_bytes=0, probe_rows=1, fault_hook=crash)
    with pytest.raises(RuntimeError, match="crash"):
        failing.compact(topic.job(11, P(2, 2), first))
    final = compacted_dir(topic.root, 11)
    assert files_under(final) == [] and not final.exists()
    assert files_under(final.with_name(final.name + TMP_SUFFIX)) == []
    # The previous ledger and the sealed ones are untouched.
    assert {f.key: f.size for f in topic.root.storage.list(topic.root.key)} == before
    assert seen(first.directory) == expected
    retry = compactor.compact(topic.job(11, P(2, 2), first))
    assert [layer.kind for layer in retry.manifest.layers] == ["base", "delta"]
    assert [k for _, k, _ in seen(retry.directory)] == [
        "k0",
        "k2",
        "k4",
        "k5",
        "k6",
        "k7",
        "k8",
        "k9",
        "k3",
        "new",
    ]


def test_objects_of_a_crashed_attempt_at_the_same_ledger_are_replaced(
    topic: Topic, compactor: TwoPhaseCompactor
) -> None:
    topic.seal(1, [("a", b"a0"), ("b", b"b0"), ("a", b"a1")])
    final = compacted_dir(topic.root, 2)
    # What an attempt that crashed before its commit left: a stray part and scratch.
    (final / "part-00007.parquet").write_bytes(b"garbage")
    (final / SCRATCH_DIR / "partial-00000.arrow").write_bytes(b"garbage")
    if topic.root.local is not None:
        # A local disk renames a finished ledger into place: one there is never overwritten.
        with pytest.raises(FileExistsError):
            compactor.compact(topic.job(2, P(1, 2)))
        return
    result = compactor.compact(topic.job(2, P(1, 2)))
    assert seen(result.directory) == [(P(1, 1), "b", b"b0"), (P(1, 2), "a", b"a1")]
    assert "part-00007.parquet" not in files_under(final)
    assert not any(n.startswith(SCRATCH_DIR) for n in files_under(final))


def test_the_executors_read_a_probe_the_driver_wrote_to_the_storage(
    spark: SparkSession, storage: Storage
) -> None:
    root = storage.at("")
    assert check_executors(spark, root, timeout=120)
    assert not any(f.key.startswith(PROBE_PREFIX) for f in storage.list(""))
