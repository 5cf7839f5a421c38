"""A batch's members in bulk: the C walk, the Python walk and the per-record path
(``to_records`` then ``records_to_table``) agree on every batch the ledger stores, and the two
walks refuse the same malformed batches with the same reason."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.errors import ProtocolError
from api.pulsar.messages import to_records
from ledger import batch_codec, batch_decoder
from ledger.batch_codec import Batch
from ledger.batch_decoder import batch_table, batches_table, check_batch
from ledger.entry import record_size
from ledger.schema import ARROW_SCHEMA, records_to_table, table_to_entries

ROOT = Path(__file__).resolve().parents[2]
INT64_MAX = 2**63 - 1
IMPLEMENTATIONS = ("native", "python")


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    with batch_codec.use_native(request.param == "native"):
        yield request.param


def both(call: Callable[[], Any]) -> dict[str, Any]:
    """``call`` under each implementation: its result, or the ValueError it raised."""
    out: dict[str, Any] = {}
    for name in IMPLEMENTATIONS:
        with batch_codec.use_native(name == "native"):
            try:
                out[name] = call()
            except ValueError as e:
                out[name] = e
    return out


# ---- building batches ------------------------------------------------------------------------


def varint(n: int) -> bytes:
    n &= 2**64 - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(number: int, data: bytes) -> bytes:
    return tag(number, 2) + varint(len(data)) + data


@dataclass
class Member:
    value: bytes = b""
    key: str | None = None
    properties: list[tuple[str, str]] = field(default_factory=list)
    null_value: bool = False
    event_time: int | None = None
    sequence_id: int | None = None
    ordering_key: bytes | None = None
    # Raw fields appended to the metadata (protobuf's parser merges them: the last scalar wins).
    extra: bytes = b""

    def metadata(self) -> bytes:
        md = pb.SingleMessageMetadata(payload_size=len(self.value))
        if self.key is not None:
            md.partition_key = self.key
        md.properties.extend(pb.KeyValue(key=k, value=v) for k, v in self.properties)
        if self.null_value:
            md.null_value = True
        if self.event_time is not None:
            md.event_time = self.event_time
        if self.sequence_id is not None:
            md.sequence_id = self.sequence_id
        if self.ordering_key is not None:
            md.ordering_key = self.ordering_key
        return md.SerializeToString() + self.extra


def encode(members: list[Member]) -> bytes:
    parts = []
    for m in members:
        meta = m.metadata()
        parts += [struct.pack(">I", len(meta)), meta, m.value]
    return b"".join(parts)


def member_bytes(metadata: bytes, value: bytes = b"") -> bytes:
    return struct.pack(">I", len(metadata)) + metadata + value


@dataclass
class BatchMeta:
    producer_name: str = "producer-1"
    first_sequence_id: int = 0
    deliver_at_time: int | None = None
    ordering_key: bytes | None = None
    schema_version: bytes | None = None
    publish_time: int = 1_700_000_000_000


def reference(ledger_id: int, first_entry: int, count: int, payload: bytes, meta: BatchMeta) -> pa.Table:
    """What the per-record path stores for the batch."""
    md = pb.MessageMetadata(
        producer_name=meta.producer_name,
        sequence_id=meta.first_sequence_id,
        publish_time=1,
        num_messages_in_batch=count,
    )
    if meta.deliver_at_time is not None:
        md.deliver_at_time = meta.deliver_at_time
    if meta.ordering_key is not None:
        md.ordering_key = meta.ordering_key
    if meta.schema_version is not None:
        md.schema_version = meta.schema_version
    records = to_records(md, payload, len(payload))
    for r in records:
        r.publish_time = meta.publish_time
    return records_to_table(ledger_id, records, first_entry)


def reference_size(payload: bytes, count: int) -> int:
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=count)
    return sum(record_size(r.key, r.value, r.properties) for r in to_records(md, payload, len(payload)))


def as_batch(first_entry: int, count: int, payload: bytes | memoryview, meta: BatchMeta) -> Batch:
    return Batch(
        first_entry,
        count,
        payload,
        meta.publish_time,
        meta.producer_name,
        meta.first_sequence_id,
        meta.deliver_at_time,
        meta.ordering_key,
        meta.schema_version,
    )


def table_of(
    ledger_id: int,
    first_entry: int,
    count: int,
    payload: bytes | memoryview,
    meta: BatchMeta,
    max_members: int = batch_decoder.MAX_MEMBERS,
) -> pa.Table:
    return batch_table(
        ledger_id,
        first_entry,
        count,
        payload,
        publish_time=meta.publish_time,
        producer_name=meta.producer_name,
        first_sequence_id=meta.first_sequence_id,
        deliver_at_time=meta.deliver_at_time,
        ordering_key=meta.ordering_key,
        schema_version=meta.schema_version,
        max_members=max_members,
    )


def assert_same(table: pa.Table, expected: pa.Table) -> None:
    table.validate(full=True)
    assert table.schema.equals(ARROW_SCHEMA, check_metadata=True)
    if not table.equals(expected):
        for name in ARROW_SCHEMA.names:  # the column that differs, for the report
            assert table.column(name).to_pylist() == expected.column(name).to_pylist(), name
    assert table.equals(expected)


# ---- strategies --------------------------------------------------------------------------------

texts = st.one_of(st.just(""), st.text(max_size=12), st.sampled_from(["k", "ключ", "鍵", "🔑", "a\x00b"]))
# Few names, so that members repeat one (a dict keeps each once, with its last value); sometimes
# more than 16 properties (the C walk dedupes those with a hash table).
property_names = st.sampled_from(["a", "b", "", "ü", "x" * 40]) | st.text(max_size=6)
properties = st.lists(st.tuples(property_names, texts), max_size=4) | st.builds(
    lambda n, seed: [(f"n{(j * seed) % 23}", str(j)) for j in range(n)],
    st.integers(17, 60),
    st.integers(1, 9),
)
values = st.binary(max_size=32) | st.builds(
    lambda b, n: bytes([b]) * n, st.integers(0, 255), st.integers(0, 5000)
)


_numbers = st.sampled_from([6, 10, 11, 15, 16, 100, 2**29 - 1])
unknown_fields = st.one_of(
    st.builds(lambda n, v: tag(n, 0) + varint(v), _numbers, st.integers(0, 2**64 - 1)),
    st.builds(lambda n, v: tag(n, 1) + v, _numbers, st.binary(min_size=8, max_size=8)),
    st.builds(lambda n, v: length_delimited(n, v), _numbers, st.binary(max_size=10)),
    st.builds(lambda n, v: tag(n, 5) + v, _numbers, st.binary(min_size=4, max_size=4)),
    # Known numbers with another wire type: skipped as unknown.
    st.builds(lambda n, v: tag(n, 0) + varint(v), st.sampled_from([1, 2, 7]), st.integers(0, 300)),
    st.builds(lambda n, v: length_delimited(n, v), st.sampled_from([3, 4, 5, 8, 9]), st.binary(max_size=3)),
    st.builds(lambda v: tag(3, 5) + v, st.binary(min_size=4, max_size=4)),
    # A KeyValue missing a side (""), or with a field of its own it does not know.
    st.builds(lambda k: length_delimited(1, length_delimited(1, k.encode())), texts),
    st.builds(lambda v: length_delimited(1, length_delimited(2, v.encode())), texts),
    st.builds(
        lambda k, v: length_delimited(
            1, length_delimited(1, k.encode()) + tag(9, 0) + b"\x01" + length_delimited(2, v.encode())
        ),
        texts,
        texts,
    ),
    # Scalars again: the last one counts.
    st.builds(lambda k: length_delimited(2, k.encode()), texts),
    st.builds(lambda k: length_delimited(7, k), st.binary(max_size=4)),
    st.builds(lambda b: tag(9, 0) + varint(b), st.sampled_from([0, 1, 2, 2**64 - 1])),
    st.just(tag(4, 0) + b"\x00"),
    st.just(tag(5, 0) + b"\x00"),
)


@st.composite
def members(draw: st.DrawFn, small: bool = False) -> Member:
    return Member(
        value=draw(st.binary(max_size=8) if small else values),
        key=draw(st.none() | texts),
        properties=draw(st.lists(st.tuples(property_names, texts), max_size=2) if small else properties),
        null_value=draw(st.booleans()),
        event_time=draw(st.none() | st.just(0) | st.integers(1, INT64_MAX)),
        sequence_id=draw(st.none() | st.integers(0, INT64_MAX)),
        ordering_key=draw(st.none() | st.just(b"") | st.binary(max_size=8)),
        extra=b"".join(draw(st.lists(unknown_fields, max_size=3))),
    )


batch_metas = st.builds(
    BatchMeta,
    producer_name=st.text(max_size=10),
    first_sequence_id=st.integers(0, INT64_MAX - 100),
    deliver_at_time=st.none() | st.integers(0, INT64_MAX),
    ordering_key=st.none() | st.just(b"") | st.binary(max_size=8),
    schema_version=st.none() | st.binary(max_size=8),
    publish_time=st.integers(0, INT64_MAX),
)


# ---- the same rows as the per-record path -------------------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(members(), min_size=1, max_size=12),
    batch_metas,
    st.integers(1, INT64_MAX - 100),
    st.integers(0, 10**6),
)
def test_both_walks_store_what_the_per_record_path_stores(
    ms: list[Member], meta: BatchMeta, ledger_id: int, first_entry: int
) -> None:
    payload = encode(ms)
    expected = reference(ledger_id, first_entry, len(ms), payload, meta)
    size = reference_size(payload, len(ms))
    tables = both(lambda: table_of(ledger_id, first_entry, len(ms), payload, meta))
    for table in tables.values():
        assert_same(table, expected)
    assert both(lambda: check_batch(payload, len(ms), first_sequence_id=meta.first_sequence_id)) == {
        "native": size,
        "python": size,
    }
    # The walks make the same buffers, byte for byte.
    columns = both(
        lambda: batch_decoder._decode(ledger_id, [as_batch(first_entry, len(ms), payload, meta)], 100)
    )
    assert columns["native"] == columns["python"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.lists(members(), min_size=1, max_size=5), batch_metas), min_size=1, max_size=6))
def test_several_batches_make_one_table_in_the_order_given(
    batches: list[tuple[list[Member], BatchMeta]],
) -> None:
    entry, given_, expected = 0, [], []
    for ms, meta in batches:
        payload = encode(ms)
        given_.append(as_batch(entry, len(ms), payload, meta))
        expected.append(reference(9, entry, len(ms), payload, meta))
        entry += len(ms) + 3  # not necessarily adjacent: entries between them were single messages
    for table in both(lambda: batches_table(9, given_)).values():
        assert_same(table, pa.concat_tables(expected))


def test_batches_past_2_gib_make_one_table_of_several_runs(
    implementation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offsets are int32: the batches go in runs of at most 2 GiB (here, of 100 bytes)."""
    monkeypatch.setattr(batch_decoder, "_COLUMN_LIMIT", 100)
    metas = [BatchMeta(), BatchMeta(ordering_key=b"o" * 30), BatchMeta(schema_version=b"s")]
    given_, expected = [], []
    for i, meta in enumerate(metas * 3):
        payload = encode([Member(value=b"v" * i, key=str(i)), Member(value=b"w" * 40)])
        given_.append(as_batch(2 * i, 2, payload, meta))
        expected.append(reference(9, 2 * i, 2, payload, meta))
    table = batches_table(9, given_)
    assert table.column("value").num_chunks > 1
    assert_same(table, pa.concat_tables(expected))


def test_the_table_goes_to_parquet_and_back_to_entries(implementation: str, tmp_path: Path) -> None:
    ms = [
        Member(value=b"v", key="k", properties=[("a", "1")], event_time=5),
        Member(value=b"", null_value=True),
    ]
    table = table_of(4, 10, 2, encode(ms), BatchMeta(ordering_key=b"o"))
    pq.write_table(table, tmp_path / "t.parquet")
    back = pq.read_table(tmp_path / "t.parquet")
    assert back.equals(table)
    entries = table_to_entries(back)
    assert [(e.message_id, e.key, e.value, e.properties, e.event_time, e.ordering_key) for e in entries] == [
        ("4:10:0", "k", b"v", {"a": "1"}, 5, b"o"),
        ("4:10:1", None, None, {}, None, b"o"),
    ]


def test_no_batches_no_rows(implementation: str) -> None:
    table = batches_table(9, [])
    assert table.num_rows == 0 and table.schema.equals(ARROW_SCHEMA, check_metadata=True)


def test_a_batch_of_a_thousand_members(implementation: str) -> None:
    ms = [
        Member(
            value=bytes([i % 251]) * (i % 300),
            key=None if i % 7 == 0 else f"key-{i % 97}",
            properties=[("p", str(i))] * (i % 3) + [(f"n{j % 20}", "v") for j in range(i % 40)],
            null_value=i % 11 == 0,
            event_time=i if i % 5 else None,
            sequence_id=i * 3 if i % 2 else None,
            ordering_key=b"o" if i % 13 == 0 else None,
        )
        for i in range(1000)
    ]
    payload = encode(ms)
    meta = BatchMeta(
        first_sequence_id=10_000, deliver_at_time=5, ordering_key=b"batch", schema_version=b"\x01"
    )
    assert_same(table_of(3, 40, 1000, payload, meta), reference(3, 40, 1000, payload, meta))
    assert check_batch(payload, 1000) == reference_size(payload, 1000)
    # Past 64 KiB, the C walk checks without the GIL: its reasons come out all the same.
    assert len(payload) > 64 * 1024
    with pytest.raises(ValueError, match="^1 bytes after its members$"):
        check_batch(payload + b"!", 1000)
    with pytest.raises(ValueError, match="^member 999: its payload overruns the batch$"):
        check_batch(payload[:-1], 1000)


def test_a_memoryview_or_bytearray_payload(implementation: str) -> None:
    ms = [Member(value=b"v1", key="a"), Member(value=b"", key="b"), Member(value=b"v3", null_value=True)]
    payload = encode(ms)
    expected = reference(1, 0, 3, payload, BatchMeta())
    framed = memoryview(b"head" + payload + b"tail")[4:-4]
    assert_same(table_of(1, 0, 3, framed, BatchMeta()), expected)
    assert_same(table_of(1, 0, 3, bytearray(payload), BatchMeta()), expected)
    assert check_batch(framed, 3) == check_batch(bytearray(payload), 3) == 4
    assert table_of(1, 0, 3, payload, BatchMeta()).column("is_tombstone").to_pylist() == [False, True, True]


def test_properties_are_a_dict_of_them(implementation: str) -> None:
    pairs = [("a", "1"), ("b", "2"), ("a", "3")] + [(f"k{i % 20}", str(i)) for i in range(30)]
    payload = encode([Member(value=b"x", properties=pairs[:3]), Member(value=b"y", properties=pairs)])
    table = table_of(1, 0, 2, payload, BatchMeta())
    assert table.column("properties").to_pylist()[0] == [("a", "3"), ("b", "2")]
    assert_same(table, reference(1, 0, 2, payload, BatchMeta()))
    assert check_batch(payload, 2) == reference_size(payload, 2)


# ---- malformed batches ---------------------------------------------------------------------------

GOOD = member_bytes(pb.SingleMessageMetadata(payload_size=2, partition_key="k").SerializeToString(), b"vv")


def meta_bytes(**fields: Any) -> bytes:
    """SingleMessageMetadata's bytes (without its required payload size, if so asked)."""
    return bytes(pb.SingleMessageMetadata(**fields).SerializePartialToString())


MALFORMED: dict[str, tuple[bytes, int, str]] = {
    "no members": (GOOD, 0, "a batch of 0 messages"),
    "a negative count": (GOOD, -1, "a batch of -1 messages"),
    "more members than allowed": (GOOD * 3, 100_001, "a batch of 100001 messages"),
    "an empty payload": (b"", 1, "member 0: its metadata size is cut off"),
    "fewer members than counted": (GOOD * 2, 3, "member 2: its metadata size is cut off"),
    "a size cut off": (GOOD + b"\x00\x00", 2, "member 1: its metadata size is cut off"),
    "metadata overrunning": (
        b"\x00\x00\x01\x00" + b"\x18\x00",
        1,
        "member 0: its metadata overruns the batch",
    ),
    "metadata of 2**32 - 1": (b"\xff\xff\xff\xff\x18\x00", 1, "member 0: its metadata overruns the batch"),
    "a payload overrunning": (
        member_bytes(meta_bytes(payload_size=5), b"abc"),
        1,
        "member 0: its payload overruns the batch",
    ),
    "trailing bytes": (GOOD + b"\x00", 1, "1 bytes after its members"),
    "more members than counted": (GOOD * 3, 2, f"{len(GOOD)} bytes after its members"),
    "compacted out": (
        GOOD + member_bytes(meta_bytes(payload_size=0, compacted_out=True)),
        2,
        "member 1 is marked compacted out",
    ),
    "no payload size": (member_bytes(meta_bytes(partition_key="k")), 1, "member 0: no payload size"),
    "a negative payload size": (member_bytes(tag(3, 0) + varint(-1)), 1, "member 0: a negative payload size"),
    "a payload size of 2**31": (
        member_bytes(tag(3, 0) + varint(2**31)),
        1,
        "member 0: a negative payload size",
    ),
    "a key not UTF-8": (
        member_bytes(meta_bytes(payload_size=0) + length_delimited(2, b"\xff")),
        1,
        "member 0: its metadata does not parse: a key that is not UTF-8",
    ),
    "a surrogate key": (
        member_bytes(meta_bytes(payload_size=0) + length_delimited(2, b"\xed\xa0\x80")),
        1,
        "member 0: its metadata does not parse: a key that is not UTF-8",
    ),
    "an overlong key": (
        member_bytes(meta_bytes(payload_size=0) + length_delimited(2, b"\xc0\xaf")),
        1,
        "member 0: its metadata does not parse: a key that is not UTF-8",
    ),
    "a key past U+10FFFF": (
        member_bytes(meta_bytes(payload_size=0) + length_delimited(2, b"\xf4\x90\x80\x80")),
        1,
        "member 0: its metadata does not parse: a key that is not UTF-8",
    ),
    "a key cut mid-character": (
        member_bytes(meta_bytes(payload_size=0) + length_delimited(2, b"ab\xe4\xb8")),
        1,
        "member 0: its metadata does not parse: a key that is not UTF-8",
    ),
    "a property name not UTF-8": (
        member_bytes(meta_bytes(payload_size=0) + length_delimited(1, length_delimited(1, b"\x80"))),
        1,
        "member 0: its metadata does not parse: a property that is not UTF-8",
    ),
    "a property value not UTF-8": (
        member_bytes(meta_bytes(payload_size=0) + length_delimited(1, length_delimited(2, b"a\xfe"))),
        1,
        "member 0: its metadata does not parse: a property that is not UTF-8",
    ),
    "a group": (
        member_bytes(meta_bytes(payload_size=0) + tag(11, 3) + tag(11, 4)),
        1,
        "member 0: its metadata does not parse: a field of wire type 3",
    ),
    "an end of group": (
        member_bytes(tag(11, 4) + meta_bytes(payload_size=0)),
        1,
        "member 0: its metadata does not parse: a field of wire type 4",
    ),
    "wire type 6": (
        member_bytes(tag(3, 6) + meta_bytes(payload_size=0)),
        1,
        "member 0: its metadata does not parse: a field of wire type 6",
    ),
    "wire type 7 in a property": (
        member_bytes(meta_bytes(payload_size=0) + length_delimited(1, tag(1, 7))),
        1,
        "member 0: its metadata does not parse: a field of wire type 7",
    ),
    "field number 0": (
        member_bytes(b"\x00\x00" + meta_bytes(payload_size=0)),
        1,
        "member 0: its metadata does not parse: a field numbered 0",
    ),
    "a tag past 32 bits": (
        member_bytes(b"\x80\x80\x80\x80\x10\x00" + meta_bytes(payload_size=0)),
        1,
        "member 0: its metadata does not parse: a field is cut off",
    ),
    "a tag of 6 bytes": (
        member_bytes(b"\x98\x80\x80\x80\x80\x00\x00"),
        1,
        "member 0: its metadata does not parse: a field is cut off",
    ),
    "a varint of 11 bytes": (
        member_bytes(tag(3, 0) + b"\x80" * 10 + b"\x00"),
        1,
        "member 0: its metadata does not parse: a field is cut off",
    ),
    "a varint cut off": (
        member_bytes(tag(3, 0) + b"\x80"),
        1,
        "member 0: its metadata does not parse: a field is cut off",
    ),
    "a length cut off": (
        member_bytes(meta_bytes(payload_size=0) + tag(2, 2) + b"\x05ab"),
        1,
        "member 0: its metadata does not parse: a field is cut off",
    ),
    "a property's length overrunning it": (
        member_bytes(meta_bytes(payload_size=0) + length_delimited(1, tag(1, 2) + b"\x09abc")),
        1,
        "member 0: its metadata does not parse: a field is cut off",
    ),
    "a fixed64 cut off": (
        member_bytes(meta_bytes(payload_size=0) + tag(12, 1) + b"1234567"),
        1,
        "member 0: its metadata does not parse: a field is cut off",
    ),
    "a fixed32 cut off": (
        member_bytes(meta_bytes(payload_size=0) + tag(12, 5) + b"123"),
        1,
        "member 0: its metadata does not parse: a field is cut off",
    ),
    "an event time of 2**63": (
        member_bytes(meta_bytes(payload_size=0, event_time=2**63)),
        1,
        "member 0: an event time above 2**63 - 1",
    ),
    "a sequence id of 2**64 - 1": (
        member_bytes(meta_bytes(payload_size=0, sequence_id=2**64 - 1)),
        1,
        "member 0: a sequence id above 2**63 - 1",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_batch_is_refused_alike(case: str) -> None:
    payload, count, reason = MALFORMED[case]
    meta = BatchMeta()
    for outcome in (
        *both(lambda: check_batch(payload, count)).values(),
        *both(lambda: table_of(1, 0, count, payload, meta)).values(),
    ):
        assert isinstance(outcome, ValueError), outcome
        assert str(outcome) == reason


def utf8_cases() -> Iterator[bytes]:
    """1- and 2-byte sequences (from a lead byte of 0x7F up); 3- and 4-byte ones around every
    boundary of UTF-8."""
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    for a in range(0x7F, 256):
        yield bytes([a])
        for b in range(256):
            yield bytes([a, b])
    for a in (0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xF8):
        for b in edges:
            for c in edges:
                yield bytes([a, b, c])
                for d in edges:
                    yield bytes([a, b, c, d])


def is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_the_c_walk_takes_as_utf8_what_python_decodes() -> None:
    head = meta_bytes(payload_size=0)
    wrong = []
    with batch_codec.use_native(True):
        for text in utf8_cases():
            # Also behind 8 ASCII bytes (the C walk skips those a word at a time).
            for key in (text, b"12345678" + text):
                try:
                    check_batch(member_bytes(head + length_delimited(2, key)), 1)
                    taken = True
                except ValueError:
                    taken = False
                if taken != is_utf8(key):
                    wrong.append(key)
    assert wrong == []


def test_numbering_from_the_first_sequence_id_must_stay_in_int64(implementation: str) -> None:
    payload = GOOD + member_bytes(meta_bytes(payload_size=0, sequence_id=5)) + GOOD
    # Members 0 and 2 are numbered first + 0 and first + 2; member 1 has its own.
    assert check_batch(payload, 3, first_sequence_id=INT64_MAX - 2) == 6
    table = table_of(1, 0, 3, payload, BatchMeta(first_sequence_id=INT64_MAX - 2))
    assert table.column("sequence_id").to_pylist() == [INT64_MAX - 2, 5, INT64_MAX]
    with pytest.raises(ValueError, match="^member 2: a sequence id above 2"):
        check_batch(payload, 3, first_sequence_id=INT64_MAX - 1)
    with pytest.raises(ValueError, match="^member 2: a sequence id above 2"):
        table_of(1, 0, 3, payload, BatchMeta(first_sequence_id=INT64_MAX - 1))
    with pytest.raises(ValueError, match="a first sequence id"):
        check_batch(payload, 3, first_sequence_id=2**63)


def test_a_malformed_batch_among_several_is_named_by_its_entry(implementation: str) -> None:
    meta = BatchMeta()
    batches = [as_batch(0, 1, GOOD, meta), as_batch(1, 1, GOOD + b"!", meta), as_batch(2, 0, GOOD, meta)]
    with pytest.raises(ValueError, match="^the batch at entry 1: 1 bytes after its members$"):
        batches_table(5, batches)
    with pytest.raises(ValueError, match="^the batch at entry 2: a batch of 0 messages$"):
        batches_table(5, batches[::2])
    # A count far above what the payload can hold is refused before much is allocated.
    with pytest.raises(ValueError, match="^member 1: its metadata size is cut off$"):
        batches_table(5, [as_batch(0, 2**31 - 1, GOOD, meta)], max_members=2**31 - 1)


@st.composite
def damaged(draw: st.DrawFn) -> tuple[bytes, int]:
    """A batch cut short, grown, or with bytes overwritten; or bytes at random."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=64)), draw(st.integers(-2, 5))
    ms = draw(st.lists(members(small=True), min_size=1, max_size=4))
    payload = bytearray(encode(ms))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(payload)))
        how = draw(st.sampled_from(["cut", "insert", "overwrite"]))
        if how == "cut":
            del payload[at:]
        elif how == "insert":
            payload[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif at < len(payload):
            payload[at] = draw(st.integers(0, 255))
    return bytes(payload), len(ms) + draw(st.sampled_from([0, 0, 0, -1, 1]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged())
def test_damaged_batches_the_walks_agree_and_never_accept_what_the_per_record_path_refuses(
    case: tuple[bytes, int],
) -> None:
    payload, count = case
    meta = BatchMeta()
    checked = both(lambda: check_batch(payload, count))
    tables = both(lambda: table_of(1, 0, count, payload, meta))
    # Both walks: the same size or the same reason, and a table exactly when the check passes.
    assert repr(checked["native"]) == repr(checked["python"])
    assert isinstance(tables["native"], ValueError) == isinstance(checked["native"], ValueError)
    if isinstance(tables["native"], ValueError):
        assert repr(tables["native"]) == repr(tables["python"]) == repr(checked["native"])
        return
    # What they accept, the per-record path stores alike (it accepts more: see the module
    # docstring of ledger.batch_codec).
    try:
        expected = reference(1, 0, count, payload, meta)
    except ProtocolError:
        pytest.fail("a batch the per-record path refuses was accepted")
    assert_same(tables["native"], expected)
    assert_same(tables["python"], expected)
    assert checked["native"] == reference_size(payload, count)


def test_the_per_record_path_lets_through_what_the_walks_refuse() -> None:
    """Where the walks are stricter than protobuf's parser, on purpose (see the module docstring):
    protobuf hands over a key that is not UTF-8 as bytes, takes a missing payload size for 0 and
    skips groups."""
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=1)
    for case in ("a key not UTF-8", "no payload size", "a group"):
        payload, count, _ = MALFORMED[case]
        assert len(to_records(md, payload, len(payload))) == 1, case


# ---- building and falling back ------------------------------------------------------------------


def test_the_extension_is_built() -> None:
    """``make install`` compiles it (the build is optional, so a failure would pass unseen)."""
    assert batch_codec._extension is not None
    assert batch_codec.native() == (os.environ.get("COMPACTOR_BATCH_CODEC") != "python")


def test_imported_from_a_zip_the_python_walk_serves(tmp_path: Path) -> None:
    """As on a Spark executor: the package's sources from a zip, next to pyarrow but without
    this project installed (``-S``: no .pth, so not the editable install's finder either); and
    the extension turned off by the environment."""
    archive = tmp_path / "code.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in (ROOT / "ledger").glob("*.py"):
            z.write(path, f"ledger/{path.name}")
    payload = encode([Member(value=b"v", key="k", properties=[("a", "b")])])
    code = (
        "import sys; sys.path[:0] = sys.argv[1:]\n"
        "from ledger import batch_codec as bc, batch_decoder as bd\n"
        "assert bc.__file__.startswith(sys.argv[1]), bc.__file__\n"
        f"t = bd.batch_table(1, 0, 1, {payload!r}, publish_time=1, producer_name='p', first_sequence_id=0,"
        " deliver_at_time=None, ordering_key=None, schema_version=None)\n"
        f"print(bc.native(), bd.check_batch({payload!r}, 1), t.column('key').to_pylist())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("COMPACTOR_BATCH_CODEC", "PYTHONPATH")}
    site_packages = sysconfig.get_paths()["purelib"]
    out = subprocess.run(
        [sys.executable, "-S", "-c", code, str(archive), site_packages],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "4", "['k']"]
    forced = subprocess.run(
        [sys.executable, "-c", "from ledger import batch_codec as bc; print(bc.native())"],
        capture_output=True,
        text=True,
        env={**env, "COMPACTOR_BATCH_CODEC": "python"},
        cwd=ROOT,
        check=False,
    )
    assert forced.stdout.split() == ["False"], forced.stderr
