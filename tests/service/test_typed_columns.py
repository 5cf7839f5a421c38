"""Typed value columns in a table topic's compacted parts (issue 52), through the service's
compaction rounds against real Spark: a topic with the ``table`` policy and a JSON or Avro
schema gets its value's fields as columns of every part its rounds write (full, delta and
consolidating rounds); any other topic's parts keep the ledger's columns alone; readers of
the compacted view and the scrubber see no difference."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String

from ledger.entry import Record as Message
from ledger.schema import COLUMNS
from ledger.value_columns import DECODE_FAILED
from service.compaction import CompactionService
from service.names import TopicName
from service.policies import Scope
from service.schemas import SchemaInfo, SchemaRegistry
from service.scrubber import Scrubber
from service.topics import Broker

pytestmark = pytest.mark.spark


class Account(Record):
    owner = String()
    key = String()  # clashes with the parts' own column: value_key
    balance = Integer()


JSON_CODEC = JsonSchema(Account)
AVRO_CODEC = AvroSchema(Account)
TYPED = [*COLUMNS, "owner", "value_key", "balance", DECODE_FAILED]


def _topic(
    broker: Broker, compaction: CompactionService, name: str, *, table: bool, schema: str | None
) -> TopicName:
    topic = TopicName("t", "ns", name)
    broker.create_topic(topic)
    compaction.policies.set(Scope.topic_of(topic), table=table)
    if schema is not None:
        codec = JSON_CODEC if schema == "JSON" else AVRO_CODEC
        definition = str(codec.schema_info().schema()).encode()
        SchemaRegistry(broker.db, policies=compaction.policies).put(topic, SchemaInfo(schema, definition))
    return topic


def _account(i: int, balance: int) -> Account:
    return Account(owner=f"owner-{i}", key=f"inner-{i}", balance=balance)


def _parts(broker: Broker, topic: TopicName) -> list[pq.ParquetFile]:
    view = broker.topic(topic).view
    assert view is not None
    return [pq.ParquetFile(f.local) for f in view.files if f.name.endswith(".parquet")]


def _rows(broker: Broker, topic: TopicName) -> dict[str, dict[str, object]]:
    """The rows of the view's parts by message key (the latest layer's row of a key wins)."""
    out: dict[str, dict[str, object]] = {}
    for part in _parts(broker, topic):
        for row in part.read().to_pylist():
            out[row["key"]] = row
    return out


def _layers(broker: Broker, topic: TopicName) -> list[str]:
    view = broker.topic(topic).view
    assert view is not None
    return [layer.kind for layer in view.ledger.manifest.layers]


def _compacted(broker: Broker, topic: TopicName) -> list[tuple[str | None, bytes | None]]:
    got, _ = broker.read(topic, "earliest", 1000, read_compacted=True)
    return [(e.key, e.value) for e in got]


def _round(compaction: CompactionService, topic: TopicName) -> None:
    status = compaction.compact_now(topic)
    assert status.status == "SUCCESS", status.last_error


@pytest.mark.parametrize("schema", ["JSON", "AVRO"])
def test_a_table_topic_with_a_schema_gets_typed_columns_in_every_round_s_parts(
    broker: Broker, compaction: CompactionService, schema: str
) -> None:
    broker.settings.max_entries_per_ledger = 5
    broker.settings.compaction_max_deltas = 1  # full, then a delta, then a consolidation
    codec = JSON_CODEC if schema == "JSON" else AVRO_CODEC
    topic = _topic(broker, compaction, "typed", table=True, schema=schema)
    first = [Message(key=f"k{i}", value=codec.encode(_account(i, i))) for i in range(6)]
    first.append(Message(key="bad", value=b"\xff not a value of the schema"))
    broker.produce(topic, first)
    _round(compaction, topic)

    parts = _parts(broker, topic)
    assert parts and all(p.schema_arrow.names == TYPED for p in parts)
    rows = _rows(broker, topic)
    assert {k: (r["owner"], r["value_key"], r["balance"], r[DECODE_FAILED]) for k, r in rows.items()} == {
        **{f"k{i}": (f"owner-{i}", f"inner-{i}", i, False) for i in range(6)},
        "bad": (None, None, None, True),
    }

    # A delta round writes typed columns for its new rows; a consolidating round decodes the
    # older layers' values again into its new base.
    for round_ in (1, 2):
        updates = [Message(key=f"k{i}", value=codec.encode(_account(i, 100 * round_ + i))) for i in (0, 1)]
        broker.produce(topic, [*updates, Message(key="k2", value=None)])
        _round(compaction, topic)
        assert all(p.schema_arrow.names == TYPED for p in _parts(broker, topic))
        assert _layers(broker, topic) == (["base", "delta"] if round_ == 1 else ["base"])
    rows = _rows(broker, topic)
    assert "k2" not in rows
    assert (rows["k0"]["balance"], rows["k1"]["balance"], rows["k3"]["balance"]) == (200, 201, 3)

    # readCompacted sees the ledger's columns as ever: the values as they were produced.
    expected = {f"k{i}": codec.encode(_account(i, 200 + i)) for i in (0, 1)}
    expected |= {f"k{i}": codec.encode(_account(i, i)) for i in (3, 4, 5)}
    assert dict(_compacted(broker, topic)) == {**expected, "bad": first[-1].value}
    # And the scrubber checks every page of the parts, typed columns included.
    report = Scrubber(broker=broker, interval_s=0, bytes_per_second=0).scrub(topic)
    assert report.findings == [] and report.files_checked > 0


@pytest.mark.parametrize(("table", "schema"), [(False, "JSON"), (True, None), (True, "STRING")])
def test_other_topics_parts_keep_the_ledger_s_columns(
    broker: Broker, compaction: CompactionService, table: bool, schema: str | None
) -> None:
    topic = _topic(broker, compaction, "plain", table=table, schema=None)
    if schema == "JSON":
        definition = str(JSON_CODEC.schema_info().schema()).encode()
        SchemaRegistry(broker.db, policies=compaction.policies).put(topic, SchemaInfo("JSON", definition))
    elif schema == "STRING":
        SchemaRegistry(broker.db, policies=compaction.policies).put(topic, SchemaInfo("STRING", b""))
    values = [json.dumps({"owner": "o", "balance": i}).encode() for i in range(3)]
    broker.produce(topic, [Message(key=f"k{i}", value=v) for i, v in enumerate(values)])
    _round(compaction, topic)
    parts = _parts(broker, topic)
    assert parts and all(p.schema_arrow.names == list(COLUMNS) for p in parts)
    assert _compacted(broker, topic) == [(f"k{i}", v) for i, v in enumerate(values)]
