"""Automatic compaction, the Kafka-style options, strategies and retention, against real Spark."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from api.client.routing import key_partition
from compactor import TwoPhaseCompactor
from compactor.two_phase import shared_group
from ledger.entry import Position, Record
from service.compaction import CompactionService
from service.errors import InvalidInput
from service.names import TopicName, partition
from service.partitions import PartitionedTopics
from service.policies import PolicyStore, Scope
from service.scheduler import CompactionScheduler, apply_retention, due
from service.subscription_service import SubscriptionService
from service.tenants import TenantService
from service.topics import Broker

pytestmark = pytest.mark.spark

NAME = TopicName("t", "ns", "auto")


@pytest.fixture
def policies(broker: Broker) -> PolicyStore:
    return PolicyStore(db=broker.db, settings=broker.settings)


@pytest.fixture
def compaction(broker: Broker, spark, policies: PolicyStore) -> Iterator[CompactionService]:
    svc = CompactionService(
        broker=broker, compactor=lambda: TwoPhaseCompactor(spark, min_part_bytes=0), policies=policies
    )
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture
def scheduler(broker: Broker, compaction: CompactionService, policies: PolicyStore) -> CompactionScheduler:
    broker.settings.max_entries_per_ledger = 5
    broker.create_topic(NAME)
    return CompactionScheduler(broker=broker, compaction=compaction, policies=policies, interval_s=0.1)


def produce(broker: Broker, *records: Record) -> list[Position]:
    return broker.produce(NAME, list(records))


def kv(key: str | None, value: bytes | None, **kw) -> Record:
    return Record(key=key, value=value, **kw)


def compacted(broker: Broker) -> list[tuple[str | None, bytes | None]]:
    got, _ = broker.read(NAME, "earliest", 10_000, read_compacted=True)
    return [(e.key, e.value) for e in got]


def runs(compaction: CompactionService) -> list[tuple[str, str]]:
    return [(r.trigger, r.status) for r in reversed(compaction.history(NAME))]


def test_threshold_compacts_without_a_rest_call_and_not_below_it(
    broker, scheduler, compaction, policies
) -> None:
    policies.set(Scope.topic_of(NAME), compactionThreshold=200)
    produce(broker, *[kv(f"k{i % 3}", b"x" * 20) for i in range(6)])  # ~126 bytes: below
    assert scheduler.tick() == []
    produce(broker, *[kv(f"k{i % 3}", b"y" * 20) for i in range(6)])  # ~252 bytes: over
    scheduler.start()
    try:
        deadline = time.monotonic() + 120
        while broker.topic(NAME).view is None or compaction.running():
            assert time.monotonic() < deadline, "the scheduler never compacted"
            time.sleep(0.1)
    finally:
        scheduler.stop()
    assert runs(compaction) == [("threshold", "SUCCESS")]
    assert compacted(broker) == [("k0", b"y" * 20), ("k1", b"y" * 20), ("k2", b"y" * 20)]
    # The backlog after the horizon is empty now: nothing more is due.
    assert due(broker.topic(NAME), policies.effective(NAME), int(time.time() * 1000)) is None


def test_dirty_ratio_and_max_lag_rules(broker, scheduler, compaction, policies) -> None:
    produce(broker, *[kv(f"k{i}", b"v") for i in range(8)])
    compaction.compact_now(NAME)  # 8 records in the compacted ledger
    produce(broker, kv("k0", b"new"), kv("k1", b"new"))  # 2 dirty: ratio 0.2
    topic = broker.topic(NAME)
    now = int(time.time() * 1000)
    policies.set(Scope.topic_of(NAME), minCleanableDirtyRatio=0.5)
    assert due(topic, policies.effective(NAME), now) is None
    policies.set(Scope.topic_of(NAME), minCleanableDirtyRatio=0.2)
    assert due(topic, policies.effective(NAME), now) == "dirtyRatio"
    policies.remove(Scope.topic_of(NAME), "minCleanableDirtyRatio")

    policies.set(Scope.topic_of(NAME), maxCompactionLagMs=60_000)
    assert due(topic, policies.effective(NAME), now) is None
    assert due(topic, policies.effective(NAME), now + 61_000) == "maxCompactionLag"
    time.sleep(0.05)
    policies.set(Scope.topic_of(NAME), maxCompactionLagMs=10)
    assert scheduler.tick() == [(str(NAME), "maxCompactionLag")]
    compaction.wait(NAME, timeout=120)
    assert runs(compaction)[-1] == ("maxCompactionLag", "SUCCESS")
    assert ("k0", b"new") in compacted(broker)


def test_policy_levels_and_invalid_values(broker, scheduler, policies) -> None:
    ns = Scope("t", "ns")
    assert policies.effective(NAME).compactionThreshold == 0  # the service default
    policies.set(ns, compactionThreshold=1000, compactionStrategy="eventTime")
    assert policies.effective(NAME).compactionThreshold == 1000
    policies.set(Scope.topic_of(NAME), compactionThreshold=10)
    assert policies.effective(NAME).compactionThreshold == 10
    assert policies.effective(NAME).compactionStrategy == "eventTime"  # field by field
    policies.remove(Scope.topic_of(NAME), "compactionThreshold")
    assert policies.effective(NAME).compactionThreshold == 1000
    for bad in (
        {"compactionThreshold": -1},
        {"minCleanableDirtyRatio": 1.5},
        {"compactionStrategy": "newest"},
        {"deleteRetentionMs": "soon"},
        {"retainNullKey": "yes"},
        {"compactionThreshold": 5, "minCompactionLagMs": -3},
    ):
        with pytest.raises(InvalidInput):
            policies.set(Scope.topic_of(NAME), **bad)
    assert policies.get(Scope.topic_of(NAME)).compactionThreshold is None


def test_min_compaction_lag_keeps_young_messages_after_the_horizon(
    broker, scheduler, compaction, policies
) -> None:
    old = produce(broker, kv("a", b"old"), kv("b", b"old"))
    time.sleep(0.3)
    young = produce(broker, kv("a", b"young"), kv("c", b"young"))
    policies.set(Scope.topic_of(NAME), minCompactionLagMs=250)
    assert compaction.compact_now(NAME).status == "SUCCESS"
    assert broker.topic(NAME).view.horizon == old[-1]
    got, _ = broker.read(NAME, "earliest", 100, read_compacted=True)
    assert [e.position for e in got] == old + young  # the young ones wait after the horizon
    time.sleep(0.3)
    assert compaction.compact_now(NAME).status == "SUCCESS"
    assert compacted(broker) == [("b", b"old"), ("a", b"young"), ("c", b"young")]


def test_delete_retention_keeps_a_tombstone_until_it_expires(broker, scheduler, compaction, policies) -> None:
    policies.set(Scope.topic_of(NAME), deleteRetentionMs=5000)
    deleted_at = time.monotonic()
    # "e" is deleted Pulsar's other way: an empty value.
    produce(broker, kv("a", b"1"), kv("b", b"1"), kv("e", b"1"), kv("a", None), kv("e", b""))
    compaction.compact_now(NAME)
    # Slow readers still see both deletes.
    assert compacted(broker) == [("b", b"1"), ("a", None), ("e", b"")]
    produce(broker, kv("c", b"1"))
    compaction.compact_now(NAME)
    assert time.monotonic() - deleted_at < 5, "the rounds were too slow to show retention"
    assert ("a", None) in compacted(broker) and ("e", b"") in compacted(broker)
    time.sleep(max(0.0, 5.1 - (time.monotonic() - deleted_at)))
    produce(broker, kv("d", b"1"))
    compaction.compact_now(NAME)  # the first round after expiry drops them
    assert compacted(broker) == [("b", b"1"), ("c", b"1"), ("d", b"1")]


@pytest.mark.parametrize(
    ("strategy", "records", "expected"),
    [
        (
            "eventTime",
            [kv("a", b"t9", event_time=9), kv("a", b"t3", event_time=3), kv("b", b"t1", event_time=1)],
            [("a", b"t9"), ("b", b"t1")],
        ),
        (
            "property:version",
            [
                kv("a", b"v7", properties={"version": "7"}),
                kv("a", b"v2", properties={"version": "2"}),
                kv("b", b"v1", properties={"version": "1"}),
                kv("b", b"v11", properties={"version": "11"}),
            ],
            [("a", b"v7"), ("b", b"v11")],
        ),
        ("offset", [kv("a", b"first", event_time=9), kv("a", b"second", event_time=3)], [("a", b"second")]),
    ],
)
def test_each_strategy_keeps_the_right_record_out_of_order(
    broker, scheduler, compaction, policies, strategy, records, expected
) -> None:
    policies.set(Scope.topic_of(NAME), compactionStrategy=strategy)
    produce(broker, *records)
    assert compaction.compact_now(NAME).status == "SUCCESS"
    assert sorted(compacted(broker)) == sorted(expected)
    # A later round merges with the previous compacted ledger by the same rule.
    produce(broker, kv("zz", b"1"))
    compaction.compact_now(NAME)
    assert sorted(compacted(broker)) == sorted([*expected, ("zz", b"1")])


def test_retention_deletes_only_what_it_may(broker, scheduler, compaction, policies) -> None:
    subs = SubscriptionService(broker=broker)
    subs.start()
    subs.create(NAME, "slow", initial_position="earliest")
    ids = produce(broker, *[kv(f"k{i % 7}", b"%d" % i) for i in range(23)])  # ledgers of 5
    compaction.compact_now(NAME)
    produce(broker, kv("after", b"1"))
    topic = broker.topic(NAME)
    policies.set(Scope.topic_of(NAME), retentionSizeBytes=0)  # as small as it may be
    now = int(time.time() * 1000)
    # The "slow" subscription has consumed nothing: no ledger may go yet.
    assert apply_retention(topic, policies.effective(NAME), now) == []
    cid = subs.attach(NAME, "slow").consumer_id
    got = subs.receive(NAME, "slow", cid, max_messages=12)
    subs.ack(NAME, "slow", cid, [got[-1].entry.position], cumulative=True)  # consumed through ids[11]
    deleted = apply_retention(topic, policies.effective(NAME), now)
    assert deleted == [ids[0].ledger_id, ids[5].ledger_id]  # whole ledgers, all consumed
    assert not list(topic.ledger.root.glob(f"{ids[0].ledger_id:020d}.parquet"))

    full, _ = broker.read(NAME, "earliest", 100)
    assert full[0].position == ids[10]  # a full reader starts at the first retained message
    live = {}
    for i in range(23):
        live[f"k{i % 7}"] = b"%d" % i
    assert sorted(compacted(broker)) == sorted([*live.items(), ("after", b"1")])

    subs.ack(NAME, "slow", cid, [got[-1].entry.position], cumulative=True)
    rest = subs.receive(NAME, "slow", cid, max_messages=100)
    subs.ack(NAME, "slow", cid, [rest[-1].entry.position], cumulative=True)
    deleted = apply_retention(topic, policies.effective(NAME), now)
    # Everything up to the horizon may go now, but never past it, nor the open ledger.
    assert deleted == [ids[10].ledger_id, ids[15].ledger_id, ids[20].ledger_id]
    assert sorted(compacted(broker)) == sorted([*live.items(), ("after", b"1")])
    # Time-based retention: nothing is old enough for a day.
    policies.set(Scope.topic_of(NAME), retentionSizeBytes=None, retentionTimeMs=86_400_000)
    assert apply_retention(topic, policies.effective(NAME), now) == []


def test_the_partitions_due_in_one_pass_compact_in_one_spark_job(
    broker, db, compaction, policies, spark
) -> None:
    broker.settings.max_entries_per_ledger = 5
    orders = TopicName("public", "default", "orders")
    tenants = TenantService(db=db, topics_of=broker.list_topics)
    partitioned = PartitionedTopics(
        db=db, broker=broker, tenants=tenants, max_partitions=8, route_key=key_partition
    )
    partitioned.create(orders, 3)
    # Set on the partitioned topic: every partition's threshold.
    policies.set(Scope.topic_of(orders), compactionThreshold=100)
    names = [partition(orders, i) for i in range(3)]
    for i, name in enumerate(names):
        broker.produce(name, [kv(f"k{j % 3}", f"{i}:{j}".encode() * 4) for j in range(9)])
    scheduler = CompactionScheduler(broker=broker, compaction=compaction, policies=policies, interval_s=60)

    assert sorted(scheduler.tick()) == [(str(n), "threshold") for n in names]

    for name in names:
        compaction.wait(name, timeout=120)
    rounds = [(compaction.history(n)[0].compacted_ledger_id or 0, broker.topic(n).ledger.root) for n in names]
    first, root = min(rounds)
    group = shared_group(root, first, len(rounds))
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup(group)) == 1
    for i, name in enumerate(names):
        got, _ = broker.read(name, "earliest", 100, read_compacted=True)
        assert [(e.key, e.value) for e in got] == [(f"k{j % 3}", f"{i}:{j}".encode() * 4) for j in (6, 7, 8)]
