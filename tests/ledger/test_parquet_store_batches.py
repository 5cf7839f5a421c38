"""A sealed ledger read whole batch by whole batch (``SealedLedger.read_batches``): the rows
``read`` gives, each batch the read holds whole as one ``BatchEntry`` whose payload is what the
consumer's encoder writes for its members, in C and in Python alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ledger import batch_codec
from ledger.batch_codec import Batch
from ledger.batch_encoder import encode_batch_payload, encode_row_batches
from ledger.batch_walk import member_entries
from ledger.batches import appended_table
from ledger.entry import BatchEntry, Entry, LedgerItem, Record, StoredBatch
from ledger.parquet_store import SealedLedger, seal_table, whole_batches
from ledger.schema import (
    ARROW_SCHEMA,
    BATCH_SIZE,
    FIRST_COLUMNS,
    PROPERTIES,
    records_to_table,
    table_to_entries,
)
from tests.batches import PUBLISH, batch

LEDGER = 12
IMPLEMENTATIONS = ("native", "python")


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "native" and not batch_codec._extension:
        pytest.skip("ledger._batch_codec is not built")
    with batch_codec.use_native(request.param == "native"):
        yield request.param


def members_of(n: int, *, seq: int, tag: str) -> list[Record]:
    """A batch's members as the ledger stores them, with every field a member may carry: keys
    or none, null and empty values, properties, event times, ordering keys of their own, and the
    batch's producer, publish time, delay and schema version."""
    out = []
    for i in range(n):
        out.append(
            Record(
                key=None if i % 4 == 0 else f"{tag}-κ{i % 3}",
                value=None if i % 5 == 3 else (b"" if i % 7 == 6 else f"{tag}{i}".encode() * (i % 4 + 1)),
                properties={} if i % 3 else {"a": str(i), "é": "x" * (i % 150)},
                publish_time=PUBLISH + 7,
                event_time=None if i % 2 else PUBLISH - i,
                batch_index=i,
                batch_size=n,
                producer_name="producer-2",
                sequence_id=seq + i,
                deliver_at_time=PUBLISH + 60_000,
                ordering_key=b"ok\x00" + bytes([i % 256]) if i % 6 == 1 else None,
                schema_version=b"\x00\x00\x00\x03",
            )
        )
    return out


def ledger_items() -> list[Record | StoredBatch]:
    """Messages sent alone between batches as a client lays them out (``tests.batches``) and
    batches with every field set (rows of their members)."""
    alone = [Record(f"solo-{i}", f"v{i}".encode(), {"s": "1"} if i % 2 else {}) for i in range(5)]
    items: list[Record | StoredBatch] = [*alone[:2]]
    items.append(batch(7, first_seq=100, tag="a")[0])
    items += members_of(12, seq=200, tag="b")
    items.append(alone[2])
    items.append(batch(1, first_seq=300, tag="c")[0])  # a batch of one is a batch too
    items += members_of(130, seq=400, tag="d")
    items += [alone[3], alone[4]]
    items.append(batch(40, first_seq=600, tag="e")[0])
    items += members_of(3, seq=700, tag="f")
    return items


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SealedLedger]:
    """The ledger sealed in row groups of 32 rows, so that reads span row groups (several
    chunks in a column)."""
    path = tmp_path_factory.mktemp("sealed") / "ledger.parquet"
    seal_table(appended_table(LEDGER, ledger_items()), path, row_group_size=32)
    ledger = SealedLedger(path, ledger_id=LEDGER)
    yield ledger
    ledger.close()


def expand(items: list[LedgerItem]) -> list[Entry]:
    """The entries the items stand for: each batch's members decoded from its payload with the
    decoder of stored batches."""
    out: list[Entry] = []
    for item in items:
        if type(item) is Entry:
            out.append(item)
            continue
        assert type(item) is BatchEntry
        b = item.batch
        out += member_entries(
            item.ledger_id,
            Batch(
                item.entry_id,
                b.count,
                b.payload,
                b.publish_time,
                b.producer_name,
                b.sequence_id,
                b.deliver_at_time,
                b.ordering_key,
                b.schema_version,
            ),
        )
    return out


def check_items(items: list[LedgerItem], entries: list[Entry]) -> None:
    """``items`` are ``entries``: field by field, each batch whole and rebuilt by convention."""
    assert expand(items) == entries
    by_id = {e.entry_id: e for e in entries}
    at = entries[0].entry_id if entries else 0
    for item in items:
        assert item.entry_id == at  # in id order, nothing left out
        if type(item) is BatchEntry:
            b = item.batch
            members = [by_id[item.entry_id + i] for i in range(b.count)]
            assert [m.batch_index for m in members] == list(range(b.count))
            assert {m.batch_size for m in members} == {b.count}
            assert (b.metadata, b.compression, b.ordering_key) == (b"", 0, None)
            assert b.uncompressed_size == len(b.payload)
            assert b.size == sum(m.size() for m in members)
            first = members[0]
            assert b.producer_name == first.producer_name and b.sequence_id == first.sequence_id
            assert b.publish_time == first.publish_time and b.deliver_at_time == first.deliver_at_time
            assert b.schema_version == first.schema_version
            # The bytes the consumer's encoder writes for the members read one by one.
            assert b.payload == encode_batch_payload(members, b.count)
            at += b.count
        else:
            assert type(item) is Entry  # a message alone, or a member of a batch cut by the read
            assert item.batch_index is None or not _whole_in(item, entries)
            at += 1


def _whole_in(e: Entry, entries: list[Entry]) -> bool:
    assert e.batch_index is not None and e.batch_size is not None
    ids = {x.entry_id for x in entries}
    first = e.entry_id - e.batch_index
    return all(first + i in ids for i in range(e.batch_size))


WINDOWS = [
    (0, 10_000),  # everything
    (0, 5),  # loose messages and a batch cut at the end
    (3, 4),  # a batch cut at both edges
    (2, 7),  # exactly one batch
    (4, 30),  # a batch cut at the start, whole ones, one cut at the end
    (9, 19),  # the batch of 12 whole, then a message alone and the batch of one
    (30, 100),  # inside the batch of 130: nothing whole
    (21, 140),  # from the batch of one across the batch of 130, over row groups
    (150, 10_000),  # to the end
    (10_000, 5),  # past the end
]


@pytest.mark.parametrize(("start", "count"), WINDOWS)
def test_read_batches_gives_reads_rows_with_whole_batches_as_one_item(
    sealed: SealedLedger, implementation: str, start: int, count: int
) -> None:
    entries = sealed.read(start, count)
    if entries and (last := entries[-1]).batch_index is not None:
        # A batch the limit cuts is read to its end.
        assert last.batch_size is not None
        entries = sealed.read(start, count + last.batch_size - 1 - last.batch_index)
    items = sealed.read_batches(start, count)
    check_items(items, entries)
    if items and type(tail := items[-1]) is Entry and tail.batch_index is not None:
        assert tail.batch_index == (tail.batch_size or 0) - 1, "a read of whole batches ends inside a batch"
    whole = sum(1 for i in items if type(i) is BatchEntry)
    if (start, count) == (0, 10_000):
        assert whole == 6  # every batch of the ledger
    if (start, count) in ((3, 4), (30, 100)):
        assert whole == 0


@pytest.mark.parametrize(("start", "count"), WINDOWS)
def test_the_c_and_python_paths_give_the_same_items(sealed: SealedLedger, start: int, count: int) -> None:
    if not batch_codec._extension:
        pytest.skip("ledger._batch_codec is not built")
    got = {}
    for name in IMPLEMENTATIONS:
        with batch_codec.use_native(name == "native"):
            got[name] = sealed.read_batches(start, count)
    assert got["native"] == got["python"]


def test_a_ledger_without_batches_reads_as_entries(tmp_path: Path, implementation: str) -> None:
    path = tmp_path / "plain.parquet"
    seal_table(records_to_table(3, [Record(f"k{i}", b"v", {"p": str(i)}) for i in range(50)]), path)
    ledger = SealedLedger(path, ledger_id=3)
    try:
        assert ledger.read_batches(5, 20) == ledger.read(5, 20)
    finally:
        ledger.close()


def test_a_sealed_ledger_of_the_format_before_batches_still_reads(
    tmp_path: Path, implementation: str
) -> None:
    table = records_to_table(LEDGER, [Record(f"k{i}", f"v{i}".encode()) for i in range(20)])
    path = tmp_path / "old.parquet"
    pq.write_table(table.select(list(FIRST_COLUMNS)), path, row_group_size=8)
    ledger = SealedLedger(path, ledger_id=LEDGER)
    try:
        items = ledger.read_batches(3, 12)
        assert items == ledger.read(3, 12)
        assert [(e.entry_id, e.key, e.batch_index) for e in expand(items)] == [
            (i, f"k{i}", None) for i in range(3, 15)
        ]
    finally:
        ledger.close()


def test_a_file_with_the_batch_columns_and_not_the_ones_after_them(
    tmp_path: Path, implementation: str
) -> None:
    """A file of a format that had batch index and size and no producer, sequence id, ordering
    key or schema version: its batches are whole items, their members without those fields."""
    records = [Record("x", b"alone"), *members_of(6, seq=0, tag="g"), Record(None, b"last")]
    table = records_to_table(LEDGER, records)
    names = table.column_names
    path = tmp_path / "batches-only.parquet"
    pq.write_table(table.select(names[: names.index(BATCH_SIZE) + 1]), path)
    ledger = SealedLedger(path, ledger_id=LEDGER)
    try:
        entries = ledger.read(0, 100)
        items = ledger.read_batches(0, 100)
    finally:
        ledger.close()
    assert [type(i) for i in items] == [Entry, BatchEntry, Entry]
    stored = items[1].batch  # type: ignore[union-attr]
    assert (stored.producer_name, stored.sequence_id, stored.schema_version) == ("", 0, None)
    members = entries[1:7]
    assert stored.payload == encode_batch_payload(members, 6)
    assert stored.size == sum(m.size() for m in members)
    back = expand(items)
    assert [(e.key, e.value, e.properties, e.event_time, e.publish_time) for e in back] == [
        (e.key, e.value, e.properties, e.event_time, e.publish_time) for e in entries
    ]


# ---- the encoder on tables made by hand -------------------------------------------------------


def test_duplicate_property_names_encode_as_a_dict_of_them_holds_them(implementation: str) -> None:
    """A map with a name twice (no ledger writes one) is encoded as ``table_to_entries``' dict
    has it: the name where it first appears, with its last value; a null map has none."""
    members = members_of(4, seq=0, tag="h")
    table = records_to_table(1, members)
    maps = pa.array(
        [[("a", "1"), ("b", "2"), ("a", "3")], None, [], [("z", "")] * 20 + [("y", "w"), ("z", "9")]],
        ARROW_SCHEMA.field(PROPERTIES).type,
    )
    table = table.set_column(table.column_names.index(PROPERTIES), PROPERTIES, maps)
    payloads, sizes = encode_row_batches(table, [0], [4])
    entries = table_to_entries(table)
    assert entries[0].properties == {"a": "3", "b": "2"} and entries[1].properties == {}
    assert payloads == [encode_batch_payload(entries, 4)]
    assert sizes == [sum(e.size() for e in entries)]


def test_rows_of_a_slice_with_offsets_and_chunks(implementation: str) -> None:
    """Columns sliced (offsets into their buffers, validity bits not on a byte boundary) and in
    several chunks encode as the entries of the same rows."""
    table = records_to_table(1, members_of(40, seq=5, tag="i"))
    table = pa.concat_tables([table.slice(0, 11), table.slice(11, 13), table.slice(24)]).slice(3, 33)
    starts, counts = np.array([0, 5, 5, 20], np.int64), np.array([5, 15, 0, 13], np.int64)
    payloads, sizes = encode_row_batches(table, starts, counts)
    entries = table_to_entries(table)
    for payload, size, s, c in zip(payloads, sizes, starts, counts, strict=True):
        members = [e._replace(batch_index=i) for i, e in enumerate(entries[s : s + c])]
        assert payload == encode_batch_payload(members, int(c))
        assert size == sum(e.size() for e in members)


def test_batches_outside_the_rows_are_refused(implementation: str) -> None:
    table = records_to_table(1, members_of(4, seq=0, tag="j"))
    for starts, counts in (([3], [2]), ([-1], [1]), ([0], [-1])):
        with pytest.raises(ValueError):
            encode_row_batches(table, starts, counts)


def test_whole_batches_are_found_over_the_columns() -> None:
    def table(indexes: list[int | None], sizes: list[int | None]) -> pa.Table:
        return pa.table(
            {"batch_index": pa.array(indexes, pa.int32()), BATCH_SIZE: pa.array(sizes, pa.int32())}
        )

    assert whole_batches(table([], [])).tolist() == []
    assert whole_batches(table([None, None], [None, None])).tolist() == []
    got = whole_batches(
        table(
            [1, 2, None, 0, 1, 2, 0, 0, 1, 0, 1, 0, 2, 0, 1],
            [3, 3, None, 3, 3, 3, 1, 2, 2, 2, 3, 3, 3, 2, 2],
        )
    )
    # Cut at the start, not a member; whole (3), whole (1), whole (2); index 0 of 2, then index 1
    # of a batch of another size; index 0, then index 2 (a gap); whole (2) at the very end.
    assert got.tolist() == [3, 6, 7, 13]
