"""The compaction of a topic against real Spark: Pulsar's scenarios, merging rounds, readers,
failures at every phase, concurrent producers, and a model-based random test."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from compactor import TwoPhaseCompactor
from compactor.two_phase import shared_group
from ledger.entry import Entry, Position, Record
from service import models
from service.compaction import CompactionService
from service.compaction_cursor import COMPACTED_LEDGER_PROPERTY
from service.cursor_store import COMPACTION_CURSOR
from service.names import TopicName, partition
from service.stats import internal_stats
from service.topics import Broker
from tests.ledger.test_checksums import flip_value_page

pytestmark = pytest.mark.spark

NAME = TopicName("t", "ns", "table")
EARLIEST = Position(0, 0)


@pytest.fixture
def topic(broker: Broker) -> TopicName:
    broker.settings.max_entries_per_ledger = 7  # several ledgers even for small tests
    broker.create_topic(NAME)
    return NAME


def produce(broker: Broker, *pairs: tuple[str | None, bytes | None]) -> list[Position]:
    return broker.produce(NAME, [Record(key=k, value=v) for k, v in pairs])


def read(broker: Broker, *, compacted: bool, start: str = "earliest", page: int = 5) -> list[Entry]:
    out: list[Entry] = []
    while True:
        got, nxt = broker.read(NAME, start, page, read_compacted=compacted)
        if not got:
            return out
        out.extend(got)
        start = str(nxt)


def kv(entries: list[Entry]) -> list[tuple[str | None, bytes | None]]:
    return [(e.key, e.value) for e in entries]


class Model:
    """What a compacted topic must show: the latest value of every live key."""

    def __init__(self) -> None:
        self.log: list[tuple[Position, str | None, bytes | None]] = []

    def add(self, ids: list[Position], pairs: list[tuple[str | None, bytes | None]]) -> None:
        self.log.extend((p, k, v) for p, (k, v) in zip(ids, pairs, strict=True))

    def compacted(
        self, horizon: Position, retain_null_key: bool = False
    ) -> list[tuple[Position, str | None, bytes | None]]:
        latest: dict[str, tuple[Position, bytes | None]] = {}
        keyless = []
        for p, k, v in self.log:
            if p > horizon:
                break
            if k is None:
                if retain_null_key and v is not None:
                    keyless.append((p, k, v))
            else:
                latest[k] = (p, v)
        rows = [(p, k, v) for k, (p, v) in latest.items() if v is not None] + keyless
        return sorted(rows, key=lambda r: r[0])

    def expected_read_compacted(
        self, horizon: Position, start: Position = EARLIEST
    ) -> list[tuple[Position, str | None, bytes | None]]:
        if start > horizon:
            return [r for r in self.log if r[0] >= start]
        return [r for r in self.compacted(horizon) if r[0] >= start] + [r for r in self.log if r[0] > horizon]


def horizon_of(broker: Broker) -> Position:
    view = broker.topic(NAME).view
    assert view is not None
    return view.horizon


def compacted_files(root: Path) -> set[Path]:
    """Every file under the topic's compacted ledger directories."""
    return {f for d in root.glob("compacted-*") for f in d.rglob("*") if f.is_file()}


def only_the_view_s_files_remain(broker: Broker) -> bool:
    """The files on disk are exactly those the current view's manifest names: replaced
    ledgers' own files are gone, the layers the view shares with them are not."""
    topic = broker.topic(NAME)
    assert topic.view is not None
    return compacted_files(topic.ledger.root) == {f.local for f in topic.view.files}


def checksums(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.glob("*.parquet"))}


# ---------------------------------------------------------------- Pulsar's scenarios


def test_latest_value_per_key_kept_with_its_original_message_id(broker, compaction, topic) -> None:
    ids = produce(broker, ("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("b", b"2"), ("a", b"3"))
    st = compaction.compact_now(topic)
    assert st.status == "SUCCESS", st.last_error
    got = read(broker, compacted=True)
    assert [(e.position, e.key, e.value) for e in got] == [
        (ids[3], "c", b"1"),
        (ids[4], "b", b"2"),
        (ids[5], "a", b"3"),
    ]
    # The full log is still there for readCompacted=false.
    assert len(read(broker, compacted=False)) == 6

    stats = internal_stats(broker, topic)
    cursor = next(c for c in stats.cursors if c.name == COMPACTION_CURSOR)
    assert cursor.mark_delete == ids[-1] == stats.horizon
    assert cursor.properties == {COMPACTED_LEDGER_PROPERTY: stats.compacted_ledger.ledger_id}
    assert stats.compacted_ledger.entries == 3 and stats.compacted_ledger.size > 0


def test_tombstone_removes_its_key_and_last_key_deleted(broker, compaction, topic) -> None:
    produce(broker, ("a", b"1"), ("b", b"1"), ("a", None), ("b", b"2"))
    compaction.compact_now(topic)
    assert kv(read(broker, compacted=True)) == [("b", b"2")]
    produce(broker, ("b", None))  # the last live key is deleted
    assert compaction.compact_now(topic).status == "SUCCESS"
    assert read(broker, compacted=True) == []
    assert internal_stats(broker, topic).compacted_ledger.entries == 0


def test_topic_of_only_tombstones(broker, compaction, topic) -> None:
    produce(broker, ("a", None), ("b", None), ("a", None))
    assert compaction.compact_now(topic).status == "SUCCESS"
    assert read(broker, compacted=True) == []
    assert internal_stats(broker, topic).compacted_ledger.entries == 0


def test_empty_topic_is_a_quick_success(broker, compaction, topic) -> None:
    assert compaction.status(topic).status == "NOT_RUN"
    st = compaction.compact_now(topic)
    assert st.status == "SUCCESS"
    stats = internal_stats(broker, topic)
    assert stats.compacted_ledger.ledger_id == -1 and stats.horizon is None
    assert not list(broker.topic(topic).ledger.root.glob("compacted-*"))


@pytest.mark.parametrize("retain", [False, True])
def test_keyless_messages_dropped_or_kept_in_order(broker, compaction, topic, retain: bool) -> None:
    broker.settings.retain_null_key = retain
    ids = produce(broker, (None, b"x1"), ("a", b"1"), (None, b"x2"), ("a", b"2"), (None, None))
    compaction.compact_now(topic)
    got = [(e.position, e.key, e.value) for e in read(broker, compacted=True)]
    if retain:
        assert got == [(ids[0], None, b"x1"), (ids[2], None, b"x2"), (ids[3], "a", b"2")]
    else:
        assert got == [(ids[3], "a", b"2")]


def test_second_compaction_without_new_messages(broker, compaction, topic) -> None:
    produce(broker, ("a", b"1"), ("a", b"2"))
    compaction.compact_now(topic)
    first = internal_stats(broker, topic)
    assert compaction.compact_now(topic).status == "SUCCESS"
    second = internal_stats(broker, topic)
    assert second.compacted_ledger == first.compacted_ledger and second.horizon == first.horizon
    assert kv(read(broker, compacted=True)) == [("a", b"2")]


def test_ten_rounds_equal_one_compaction_of_the_whole_log(broker, compaction, topic, spark) -> None:
    rng = random.Random(7)
    model = Model()
    once = [("once", b"written-once-before-round-one")]
    model.add(produce(broker, *once), once)
    for _ in range(10):
        pairs = [(f"k{rng.randrange(12)}", rng.choice([None, b"v%d" % rng.randrange(100)])) for _ in range(9)]
        model.add(produce(broker, *pairs), pairs)
        assert compaction.compact_now(topic).status == "SUCCESS"
    horizon = horizon_of(broker)
    rounds = [(e.position, e.key, e.value) for e in read(broker, compacted=True)]
    assert rounds == model.compacted(horizon)
    assert ("once", b"written-once-before-round-one") in [(k, v) for _, k, v in rounds]

    # One compaction of the whole log, on a fresh topic with the same messages, gives the same records.
    other = TopicName("t", "ns", "once")
    broker.create_topic(other)
    broker.produce(other, [Record(key=k, value=v) for _, k, v in model.log])
    compaction.compact_now(other)
    got, _ = broker.read(other, "earliest", 1000, read_compacted=True)
    assert [(e.key, e.value) for e in got] == [(k, v) for _, k, v in rounds]


# ---------------------------------------------------------------- the original log, readers


def test_original_log_unchanged_and_full_reader_sees_everything(broker, compaction, topic) -> None:
    pairs = [(f"k{i % 4}", b"%d" % i) for i in range(30)] + [("k1", None)]
    ids = produce(broker, *pairs)
    broker.topic(topic).ledger.roll_over()
    root = broker.topic(topic).ledger.root
    before = checksums(root)
    assert len(before) >= 4
    compaction.compact_now(topic)
    produce(broker, ("k0", b"later"))
    compaction.compact_now(topic)
    after = checksums(root)
    assert {k: after[k] for k in before} == before
    full = read(broker, compacted=False)
    assert [e.position for e in full][: len(ids)] == ids and kv(full) == pairs + [("k0", b"later")]


def test_read_compacted_from_every_start_id(broker, compaction, topic) -> None:
    model = Model()
    pairs = [(f"k{i % 5}", None if i % 7 == 3 else b"%d" % i) for i in range(40)]
    model.add(produce(broker, *pairs), pairs)
    compaction.compact_now(topic)
    after = [("k1", b"after"), (None, b"keyless"), ("k2", None)]
    model.add(produce(broker, *after), after)
    horizon = horizon_of(broker)
    assert [
        (e.position, e.key, e.value) for e in read(broker, compacted=True)
    ] == model.expected_read_compacted(horizon)
    for p, _, _ in model.log:
        for page in (1, 4):
            got = read(broker, compacted=True, start=str(p), page=page)
            assert [(e.position, e.key, e.value) for e in got] == model.expected_read_compacted(horizon, p), (
                p,
                page,
            )


# ---------------------------------------------------------------- failures


@pytest.mark.parametrize("point", ["phase_one", "phase_two", "before_commit"])
def test_failure_leaves_topic_as_it_was_then_next_run_succeeds(broker, compaction, topic, point: str) -> None:
    produce(broker, ("a", b"1"), ("b", b"1"), ("a", b"2"))
    compaction.compact_now(topic)
    produce(broker, ("b", b"2"), ("c", b"1"))
    root = broker.topic(topic).ledger.root
    stats_before = internal_stats(broker, topic)
    read_before = kv(read(broker, compacted=True))
    dirs_before = sorted(p.name for p in root.iterdir() if p.name.startswith("compacted-"))

    def fail(at: str) -> None:
        if at == point:
            raise RuntimeError(f"injected failure at {at}")

    compaction.fault_hook = fail
    st = compaction.compact_now(topic)
    assert st.status == "ERROR" and f"injected failure at {point}" in (st.last_error or "")
    stats_after = internal_stats(broker, topic)
    assert stats_after.compacted_ledger == stats_before.compacted_ledger
    assert stats_after.horizon == stats_before.horizon and stats_after.cursors == stats_before.cursors
    assert kv(read(broker, compacted=True)) == read_before
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("compacted-")) == dirs_before
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]

    compaction.fault_hook = None
    assert compaction.compact_now(topic).status == "SUCCESS"
    assert kv(read(broker, compacted=True)) == [("a", b"2"), ("b", b"2"), ("c", b"1")]
    assert only_the_view_s_files_remain(broker)


def test_restart_removes_unreferenced_compacted_ledgers_and_keeps_the_view(
    broker, compaction, topic, settings, db, spark
) -> None:
    produce(broker, ("a", b"1"), ("a", b"2"))
    compaction.compact_now(topic)
    root = broker.topic(topic).ledger.root
    (root / "compacted-00000000000000099999").mkdir()  # as if a crash left a half-built ledger
    compaction.stop()
    broker.stop()
    b2 = Broker(settings=settings, db=db)
    b2.start()
    svc = CompactionService(broker=b2, compactor=lambda: TwoPhaseCompactor(spark, min_part_bytes=0))
    svc.start()
    assert [p.name for p in root.iterdir() if p.name.startswith("compacted-")] == [
        f"compacted-{b2.topic(topic).view.ledger_id:020d}"
    ]
    got, _ = b2.read(topic, "earliest", 10, read_compacted=True)
    assert kv(got) == [("a", b"2")]
    svc.stop()
    b2.stop()


# ---------------------------------------------------------------- concurrency


def test_producing_while_compaction_runs_loses_nothing(broker, compaction, topic) -> None:
    model = Model()
    first = [(f"k{i % 10}", b"%d" % i) for i in range(50)]
    model.add(produce(broker, *first), first)
    stop = threading.Event()
    produced: list[tuple[list[Position], list[tuple[str | None, bytes | None]]]] = []

    def producer() -> None:
        i = 0
        while not stop.is_set() or i < 20:
            pairs = [(f"k{i % 13}", b"p%d" % i)]
            produced.append((produce(broker, *pairs), pairs))
            i += 1

    t = threading.Thread(target=producer)
    t.start()
    compaction.trigger(topic)
    compaction.wait(topic, timeout=120)
    stop.set()
    t.join()
    assert compaction.status(topic).status == "SUCCESS"
    for ids, pairs in sorted(produced, key=lambda x: x[0][0]):
        model.add(ids, pairs)
    horizon = horizon_of(broker)
    expected = model.expected_read_compacted(horizon)
    assert [(e.position, e.key, e.value) for e in read(broker, compacted=True, page=50)] == expected
    assert [(e.position, e.key, e.value) for e in read(broker, compacted=False, page=50)] == model.log


def test_second_trigger_while_running_is_a_conflict(broker, compaction, topic) -> None:
    from service.errors import Conflict

    produce(broker, ("a", b"1"))
    gate = threading.Event()
    compaction.fault_hook = lambda at: gate.wait(30) if at == "phase_one" else None
    compaction.trigger(topic)
    try:
        with pytest.raises(Conflict):
            compaction.trigger(topic)
        assert compaction.status(topic).status == "RUNNING"
    finally:
        gate.set()
        compaction.wait(topic, timeout=120)
    assert compaction.status(topic).status == "SUCCESS"


# ---------------------------------------------------------------- model-based


def test_random_sequences_match_a_dict_model(broker, compaction, topic) -> None:
    rng = random.Random(20261121)
    model = Model()
    keys = [f"key-{i}" for i in range(300)]
    horizon: Position | None = None
    for step in range(14):
        action = rng.random()
        if action < 0.6 or step == 0:
            pairs = [
                (rng.choice(keys), None if rng.random() < 0.15 else rng.randbytes(rng.randrange(1, 12)))
                for _ in range(rng.randrange(1, 120))
            ]
            model.add(produce(broker, *pairs), pairs)
        else:
            assert compaction.compact_now(topic).status == "SUCCESS"
            horizon = broker.topic(NAME).view.horizon if broker.topic(NAME).view else None
        full = [(e.position, e.key, e.value) for e in read(broker, compacted=False, page=97)]
        assert full == model.log
        if horizon is not None:
            got = [(e.position, e.key, e.value) for e in read(broker, compacted=True, page=61)]
            assert got == model.expected_read_compacted(horizon)
            # The latest state: what a TableView would build from a readCompacted reader.
            state: dict[str, bytes] = {}
            for _, k, v in got:
                if k is None:
                    continue
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = v
            truth: dict[str, bytes] = {}
            for _, k, v in model.log:
                if k is None:
                    continue
                if v is None:
                    truth.pop(k, None)
                else:
                    truth[k] = v
            assert state == truth


def test_readers_never_fail_while_compactions_replace_the_compacted_ledger(broker, compaction, topic) -> None:
    produce(broker, *[(f"k{i % 20}", b"%d" % i) for i in range(60)])
    compaction.compact_now(topic)
    errors: list[BaseException] = []
    reads = 0
    stop = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                got = read(broker, compacted=True, page=4)
                positions = [e.position for e in got]
                assert positions == sorted(positions) and len({e.key for e in got}) == 20
                reads += 1
                time.sleep(0.02)  # leave CPU to the compaction: this test is about correctness
            except BaseException as e:  # noqa: BLE001 - surfaced below
                errors.append(e)
                return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for round_ in range(3):
        produce(broker, *[(f"k{i}", b"round%d" % round_) for i in range(20)])
        assert compaction.compact_now(topic).status == "SUCCESS"
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert reads > 0
    # Replaced ledgers are gone once no read holds them.
    assert only_the_view_s_files_remain(broker)


def test_keyless_messages_across_rounds_follow_the_current_setting(broker, compaction, topic) -> None:
    broker.settings.retain_null_key = True
    ids = produce(broker, (None, b"x1"), ("a", b"1"))
    compaction.compact_now(topic)
    more = produce(broker, (None, b"x2"), ("a", b"2"))
    compaction.compact_now(topic)  # a later round copies the previous keyless rows
    got = [(e.position, e.key, e.value) for e in read(broker, compacted=True)]
    assert got == [(ids[0], None, b"x1"), (more[0], None, b"x2"), (more[1], "a", b"2")]
    broker.settings.retain_null_key = False
    produce(broker, ("b", b"1"))
    compaction.compact_now(topic)
    assert kv(read(broker, compacted=True)) == [("a", b"2"), ("b", b"1")]


# ---------------------------------------------------------------- partitions: one job for all


def test_the_partitions_of_a_topic_compact_in_one_spark_job_and_a_damaged_one_fails_alone(
    broker, compaction, spark
) -> None:
    broker.settings.max_entries_per_ledger = 7
    orders = TopicName("t", "ns", "orders")
    names = [partition(orders, i) for i in range(3)]
    model: dict[TopicName, dict[str, bytes]] = {}
    for i, name in enumerate(names):
        broker.create_topic(name)
        pairs = [(f"k{j % 5}", f"{i}:{j}".encode()) for j in range(20)]
        broker.produce(name, [Record(key=k, value=v) for k, v in pairs])
        model[name] = dict(pairs)
    # Partition 1's last ledger (where every key's latest value is) gets a damaged page after
    # it was sealed and verified: only the Spark task that decodes the page can find it.
    damaged = broker.topic(names[1]).ledger
    last = damaged.roll_over()
    assert last is not None
    ledger_id, path = damaged.sealed_files(None, last)[-1]
    flip_value_page(path.local, 0)

    skipped = compaction.trigger_many(names)
    assert skipped.busy == [] and skipped.elsewhere == {}
    for name in names:
        compaction.wait(name, timeout=120)

    statuses = [compaction.status(n) for n in names]
    assert [s.status for s in statuses] == ["SUCCESS", "ERROR", "SUCCESS"]
    assert f"ledger {ledger_id} of {names[1]} is damaged" in (statuses[1].last_error or "")
    # The job's group is named after the round with the smallest compacted ledger id (the
    # failed round's id is in the metadata too, its ledger marked deleted).
    with broker.db.session() as s:
        rounds = [
            (ledger_id, broker.topic(n).ledger.root)
            for n in names
            for ledger_id in s.scalars(
                select(models.Ledger.id).where(
                    models.Ledger.topic_id == broker.topic(n).topic_id, models.Ledger.kind == models.COMPACTED
                )
            )
        ]
    assert len(rounds) == 3
    first, root = min(rounds)
    group = shared_group(root, first, 3)
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup(group)) == 1
    for name in (names[0], names[2]):
        got, _ = broker.read(name, "earliest", 100, read_compacted=True)
        assert {e.key: e.value for e in got} == model[name]
        assert broker.topic(name).view is not None
    assert broker.topic(names[1]).view is None
    assert not [p for p in damaged.root.iterdir() if p.name.startswith("compacted-")]
