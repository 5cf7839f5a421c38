"""A consumer's batch encoded back from stored members (``encode_batch_payload``): the C encoder,
the Python one and protobuf's own serializer write the same bytes, slot for slot; what is not an
``Entry`` as the ledger makes one is refused with an exception, never a crash."""

from __future__ import annotations

import contextlib
import struct
import sys
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.messages import batch_message, to_records
from ledger import batch_codec
from ledger.batch_encoder import PLACEHOLDER, encode_batch_payload, single_metadata
from ledger.entry import Entry

IMPLEMENTATIONS = ("native", "python")
U64 = 2**64


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    with batch_codec.use_native(request.param == "native"):
        yield request.param


def both(entries: Any, batch_size: Any) -> dict[str, Any]:
    """The payload under each implementation, or the exception it raised."""
    out: dict[str, Any] = {}
    for name in IMPLEMENTATIONS:
        with batch_codec.use_native(name == "native"):
            try:
                out[name] = encode_batch_payload(entries, batch_size)
            except Exception as e:
                out[name] = e
    return out


def entry(index: int | None, size: int, **fields: Any) -> Entry:
    base = Entry(
        ledger_id=3,
        entry_id=10 + (index or 0),
        key=None,
        value=b"",
        properties={},
        publish_time=1_700_000_000_000,
        event_time=None,
        batch_index=index,
        batch_size=size,
        producer_name="p",
        sequence_id=None,
        deliver_at_time=None,
        ordering_key=None,
        schema_version=None,
    )
    return base._replace(**fields)


def protobuf_payload(entries: list[Entry], n: int) -> bytes:
    """What protobuf itself writes for the slots (numbers within its uint64 fields)."""
    present = {e.batch_index: e for e in entries if e.batch_index is not None}
    empty = pb.SingleMessageMetadata(payload_size=0, compacted_out=True).SerializeToString()
    parts = []
    for i in range(n):
        e = present.get(i)
        if e is None:
            parts += [struct.pack(">I", len(empty)), empty]
            continue
        md = pb.SingleMessageMetadata(payload_size=len(e.value or b""))
        md.properties.extend(pb.KeyValue(key=k, value=v) for k, v in e.properties.items())
        if e.key is not None:
            md.partition_key = e.key
        if e.event_time:
            md.event_time = e.event_time
        if e.ordering_key is not None:
            md.ordering_key = e.ordering_key
        if e.sequence_id is not None:
            md.sequence_id = e.sequence_id
        if e.value is None:
            md.null_value = True
        meta = md.SerializeToString()
        parts += [struct.pack(">I", len(meta)), meta, e.value or b""]
    return b"".join(parts)


# ---- the same bytes --------------------------------------------------------------------------

text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(["", "é", "ключ", "鍵", "🔑"])
u64 = st.integers(0, U64 - 1) | st.sampled_from([0, 1, 127, 128, 2**14, 2**21, 2**63 - 1, U64 - 1])


@st.composite
def batches(draw: st.DrawFn, numbers: st.SearchStrategy[int] = u64) -> tuple[list[Entry], int]:
    """Members of one stored batch: some of its slots (gaps where a member is left out), in
    index order, each with or without a key, a value, properties, an event time..."""
    n = draw(st.integers(1, 20) | st.sampled_from([64, 65, 130]))
    indexes = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=min(n, 12))))
    members = []
    for i in indexes:
        value = draw(st.none() | st.binary(max_size=40) | st.sampled_from([b"", b"x" * 200]))
        members.append(
            entry(
                i,
                n,
                key=draw(st.none() | text),
                value=value,
                properties=draw(st.dictionaries(text, text | st.just("v" * 130), max_size=3)),
                event_time=draw(st.none() | numbers),
                sequence_id=draw(st.none() | numbers),
                ordering_key=draw(st.none() | st.binary(max_size=8)),
            )
        )
    return members, n


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_the_encoders_write_what_protobuf_writes(batch: tuple[list[Entry], int]) -> None:
    members, n = batch
    out = both(members, n)
    assert out["native"] == out["python"] == protobuf_payload(members, n)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**70), 2**70)))
def test_numbers_outside_uint64_are_written_alike(batch: tuple[list[Entry], int]) -> None:
    """Protobuf refuses them; both encoders write their low 64 bits (a negative as two's
    complement), as the hand encoder always has."""
    members, n = batch
    out = both(members, n)
    assert out["native"] == out["python"]


@settings(max_examples=100, deadline=None)
@given(batches())
def test_a_batch_message_reads_back_as_the_members_sent(batch: tuple[list[Entry], int]) -> None:
    members, n = batch
    # A stored message's sequence id is below 2**63 (a SEND above it is refused).
    assume(all((e.sequence_id or 0) < 2**63 for e in members))
    sent = {}
    for name in IMPLEMENTATIONS:
        with batch_codec.use_native(name == "native"):
            sent[name] = batch_message(members)
    assert sent["native"] == sent["python"]
    _, metadata, payload, ack_set = sent["native"]
    md = pb.MessageMetadata.FromString(metadata)
    # The slots left out are marked compacted out (to_records refuses those): read the rest.
    slots = _slots(payload, n)
    indexes = [e.batch_index for e in members]
    assert [i for i, (single, _) in enumerate(slots) if not single.compacted_out] == indexes
    if len(members) == n:
        assert ack_set == []
        records = to_records(md, payload, len(payload))
        assert [(r.key, r.value, r.properties, r.event_time, r.ordering_key) for r in records] == [
            (e.key, e.value, e.properties, e.event_time or None, e.ordering_key) for e in members
        ]
    else:
        words = [w % U64 for w in ack_set]
        assert [i for i in range(n) if words[i // 64] >> (i % 64) & 1] == indexes
    for e in members:
        single, value = slots[e.batch_index]  # type: ignore[index]
        assert (single.partition_key if single.HasField("partition_key") else None) == e.key
        assert (None if single.null_value else value) == e.value


def _slots(payload: bytes, n: int) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    out, at = [], 0
    for _ in range(n):
        (size,) = struct.unpack_from(">I", payload, at)
        single = pb.SingleMessageMetadata.FromString(payload[at + 4 : at + 4 + size])
        at += 4 + size
        out.append((single, payload[at : at + single.payload_size]))
        at += single.payload_size
    assert at == len(payload)
    return out


def test_the_placeholder_is_what_protobuf_writes() -> None:
    empty = pb.SingleMessageMetadata(payload_size=0, compacted_out=True).SerializeToString()
    assert struct.pack(">I", len(empty)) + empty == PLACEHOLDER
    assert both([], 3) == {"native": PLACEHOLDER * 3, "python": PLACEHOLDER * 3}


def test_the_c_encoder_reads_the_items_of_an_entry_where_entry_has_them() -> None:
    """``ledger/_batch_codec.c`` reads an Entry's items by index (its E_* constants)."""
    fields = Entry._fields
    assert len(fields) == 14
    assert [fields.index(f) for f in ("key", "value", "properties", "event_time")] == [2, 3, 4, 6]
    assert [fields.index(f) for f in ("batch_index", "sequence_id", "ordering_key")] == [7, 10, 12]


def test_a_members_metadata_carries_every_field_in_number_order(implementation: str) -> None:
    e = entry(
        0,
        1,
        key="k",
        value=None,
        properties={"b": "2", "a": "1"},
        event_time=5,
        sequence_id=300,
        ordering_key=b"o",
    )
    meta = b"\x0a\x06\x0a\x01b\x12\x012" + b"\x0a\x06\x0a\x01a\x12\x011" + b"\x12\x01k"
    meta += b"\x18\x00" + b"\x28\x05" + b"\x3a\x01o" + b"\x40\xac\x02" + b"\x48\x01"
    assert single_metadata(e) == meta
    assert encode_batch_payload([e], 1) == struct.pack(">I", len(meta)) + meta


def test_slots_are_taken_by_batch_index(implementation: str) -> None:
    """In any order given; the last member given for a slot; none for an index outside the
    batch or no index; the slots of a big batch with one member are placeholders."""
    a, b, c = (entry(i, 4, value=bytes([65 + i])) for i in (0, 1, 3))
    expected = encode_batch_payload([a, b, c], 4)
    assert encode_batch_payload([c, a, b], 4) == expected
    assert encode_batch_payload(iter([a, b, c]), 4) == expected
    assert encode_batch_payload((a, b, c), 4) == expected
    again = b._replace(value=b"again")
    assert encode_batch_payload([a, b, again, c], 4) == encode_batch_payload([a, again, c], 4)
    outside = [entry(4, 4), entry(-1, 4), entry(2**64, 4), entry(None, 4), entry(True, 4, value=b"B")]
    assert encode_batch_payload([a, *outside, c], 4) == encode_batch_payload(
        [a, b._replace(value=b"B"), c], 4
    )
    assert encode_batch_payload([a, b, c], 0) == b""
    big = encode_batch_payload([entry(99_999, 100_000, value=b"last")], 100_000)
    assert big[: 8 * 99_999] == PLACEHOLDER * 99_999 and big.endswith(b"last")


def test_bytes_like_values_and_ordering_keys(implementation: str) -> None:
    plain = entry(0, 1, value=b"value", ordering_key=b"ok")
    expected = encode_batch_payload([plain], 1)
    for kind in (bytearray, memoryview):
        e = plain._replace(value=kind(b"value"), ordering_key=kind(b"ok"))
        assert encode_batch_payload([e], 1) == expected


def test_properties_in_the_order_items_gives(implementation: str) -> None:
    ordered = OrderedDict([("a", "1"), ("b", "2"), ("c", "3")])
    ordered.move_to_end("a")
    e = entry(0, 1, properties=ordered)
    assert encode_batch_payload([e], 1) == encode_batch_payload([entry(0, 1, properties=dict(ordered))], 1)
    many = {f"name-{i}": "v" * i for i in range(300)}
    assert encode_batch_payload([entry(0, 1, properties=many)], 1) == protobuf_payload(
        [entry(0, 1, properties=many)], 1
    )


def test_numbers_are_ints_of_any_kind(implementation: str) -> None:
    class Number(int):
        pass

    e = entry(0, 1, event_time=Number(7), sequence_id=True, value=b"x")
    assert encode_batch_payload([e], 1) == encode_batch_payload(
        [entry(0, 1, event_time=7, sequence_id=1, value=b"x")], 1
    )
    # An event time of 0 (or False) is no event time, as protobuf's default.
    assert encode_batch_payload([entry(0, 1, event_time=False)], 1) == encode_batch_payload([entry(0, 1)], 1)
    # Written as its low 64 bits: 2**64 is truthy, so sent, as 0.
    assert (
        encode_batch_payload([entry(0, 1, event_time=U64)], 1) == struct.pack(">I", 4) + b"\x18\x00\x28\x00"
    )


# ---- refused, never a crash --------------------------------------------------------------------

WRONG = {
    "key": [b"k", 1, 1.5, ["k"]],
    "value": ["v", 1, 2.5, [b"v"], {}],
    "properties": [[("a", "b")], {"a": b"b"}, {b"a": "b"}, {1: "b"}, {"a": None}, "ab", 7],
    "event_time": ["1", 1.5, b"1", [1]],
    "batch_index": ["0", 0.0, b"\x00"],
    "sequence_id": ["1", 1.5, b"1", [1]],
    "ordering_key": ["o", 1, 1.5],
}


@pytest.mark.parametrize(
    "name,value", [(name, v) for name, values in WRONG.items() for v in values], ids=repr
)
def test_an_item_of_another_type_is_a_type_error(name: str, value: Any) -> None:
    good = entry(0, 2, key="k", value=b"v", properties={"a": "b"}, event_time=1, sequence_id=1)
    bad = good._replace(**{name: value})
    with batch_codec.use_native(True), pytest.raises(TypeError):
        encode_batch_payload([bad, entry(1, 2)], 2)
    # The Python encoder raises what its operations raise (or lets a falsy one pass).
    with batch_codec.use_native(False), contextlib.suppress(TypeError, AttributeError):
        encode_batch_payload([bad, entry(1, 2)], 2)


@pytest.mark.parametrize(
    "entries,size",
    [
        ([1], 1),
        (["abc"], 1),
        ([None], 1),
        ([(0, 1, 2)], 1),
        ([tuple(entry(0, 1)) + (None,)], 1),
        (5, 1),
        (None, 1),
        ([entry(0, 1)], "1"),
        ([entry(0, 1)], 1.0),
        ([entry(0, 1)], None),
    ],
    ids=repr,
)
def test_what_is_not_entries_is_a_type_error(entries: Any, size: Any) -> None:
    out = both(entries, size)
    assert isinstance(out["native"], TypeError), out
    assert isinstance(out["python"], (TypeError, AttributeError)), out


def test_a_negative_or_impossible_size(implementation: str) -> None:
    with pytest.raises(ValueError, match="^a batch of -1 messages$"):
        encode_batch_payload([entry(0, 1)], -1)
    if implementation == "native":
        with pytest.raises((MemoryError, OverflowError)):
            encode_batch_payload([entry(0, 1)], sys.maxsize)
        with pytest.raises(OverflowError):
            encode_batch_payload([entry(0, 1)], 2**64)


def test_a_string_without_utf8_is_refused_as_str_encode_refuses_it(implementation: str) -> None:
    for fields in ({"key": "\ud800"}, {"properties": {"\udc00": "v"}}, {"properties": {"k": "a\ud800"}}):
        with pytest.raises(UnicodeEncodeError):
            encode_batch_payload([entry(0, 1, **fields)], 1)


def test_items_that_clear_the_entries_on_the_way_cannot_pull_them_away() -> None:
    """A dict subclass's ``items()`` runs Python code in the middle of the walk: the C encoder
    holds its own references to what it reads."""
    entries: list[Any] = []

    class Clearing(dict[str, str]):
        def items(self) -> Any:
            entries.clear()
            return list(super().items())

    plain = [entry(0, 2, properties={"a": "b"}, value=b"x" * 100), entry(1, 2, value=b"y" * 100)]
    expected = protobuf_payload(plain, 2)
    entries += [plain[0]._replace(properties=Clearing(a="b")), plain[1]]
    with batch_codec.use_native(True):
        assert encode_batch_payload(entries, 2) == expected


garbage = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=3)
    | st.binary(max_size=3)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(
        st.text(max_size=2) | st.binary(max_size=2), st.text(max_size=2) | st.integers(), max_size=2
    )
)
READ = sorted(set(Entry._fields) - {"ledger_id", "entry_id"})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(READ), garbage), max_size=4), st.integers(0, 4))
def test_garbage_items_raise_or_encode_never_crash(changes: list[tuple[str, Any]], n: int) -> None:
    members = [entry(i, 3, key="k", value=b"v", properties={"a": "b"}) for i in range(3)]
    for k, (name, value) in enumerate(changes):
        members[k % 3] = members[k % 3]._replace(**{name: value})
    out = both(members, n)
    # The C encoder refuses a wrong type; what it accepts, the Python one writes alike.
    if not isinstance(out["native"], Exception):
        assert out["python"] == out["native"]
    else:
        assert isinstance(out["native"], (TypeError, ValueError, OverflowError)), out["native"]


def test_no_references_are_leaked() -> None:
    value, key, props = b"v" * 50, "key-" + "x" * 20, {"a": "b"}
    good = entry(0, 2, key=key, value=value, properties=props)
    bad = entry(1, 2, key=key, value=value, properties={"a": 1})
    before = [sys.getrefcount(o) for o in (value, key, props, good, bad)]
    with batch_codec.use_native(True):
        for _ in range(1000):
            encode_batch_payload([good], 2)
            with pytest.raises(TypeError):
                encode_batch_payload([good, bad], 2)
    assert [sys.getrefcount(o) for o in (value, key, props, good, bad)] == before
