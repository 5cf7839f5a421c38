"""A compacted topic's Iceberg table through the service (issue 52): rounds of a topic whose
policy has ``table`` on commit snapshots equal to the readCompacted view; the policy's
precedence; a failed commit never fails the round and the next one catches up; the ledgers
kept snapshots name keep their files (rounds, restarts, the scrub's sweep) until the snapshots
expire; deleting the topic drops its table; a partitioned topic's partitions share one table."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.table import StaticTable
from sqlalchemy import select

from compactor import TwoPhaseCompactor
from ledger import paths
from ledger.entry import Record
from ledger.value_columns import DECODE_FAILED
from service import models
from service.compaction import CompactionService
from service.db import Database
from service.metrics import ServiceMetrics
from service.names import TopicName, partition
from service.policies import Scope
from service.schemas import SchemaInfo, SchemaRegistry
from service.settings import Settings
from service.tables import TopicTables
from service.topics import Broker
from tests.service.test_compaction import NAME, compacted_files, produce
from tests.service.test_typed_columns import JSON_CODEC, _account

pytestmark = pytest.mark.spark

Row = tuple[int, int, str | None, bytes | None]


@pytest.fixture
def metrics() -> ServiceMetrics:
    return ServiceMetrics()


@pytest.fixture
def compaction(broker: Broker, spark, metrics: ServiceMetrics) -> Iterator[CompactionService]:
    """The compaction service as the app makes it: with its metrics."""
    metrics.watch(broker)
    svc = CompactionService(
        broker=broker, compactor=lambda: TwoPhaseCompactor(spark, min_part_bytes=0), metrics=metrics
    )
    svc.start()
    yield svc
    svc.stop()
    metrics.unwatch()


@pytest.fixture
def topic(broker: Broker, compaction: CompactionService) -> TopicName:
    broker.settings.max_entries_per_ledger = 7
    compaction.policies.set(Scope(NAME.tenant, NAME.namespace), table=True)
    broker.create_topic(NAME)
    return NAME


def table_row(broker: Broker, table: TopicName = NAME) -> models.TopicTable | None:
    with broker.db.session() as s:
        row = s.get(models.TopicTable, (table.tenant, table.namespace, table.topic))
        if row is not None:
            s.expunge(row)
        return row


def commit_state(broker: Broker, name: TopicName = NAME) -> models.TableCommitState | None:
    with broker.db.session() as s:
        state = s.get(models.TableCommitState, broker.topic(name).topic_id)
        if state is not None:
            s.expunge(state)
        return state


def table_rows(location: str, snapshot_id: int | None = None, where: str = "True") -> list[Row]:
    """The table's rows (at ``snapshot_id``: time travel), in message-id order."""
    scan = StaticTable.from_metadata(location).scan(row_filter=where, snapshot_id=snapshot_id)
    t = scan.to_arrow().sort_by([("ledger_id", "ascending"), ("entry_id", "ascending")])
    return list(
        zip(
            t.column("ledger_id").to_pylist(),
            t.column("entry_id").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    )


def view_rows(broker: Broker, name: TopicName = NAME) -> list[Row]:
    """The readCompacted view (no message after the horizon is produced in these tests)."""
    got, start, out = None, "earliest", []
    while got != []:
        got, nxt = broker.read(name, start, 50, read_compacted=True)
        out.extend((e.position.ledger_id, e.position.entry_id, e.key, e.value) for e in got)
        start = str(nxt)
    return out


def round_ok(compaction: CompactionService, name: TopicName = NAME) -> None:
    st = compaction.compact_now(name)
    assert st.status == "SUCCESS", st.last_error


def scrape(metrics: ServiceMetrics, metric: str, name: TopicName = NAME) -> float | None:
    for line in metrics.render().decode().splitlines():
        if line.startswith(metric + "{") and f'topic="{name}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_each_round_commits_a_snapshot_equal_to_the_view(broker, compaction, metrics, topic) -> None:
    produce(broker, ("a", b"1"), ("b", b"1"), ("a", b"2"), (None, b"keyless"), ("c", b"1"))
    round_ok(compaction)
    row = table_row(broker)
    assert row is not None and row.version == 1
    first = commit_state(broker)
    assert first is not None and first.lag_rounds == 0 and first.last_error is None
    assert first.ledger_id == broker.topic(NAME).view.ledger_id
    assert table_rows(row.metadata_location) == view_rows(broker) != []
    before = view_rows(broker)

    # A delta round: an update, a tombstone, a new key, batches of the same key.
    produce(broker, ("b", b"2"), ("c", None), ("d", b"1"), ("d", b"2"))
    round_ok(compaction)
    row = table_row(broker)
    assert row is not None and row.version == 2
    rows = table_rows(row.metadata_location)
    assert rows == view_rows(broker)
    assert "c" not in {k for _, _, k, _ in rows}  # tombstoned
    # Time travel: the previous snapshot is the previous round's view.
    assert table_rows(row.metadata_location, snapshot_id=first.snapshot_id) == before
    assert commit_state(broker).snapshot_id != first.snapshot_id
    assert scrape(metrics, "pulsar_compaction_table_lag_rounds") == 0


def test_the_topic_s_policy_overrides_its_namespace_s(broker, compaction, topic) -> None:
    compaction.policies.set(Scope.topic_of(NAME), table=False)
    produce(broker, ("a", b"1"))
    round_ok(compaction)
    assert table_row(broker) is None and compaction.tables.status(NAME) is None
    assert not paths.table_dir(broker.storage.at(), NAME.tenant, NAME.namespace, NAME.topic).exists()

    compaction.policies.remove(Scope.topic_of(NAME), "table")  # the namespace's on again
    produce(broker, ("b", b"1"))
    round_ok(compaction)
    row = table_row(broker)
    assert row is not None and table_rows(row.metadata_location) == view_rows(broker)
    status = compaction.tables.status(NAME)
    assert status is not None and status.enabled and status.snapshot_id is not None

    # Turned off: the next round drops the table, its files and the pins of its ledgers.
    compaction.policies.set(Scope.topic_of(NAME), table=False)
    produce(broker, ("c", b"1"))
    round_ok(compaction)
    assert table_row(broker) is None and compaction.tables.status(NAME) is None
    assert not Path(row.metadata_location).exists()
    assert compacted_files(broker.topic(NAME).ledger.root) == {f.local for f in broker.topic(NAME).view.files}


def test_a_failed_commit_leaves_the_round_and_the_next_round_catches_up(
    broker, compaction, metrics, topic
) -> None:
    produce(broker, ("a", b"1"), ("b", b"1"))
    round_ok(compaction)
    committed = table_row(broker)
    assert committed is not None
    # The table's directory made unwritable: a file where its metadata directory goes.
    metadata = Path(committed.metadata_location).parent
    moved = metadata.with_name("metadata.aside")
    metadata.rename(moved)
    metadata.write_bytes(b"")

    produce(broker, ("a", b"2"), ("c", b"1"))
    round_ok(compaction)  # the round succeeds ...
    assert [(k, v) for _, _, k, v in view_rows(broker)] == [("b", b"1"), ("a", b"2"), ("c", b"1")]
    state = commit_state(broker)
    assert state is not None and state.lag_rounds == 1
    assert state.last_error and "\n" not in state.last_error
    assert table_row(broker).version == committed.version  # ... the table is where it was
    status = compaction.tables.status(NAME)
    assert status is not None and (status.lag_rounds, status.last_error) == (1, state.last_error)
    assert scrape(metrics, "pulsar_compaction_table_lag_rounds") == 1
    assert scrape(metrics, "pulsar_compaction_table_commit_failed_total") == 1

    metadata.unlink()
    moved.rename(metadata)
    round_ok(compaction)  # nothing new to compact: the table still catches up with the view
    state = commit_state(broker)
    assert state is not None and (state.lag_rounds, state.last_error) == (0, None)
    assert table_rows(table_row(broker).metadata_location) == view_rows(broker)
    produce(broker, ("d", b"1"))
    round_ok(compaction)
    state = commit_state(broker)
    assert state is not None and (state.lag_rounds, state.last_error) == (0, None)
    row = table_row(broker)
    assert table_rows(row.metadata_location) == view_rows(broker)
    assert scrape(metrics, "pulsar_compaction_table_lag_rounds") == 0


def own_files(broker: Broker, ledger_id: int) -> set[Path]:
    """The files in compacted ledger ``ledger_id``'s own directory."""
    d = paths.compacted_dir(broker.topic(NAME).ledger.root, ledger_id)
    return {f for f in d.rglob("*") if f.is_file()}


def restart(broker: Broker, compaction: CompactionService, spark) -> tuple[Broker, CompactionService]:
    settings: Settings = broker.settings
    db: Database = broker.db
    compaction.stop()
    broker.stop()
    again = Broker(settings=settings, db=db)
    again.start()
    svc = CompactionService(broker=again, compactor=lambda: TwoPhaseCompactor(spark, min_part_bytes=0))
    svc.start()
    return again, svc


def test_a_kept_snapshot_s_ledger_keeps_its_files_until_the_snapshot_expires(
    broker, compaction, topic, spark
) -> None:
    broker.settings.table_snapshots_kept = 3
    broker.settings.compaction_max_deltas = 0  # every round a full one: each ledger owns its files
    produce(broker, ("a", b"1"), ("b", b"1"))
    round_ok(compaction)
    first = broker.topic(NAME).view.ledger_id
    before = view_rows(broker)
    pinned = own_files(broker, first)
    first_snapshot = commit_state(broker).snapshot_id
    produce(broker, ("a", b"2"))
    round_ok(compaction)
    assert broker.topic(NAME).view.ledger_id != first
    assert own_files(broker, first) == pinned  # replaced, but a kept snapshot names it
    assert compaction.sweep_orphans(broker.topic(NAME)) == 0
    assert own_files(broker, first) == pinned
    location = table_row(broker).metadata_location
    assert table_rows(location, snapshot_id=first_snapshot) == before

    broker, compaction = restart(broker, compaction, spark)
    try:
        assert own_files(broker, first) == pinned  # the load's clean-up kept them
        assert table_rows(location, snapshot_id=first_snapshot) == before
        # Kept: one snapshot. The next round's commit expires the older ones, whose ledgers go.
        broker.settings.table_snapshots_kept = 1
        produce(broker, ("b", b"2"))
        round_ok(compaction)
        assert own_files(broker, first) == set()
        topic_ = broker.topic(NAME)
        assert compacted_files(topic_.ledger.root) == {f.local for f in topic_.view.files}
        assert table_rows(table_row(broker).metadata_location) == view_rows(broker)
    finally:
        compaction.stop()
        broker.stop()


def test_deleting_the_topic_drops_its_table(broker, compaction, topic) -> None:
    produce(broker, ("a", b"1"))
    round_ok(compaction)
    row = table_row(broker)
    assert row is not None
    table_dir = paths.table_dir(broker.storage.at(), NAME.tenant, NAME.namespace, NAME.topic)
    assert table_dir.exists()
    topic_id = broker.topic(NAME).topic_id
    broker.delete_topic(NAME)
    assert table_row(broker) is None and not table_dir.exists()
    with broker.db.session() as s:
        assert (
            s.scalars(
                select(models.TableCommitState).where(models.TableCommitState.topic_id == topic_id)
            ).all()
            == []
        )


def test_a_partitioned_topic_s_partitions_commit_into_one_table(broker, compaction, topic) -> None:
    base = TopicName(NAME.tenant, NAME.namespace, "orders")
    parts = [partition(base, i) for i in range(2)]
    for p in parts:
        broker.create_topic(p)
    broker.produce(parts[0], [Record(key="a", value=b"0"), Record(key="b", value=b"0")])
    broker.produce(parts[1], [Record(key="c", value=b"1")])
    compaction.trigger_many(parts)
    for p in parts:
        compaction.wait(p, timeout=120)
        assert compaction.status(p).status == "SUCCESS"
    row = table_row(broker, base)
    assert row is not None
    for i, p in enumerate(parts):
        assert table_rows(row.metadata_location, where=f"partition == {i}") == view_rows(broker, p)
    # One partition's next round keeps the other's rows in the table.
    broker.produce(parts[1], [Record(key="c", value=b"2")])
    round_ok(compaction, parts[1])
    row = table_row(broker, base)
    assert table_rows(row.metadata_location, where="partition == 0") == view_rows(broker, parts[0])
    assert table_rows(row.metadata_location, where="partition == 1") == view_rows(broker, parts[1])
    status = compaction.tables.status(base, parts)
    assert status is not None and status.lag_rounds == 0
    # One partition's own ``table`` is not asked: the partitioned topic's policy keeps the table.
    compaction.policies.set(Scope.topic_of(parts[1]), table=False)
    broker.produce(parts[1], [Record(key="c", value=b"3")])
    round_ok(compaction, parts[1])
    row = table_row(broker, base)
    assert row is not None
    assert table_rows(row.metadata_location, where="partition == 0") == view_rows(broker, parts[0])
    assert table_rows(row.metadata_location, where="partition == 1") == view_rows(broker, parts[1])


def test_a_json_schema_topic_s_fields_are_table_columns(broker, compaction, topic) -> None:
    definition = str(JSON_CODEC.schema_info().schema()).encode()
    SchemaRegistry(broker.db, policies=compaction.policies).put(NAME, SchemaInfo("JSON", definition))
    broker.produce(
        NAME,
        [
            Record(key="a", value=JSON_CODEC.encode(_account(1, 10))),
            Record(key="b", value=b"not json"),
            Record(key="a", value=JSON_CODEC.encode(_account(2, 20))),
        ],
    )
    round_ok(compaction)
    row = table_row(broker)
    assert row is not None
    t = StaticTable.from_metadata(row.metadata_location).scan().to_arrow().sort_by("key")
    assert t.column("key").to_pylist() == ["a", "b"]
    assert t.column("owner").to_pylist() == ["owner-2", None]
    assert t.column("balance").to_pylist() == [20, None]
    assert t.column(DECODE_FAILED).to_pylist() == [False, True]
    # A SQL-style filter on a typed column.
    hit = StaticTable.from_metadata(row.metadata_location).scan(row_filter="balance == 20").to_arrow()
    assert hit.column("key").to_pylist() == ["a"]


def test_commits_of_two_instances_into_one_table_never_overwrite_each_other(
    broker, compaction, topic
) -> None:
    """Two instances' commits of one partitioned topic's table (each with its own locks, as
    two processes): every commit lands, none replaces the other's partition."""
    base = TopicName(NAME.tenant, NAME.namespace, "orders")
    parts = [partition(base, i) for i in range(2)]
    for i, p in enumerate(parts):
        broker.create_topic(p)
        broker.produce(p, [Record(key=f"k{i}", value=b"v")])
        round_ok(compaction, p)
    version = table_row(broker, base).version
    other = TopicTables(broker=broker, policies=compaction.policies)  # the second instance
    errors: list[BaseException] = []

    def commit(tables: TopicTables, name: TopicName) -> None:
        topic_ = broker.topic(name)
        try:
            for run in range(4):
                tables.after_round(topic_, topic_.view, 1000 + run)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [
        threading.Thread(target=commit, args=(compaction.tables, parts[0])),
        threading.Thread(target=commit, args=(other, parts[1])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [commit_state(broker, p).lag_rounds for p in parts] == [0, 0]
    row = table_row(broker, base)
    assert row.version == version + 8  # each commit swapped once, after the other's
    for i, p in enumerate(parts):
        assert table_rows(row.metadata_location, where=f"partition == {i}") == view_rows(broker, p)


def test_a_start_removes_table_directories_no_table_names(broker, compaction, topic, spark) -> None:
    produce(broker, ("a", b"1"))
    round_ok(compaction)
    # What a drop that a crash interrupted leaves: the row gone, the files not.
    ghost = paths.table_dir(broker.settings.data_dir, "t", "ns", "gone") / "metadata"
    ghost.mkdir(parents=True)
    (ghost / "00001-x.metadata.json").write_text("{}")
    broker, compaction = restart(broker, compaction, spark)
    try:
        assert not ghost.parent.exists()
        row = table_row(broker)
        assert row is not None and table_rows(row.metadata_location) == view_rows(broker)
    finally:
        compaction.stop()
        broker.stop()
