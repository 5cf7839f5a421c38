"""Rows to columns: what sealing stores for each message is what the producer sent."""

from __future__ import annotations

import itertools

import pyarrow as pa

from ledger.entry import Entry, Position, Record, is_delete
from ledger.schema import (
    ARROW_SCHEMA,
    COLUMNS,
    FIRST_COLUMNS,
    conform,
    entries_to_table,
    is_ledger_schema,
    present,
    records_to_table,
    table_to_entries,
)


def _records() -> list[Record]:
    # Every combination of key (none, empty, some), value (null, empty, some), properties and
    # event time: the delete flag and the columns must hold for each.
    combos = itertools.product([None, "", "k"], [None, b"", b"v"], [{}, {"a": "1", "b": "2"}], [None, 7])
    return [
        Record(key=k, value=v, properties=p, publish_time=1_000 + i, event_time=e)
        for i, (k, v, p, e) in enumerate(combos)
    ]


def test_a_ledgers_table_holds_every_field_and_pulsars_delete_rule() -> None:
    records = _records()
    table = records_to_table(42, records)
    assert table.schema == ARROW_SCHEMA
    assert table.column("ledger_id").to_pylist() == [42] * len(records)
    assert table.column("entry_id").to_pylist() == list(range(len(records)))
    assert table.column("is_tombstone").to_pylist() == [is_delete(r.key, r.value) for r in records]
    back = table_to_entries(table)
    assert [(e.key, e.value, e.properties, e.publish_time, e.event_time) for e in back] == [
        (r.key, r.value, r.properties, r.publish_time, r.event_time) for r in records
    ]


def test_messages_without_properties_have_empty_properties() -> None:
    records = [Record(key=f"k{i}", value=b"v", publish_time=i) for i in range(5)]
    table = records_to_table(1, records)
    assert table.column("properties").to_pylist() == [[]] * 5
    assert [e.properties for e in table_to_entries(table)] == [{}] * 5
    assert records_to_table(1, []).num_rows == 0


def test_entries_keep_their_own_ids() -> None:
    entries = [Entry(3, 9, "k", b"v", {}, 5, None), Entry(4, 0, None, None, {"x": "y"}, 6, 1)]
    table = entries_to_table(entries)
    assert table_to_entries(table) == entries
    assert table.column("is_tombstone").to_pylist() == [False, True]


def test_properties_come_back_from_slices_and_chunks_of_a_table() -> None:
    # Pages are slices of decoded row groups, and a page across two row groups has two chunks:
    # the properties of each row must come back whichever chunk or slice holds it.
    entries = [Entry(1, i, f"k{i}", b"v", {"n": str(i)} if i in (2, 7) else {}, i, None) for i in range(10)]
    table = entries_to_table(entries)
    for lo, hi in ((0, 2), (3, 7), (2, 3), (6, 9), (0, 10)):
        assert table_to_entries(table.slice(lo, hi - lo)) == entries[lo:hi]
    two_chunks = pa.concat_tables([table.slice(3, 3), table.slice(6, 3)])
    assert two_chunks.column("properties").num_chunks == 2
    assert table_to_entries(two_chunks) == entries[3:9]
    fresh = table_to_entries(table.slice(0, 2))
    fresh[0].properties["x"] = "y"  # each entry owns its dict
    assert fresh[1].properties == {}


def test_batch_members_keep_their_index_and_size_and_name_their_batch() -> None:
    records = [
        Record(key="a", value=b"1"),
        *(Record(key=f"b{i}", value=b"2", batch_index=i, batch_size=3) for i in range(3)),
    ]
    back = table_to_entries(records_to_table(7, records))
    assert [(e.batch_index, e.batch_size) for e in back] == [(None, None), (0, 3), (1, 3), (2, 3)]
    # Member i of the batch stored from entry 1 is "7:1:i", which parses back to its entry.
    assert [e.message_id for e in back] == ["7:0", "7:1:0", "7:1:1", "7:1:2"]
    assert [Position.parse(e.message_id) for e in back] == [e.position for e in back]


def test_a_table_of_the_format_before_batches_reads_as_messages_sent_alone() -> None:
    table = records_to_table(1, [Record(key="k", value=b"v", properties={"p": "q"})]).select(
        list(FIRST_COLUMNS)
    )
    assert is_ledger_schema(table.column_names)
    assert table_to_entries(table) == [Entry(1, 0, "k", b"v", {"p": "q"}, 0, None, None, None, None, None)]
    assert conform(table, COLUMNS).schema == ARROW_SCHEMA.remove_metadata()
    assert conform(table, COLUMNS).column("batch_index").null_count == 1
    assert present(COLUMNS, table.column_names) == list(FIRST_COLUMNS)
    # Anything else is not a ledger file: a column missing in the middle, or a foreign one.
    assert not is_ledger_schema([c for c in COLUMNS if c != "key"])
    assert not is_ledger_schema([*FIRST_COLUMNS, "other"])


def test_a_pulsar_producers_name_and_sequence_ids_are_kept() -> None:
    records = [
        Record(key="a", value=b"1"),  # over REST: no producer
        Record(key="b", value=b"2", producer_name="p-1", sequence_id=0),
        Record(key="c", value=b"3", batch_index=0, batch_size=1, producer_name="p-1", sequence_id=2**63 - 1),
    ]
    table = records_to_table(1, records)
    assert table.schema == ARROW_SCHEMA
    back = table_to_entries(table)
    assert [(e.producer_name, e.sequence_id) for e in back] == [(None, None), ("p-1", 0), ("p-1", 2**63 - 1)]
