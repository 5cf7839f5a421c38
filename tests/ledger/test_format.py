"""The write-ahead file's byte layout: what one writer encodes, any reader decodes."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import format as fmt
from ledger.entry import Entry, Record
from ledger.format import CorruptRecordError, MalformedBodyError

LEDGER = 7


def record(
    key: str | None = "k",
    value: bytes | None = b"v",
    properties: dict[str, str] | None = None,
    publish_time: int = 1_700_000_000_000,
    event_time: int | None = None,
    batch: tuple[int, int] | None = None,
    producer: tuple[str, int] | None = None,
    deliver_at: int | None = None,
    ordering_key: bytes | None = None,
    schema_version: bytes | None = None,
) -> Record:
    index, size = batch if batch is not None else (None, None)
    name, sequence_id = producer if producer is not None else (None, None)
    return Record(
        key,
        value,
        properties or {},
        publish_time,
        event_time,
        index,
        size,
        name,
        sequence_id,
        deliver_at,
        ordering_key,
        schema_version,
    )


def as_entry(entry_id: int, r: Record) -> Entry:
    return Entry(
        LEDGER,
        entry_id,
        r.key,
        r.value,
        dict(r.properties),
        r.publish_time,
        r.event_time,
        r.batch_index,
        r.batch_size,
        r.producer_name,
        r.sequence_id,
        r.deliver_at_time,
        r.ordering_key,
        r.schema_version,
    )


def split_frames(data: bytes) -> list[bytes]:
    """Bodies of the frames in ``data``, checking each frame header on the way."""
    bodies = []
    pos = 0
    while pos < len(data):
        length, crc = fmt.decode_frame_header(data, pos)
        body = data[pos + fmt.FRAME_HEADER_SIZE : pos + fmt.FRAME_HEADER_SIZE + length]
        assert len(body) == length
        assert crc32c.crc32c(body) == crc
        bodies.append(body)
        pos += fmt.FRAME_HEADER_SIZE + length
    return bodies


def decode_record(frame: bytes) -> Entry:
    [body] = split_frames(frame)
    return fmt.decode_body(body, LEDGER)


# ---------------------------------------------------------------------- header


def test_header_round_trip() -> None:
    header = fmt.encode_header(42)
    assert len(header) == fmt.HEADER_SIZE
    assert header.startswith(fmt.MAGIC)
    assert fmt.decode_header(header, "x.wal") == 42


def test_wrong_magic_names_file_and_offset() -> None:
    bad = b"NOTAWAL!" + struct.pack("<Q", 1)
    with pytest.raises(CorruptRecordError) as info:
        fmt.decode_header(bad, Path("/data/t/00000000000000000001.wal"))
    assert info.value.offset == 0
    assert "/data/t/00000000000000000001.wal" in str(info.value)
    assert "offset 0" in str(info.value)


def test_short_header_is_an_error_for_the_decoder() -> None:
    with pytest.raises(CorruptRecordError):
        fmt.decode_header(fmt.encode_header(1)[:10], "x.wal")


def test_corrupt_record_error_str_has_path_and_offset() -> None:
    e = CorruptRecordError(Path("/a/b.wal"), 1234, "CRC mismatch")
    assert str(e) == "/a/b.wal: offset 1234: CRC mismatch"
    assert (e.path, e.offset, e.reason) == (Path("/a/b.wal"), 1234, "CRC mismatch")


# ---------------------------------------------------------------------- records


@pytest.mark.parametrize(
    "r",
    [
        record(),
        record(value=None),  # tombstone
        record(key=None),  # keyless message
        record(key="", value=b""),  # empty is not absent
        record(key=None, value=None),
        record(properties={"a": "1", "ünïcødé": "ß", "": ""}),
        record(event_time=0),
        record(event_time=-5, publish_time=-1),
        record(key="κλειδί", value=bytes(range(256)) * 10),
        record(batch=(0, 1)),  # a batch of one
        record(value=None, properties={"p": "q"}, batch=(2, 5)),  # a member, after its properties
        record(producer=("standalone-0-7", 2**63 - 1)),  # a Pulsar producer's message
        record(producer=("ünï", 0), batch=(0, 2)),  # ... and batch member
        record(deliver_at=1_700_000_005_000, producer=("p", 1)),  # Pulsar's delayed delivery
        record(ordering_key=b"\x00order", producer=("p", 2)),  # Pulsar's ordering key
        record(ordering_key=b"", schema_version=b""),  # empty, not absent
        record(schema_version=(3).to_bytes(8, "big"), batch=(1, 2), deliver_at=7),  # everything at once
    ],
)
def test_record_round_trip(r: Record) -> None:
    assert decode_record(fmt.encode_record(3, r)) == as_entry(3, r)


def test_empty_and_absent_stay_distinct() -> None:
    empty = decode_record(fmt.encode_record(0, record(key="", value=b"")))
    absent = decode_record(fmt.encode_record(0, record(key=None, value=None)))
    keyless_empty = decode_record(fmt.encode_record(0, record(key=None, value=b"")))
    # The bytes stay what was sent; the delete rule reads them: a keyed empty value deletes
    # (an empty key is a key), a keyless one does not.
    assert (empty.key, empty.value, empty.is_tombstone) == ("", b"", True)
    assert (absent.key, absent.value, absent.is_tombstone) == (None, None, True)
    assert (keyless_empty.key, keyless_empty.value, keyless_empty.is_tombstone) == (None, b"", False)


def test_frame_layout() -> None:
    frame = fmt.encode_record(9, record())
    length, crc = struct.unpack_from("<II", frame)
    body = frame[8:]
    assert length == len(body)
    assert crc == crc32c.crc32c(body)
    assert struct.unpack_from("<Q", body)[0] == 9  # entry id leads the body


def test_encode_frames_numbers_consecutively() -> None:
    records = [record(key=f"k{i}") for i in range(5)]
    bodies = [fmt.encode_body(0, r) for r in records]
    data = bytes(fmt.encode_frames(100, bodies))
    decoded = [fmt.decode_body(b, LEDGER) for b in split_frames(data)]
    assert decoded == [as_entry(100 + i, r) for i, r in enumerate(records)]


@pytest.mark.parametrize(
    "bad",
    [
        record(publish_time=2**63),
        record(event_time=-(2**63) - 1),
        record(key="\ud800"),  # a lone surrogate has no UTF-8 form
    ],
)
def test_unencodable_records_raise_value_error(bad: Record) -> None:
    with pytest.raises(ValueError):
        fmt.encode_record(0, bad)


def test_entry_id_out_of_range() -> None:
    with pytest.raises(ValueError):
        fmt.encode_record(2**64, record())
    with pytest.raises(ValueError):
        fmt.encode_record(-1, record())


# ---------------------------------------------------------------------- malformed bodies


def _body(r: Record | None = None) -> bytes:
    return fmt.encode_body(0, r or record(properties={"p": "q"}))


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda b: b + b"x", id="trailing-byte"),
        pytest.param(lambda b: b[:-1], id="truncated"),
        pytest.param(lambda b: b[:10], id="shorter-than-fixed-part"),
        # Every flag bit is a field now: a flag set without its field overruns the body.
        pytest.param(lambda b: b[:16] + bytes([b[16] | 0x80]) + b[17:], id="flag-without-its-field"),
        pytest.param(
            lambda b: b[:16] + bytes([b[16] | 0x40]) + b[17:] + struct.pack("<I", 5) + b"abc",
            id="ordering-key-overruns",
        ),
        pytest.param(lambda b: b[:33] + struct.pack("<I", 99) + b[37:], id="property-count-too-high"),
        pytest.param(lambda b: b[:25] + struct.pack("<I", 10**6) + b[29:], id="key-length-overruns"),
    ],
)
def test_malformed_bodies_are_rejected(mangle: Callable[[bytes], bytes]) -> None:
    with pytest.raises(MalformedBodyError):
        fmt.decode_body(mangle(_body()), LEDGER)


def test_a_batch_member_whose_index_is_not_below_its_size_is_malformed() -> None:
    body = _body(record(batch=(1, 3)))
    bad = body[:-8] + struct.pack("<II", 3, 3)
    with pytest.raises(MalformedBodyError, match="batch index 3"):
        fmt.decode_body(bad, LEDGER)
    with pytest.raises(MalformedBodyError, match="overruns"):
        fmt.decode_body(body[:-4], LEDGER)


def test_a_body_from_before_batches_reads_as_a_message_sent_alone() -> None:
    # The earlier format had no batch flag: its bodies are today's bodies without one.
    e = fmt.decode_body(_body(record(properties={"p": "q"})), LEDGER)
    assert (e.batch_index, e.batch_size, e.message_id) == (None, None, f"{LEDGER}:0")
    assert (e.producer_name, e.sequence_id) == (None, None)


def test_invalid_utf8_key_is_rejected() -> None:
    body = bytearray(_body(record(key="ab")))
    body[fmt.BODY_HEADER_SIZE] = 0xFF
    with pytest.raises(MalformedBodyError, match="UTF-8"):
        fmt.decode_body(bytes(body), LEDGER)


def test_length_sanity_bounds() -> None:
    assert not fmt.body_length_is_sane(0)
    assert not fmt.body_length_is_sane(fmt.BODY_HEADER_SIZE - 1)
    assert fmt.body_length_is_sane(fmt.BODY_HEADER_SIZE)
    assert not fmt.body_length_is_sane(0xFFFFFFFF)


# ---------------------------------------------------------------------- property test

i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
records = st.builds(
    Record,
    key=st.none() | st.text(max_size=20),
    value=st.none() | st.binary(max_size=64),
    properties=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
    publish_time=i64,
    event_time=st.none() | i64,
    ordering_key=st.none() | st.binary(max_size=8),
    schema_version=st.none() | st.binary(max_size=8),
)


@settings(max_examples=200, deadline=None)
@given(first=st.integers(min_value=0, max_value=2**63), batch=st.lists(records, max_size=8))
def test_batches_round_trip(first: int, batch: list[Record]) -> None:
    data = bytes(fmt.encode_frames(first, [fmt.encode_body(0, r) for r in batch]))
    decoded = [fmt.decode_body(b, LEDGER) for b in split_frames(data)]
    assert decoded == [as_entry(first + i, r) for i, r in enumerate(batch)]
    # One frame at a time gives the same bytes as the batch.
    assert b"".join(fmt.encode_record(first + i, r) for i, r in enumerate(batch)) == data


def test_frame_parts_are_the_bytes_of_encode_frames() -> None:
    bodies = [fmt.encode_body(0, Record(key="k", value=b"v" * i)) for i in range(5)]
    counts = [0, 3, 0, 2, 0]
    parts, size = fmt.frame_parts(7, bodies, counts)
    joined = b"".join(bytes(p) for p in parts)
    assert joined == bytes(fmt.encode_frames(7, bodies, counts))
    assert size == len(joined)
