"""The members of a Pulsar batch, decoded in bulk: checked on the produce path
(:func:`check_batch`), made into rows of ``ledger.schema.ARROW_SCHEMA`` when a ledger is sealed
(:func:`batch_table`, or :func:`batches_table` for many batches in one table).

A batch is stored as it was received (one write-ahead record, its members at entries
``E .. E+count-1``); nothing here makes a Python object per member. The uncompressed payload of
a batch of ``count`` members is, ``count`` times::

    u32      metadata_size    big-endian
    metadata_size bytes       SingleMessageMetadata (protobuf, api/pulsar/pulsar_api.proto):
                                1 properties (repeated KeyValue{1 key, 2 value}, strings)
                                2 partition_key (string: the member's key)
                                3 payload_size (int32, required)
                                4 compacted_out (bool)     5 event_time (uint64, 0 = none)
                                7 ordering_key (bytes)     8 sequence_id (uint64)
                                9 null_value (bool)        others skipped
    payload_size bytes        the member's value

A member reads as ``api.pulsar.messages`` reads it with protobuf's parser: the last of a
repeated scalar wins; a field of a known number but another wire type is skipped as unknown; a
KeyValue without key or value has ``""``; properties are a dict of them (each name once, where
it first appears, with its last value). Where that parser lets through what the ledger cannot
store, or what Pulsar's own broker refuses, this refuses it (``ValueError(reason)``):

- a count outside ``1..max_members``; a size or field cut off or overrunning the batch; bytes
  after the last member; a field numbered 0; wire types 3 and 4 (groups), 6 and 7; a tag or
  length past 5 bytes or 32 bits, a varint past 10 bytes;
- a member marked ``compacted_out`` (member ``i`` is stored at entry ``E + i``);
- no ``payload_size`` (protobuf reads 0), or a negative one;
- a key or property string that is not UTF-8 (protobuf hands it over as bytes), strictly: no
  surrogates, overlong forms or code points above U+10FFFF;
- an event time or sequence id above ``2**63 - 1`` (the columns are int64), the batch's first
  sequence id plus a member's index included, for a member without a sequence id of its own.

The way back, :func:`encode_batch_payload`: stored members (``ledger.entry.Entry``) encoded as
such a payload again, for a consumer (``api.pulsar.messages.batch_message``), member ``i`` in slot
``i``, and in a slot without a member an empty one (``PLACEHOLDER``: ``payload_size`` 0 and
``compacted_out``, which the consumer's ``ack_set`` leaves out). Each member's
SingleMessageMetadata is what protobuf writes for it (fields in number order: properties in the
dict's order, key, payload size, event time when not 0, ordering key, sequence id, ``null_value``
for a null value; a negative int as its 64-bit two's complement).

:func:`encode_row_batches` writes the same bytes for batches whose members are rows of a sealed
ledger (a ``pyarrow.Table`` slice), straight from the columns' Arrow buffers: a consumer's read of
a sealed ledger makes no Python object per member.

Two implementations: the C extension ``ledger._batch_codec`` (``ledger/_batch_codec.c``) and,
where it cannot be imported (not compiled at install; a Spark executor, which imports this
package from a zip), :func:`_walk`, the same walk in Python: the same checks in the same order,
the same messages, the same buffers, some 50 times slower (and :func:`_encode`, the same bytes,
some 30 times slower). :func:`native` says which one is in use; ``COMPACTOR_BATCH_CODEC=python``
in the environment makes a process use the Python one, and tests switch with :func:`use_native`.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from ledger.entry import Entry
from ledger.schema import (
    ARROW_SCHEMA,
    EVENT_TIME,
    KEY,
    ORDERING_KEY,
    PROPERTIES,
    SEQUENCE_ID,
    VALUE,
    all_empty,
    table_to_entries,
)

try:
    from ledger import _batch_codec as _extension
except ImportError:  # no compiler at install, or imported from a zip
    _extension = None  # type: ignore[assignment]

_native: Any = None if os.environ.get("COMPACTOR_BATCH_CODEC") == "python" else _extension

#: A batch may not claim more members than this (the clients' default is 1,000 messages).
MAX_MEMBERS = 100_000
# What a stored batch may have when it is made into rows (checked against MAX_MEMBERS or the
# caller's limit when it was produced: sealing does not refuse what was accepted).
_NO_LIMIT = 2**31 - 1
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


def native() -> bool:
    """Whether the C implementation is in use."""
    return _native is not None


@contextmanager
def use_native(on: bool) -> Iterator[None]:
    """Within the block, the C implementation (``on``, which needs it built) or the Python one."""
    global _native
    if on and _extension is None:
        raise RuntimeError("ledger._batch_codec is not built")
    before, _native = _native, (_extension if on else None)
    try:
        yield
    finally:
        _native = before


def check_batch(
    payload: bytes | memoryview,
    count: int,
    max_members: int = MAX_MEMBERS,
    *,
    first_sequence_id: int = 0,
) -> int:
    """Validates an uncompressed batch payload of ``count`` members (see the module docstring)
    and returns the sum of the members' ``ledger.entry.record_size``: key, value (none for a
    ``null_value`` member) and property names and values, in bytes. ``first_sequence_id`` is the
    batch's (its MessageMetadata's): a member without one of its own is numbered from it, and
    must stay within int64. Raises ``ValueError(reason)`` for a malformed batch."""
    if not 0 < count <= max_members:
        raise ValueError(f"a batch of {count} messages")
    if not _INT64_MIN <= first_sequence_id <= _INT64_MAX:
        raise ValueError(f"a first sequence id of {first_sequence_id}")
    if _native is not None:
        return int(_native.check(payload, count, max_members, first_sequence_id))
    batch = Batch(0, count, payload, 0, "", first_sequence_id, None, None, None)
    return _walk(batch, max_members, "", None, 0)


class Batch(NamedTuple):
    """A stored batch: where its members go, its payload (uncompressed) and the fields of its
    MessageMetadata that its members share (and the publish time the broker gave it)."""

    first_entry: int
    num_messages: int  # its members
    payload: bytes | memoryview
    publish_time: int
    producer_name: str
    first_sequence_id: int
    deliver_at_time: int | None
    ordering_key: bytes | None
    schema_version: bytes | None


def batch_table(
    ledger_id: int,
    first_entry: int,
    count: int,
    payload: bytes | memoryview,
    *,
    publish_time: int,
    producer_name: str,
    first_sequence_id: int,
    deliver_at_time: int | None,
    ordering_key: bytes | None,
    schema_version: bytes | None,
    max_members: int = _NO_LIMIT,
) -> pa.Table:
    """The rows of a batch's members, entries ``first_entry .. first_entry + count - 1`` of
    ledger ``ledger_id``, in ``ARROW_SCHEMA``: what ``records_to_table`` makes of the records
    ``api.pulsar.messages.to_records`` reads from the batch (member ``i``: batch index ``i``,
    batch size ``count``; its own sequence id, else ``first_sequence_id + i``; its own ordering
    key, else the batch's). The keyword arguments are the batch's MessageMetadata fields (and
    the publish time the broker gave it). Raises ``ValueError(reason)`` for a malformed batch
    (no limit on ``count`` but int32's unless ``max_members`` says: the produce path's check,
    :func:`check_batch`, holds batches to ``MAX_MEMBERS``)."""
    if not 0 < count <= max_members:
        raise ValueError(f"a batch of {count} messages")
    if not _INT64_MIN <= first_sequence_id <= _INT64_MAX:
        raise ValueError(f"a first sequence id of {first_sequence_id}")
    batch = Batch(
        first_entry,
        count,
        payload,
        publish_time,
        producer_name,
        first_sequence_id,
        deliver_at_time,
        ordering_key,
        schema_version,
    )
    return batches_table(ledger_id, [batch], max_members)


def batches_table(ledger_id: int, batches: Sequence[Batch], max_members: int = _NO_LIMIT) -> pa.Table:
    """The rows of several batches' members (as :func:`batch_table` makes them, batch after
    batch, in the order given) in one table, in one walk: what sealing wants, where most of a
    small batch's cost would be making its own table. A malformed batch raises
    ``ValueError(reason)``, the reason naming its first entry when there are several."""
    groups = list(_groups(batches))
    if len(groups) == 1:
        return _table(_decode(ledger_id, batches, max_members))
    return pa.concat_tables([_table(_decode(ledger_id, g, max_members)) for g in groups])


# The data of a variable-width column (int32 offsets) stays below this: one table per run of
# batches that fits (``_COLUMN_LIMIT``), and an error if one does not (``_OFFSET_LIMIT``).
_OFFSET_LIMIT = _COLUMN_LIMIT = 2**31 - 1


def _groups(batches: Sequence[Batch]) -> Iterator[Sequence[Batch]]:
    """``batches`` in runs whose columns fit int32 offsets (one run, unless 2 GiB of payloads)."""
    start = total = 0
    for i, b in enumerate(batches):
        # At most what any one column of the batch can hold: its keys, values, property names
        # or values are within its payload; ordering keys, producer names and schema versions
        # may be repeated on every member.
        repeated = len(b.producer_name) * 4 + len(b.ordering_key or b"") + len(b.schema_version or b"")
        need = len(b.payload) + b.num_messages * repeated
        if i > start and total + need > _COLUMN_LIMIT:
            yield batches[start:i]
            start, total = i, 0
        total += need
    yield batches[start:]


def _decode(ledger_id: int, batches: Sequence[Batch], max_members: int) -> _Columns:
    if _native is not None:
        return _Columns._make(_native.decode(ledger_id, batches, max_members))
    out = _Out()
    for b in batches:
        where = f"the batch at entry {b.first_entry}: " if len(batches) > 1 else ""
        out.size += _walk(b, max_members, where, out, ledger_id)
    return out.columns()


class _Columns(NamedTuple):
    """The rows of a walk, as flat Arrow buffers in the order of ``ARROW_SCHEMA``'s columns:
    bytes-like, int32 offsets, int64 numbers (int32 batch index and size), native byte order; a
    validity bitmap ``None`` when the column has no nulls, with the count of nulls beside it."""

    size: int  # the sum of the members' record sizes
    ledger_ids: bytes
    entry_ids: bytes
    key_valid: bytes | None
    key_nulls: int
    key_offsets: bytes
    key_data: bytes
    value_valid: bytes | None
    value_nulls: int
    value_offsets: bytes
    value_data: bytes
    tombstones: bytes  # a bitmap: is_delete(key, value) of each member
    map_offsets: bytes  # each member's first property pair
    name_offsets: bytes
    name_data: bytes
    text_offsets: bytes
    text_data: bytes
    publish_times: bytes
    event_valid: bytes | None
    event_nulls: int
    event_times: bytes  # 0 where null
    batch_indexes: bytes
    batch_sizes: bytes
    producer_offsets: bytes
    producer_data: bytes
    sequence_ids: bytes
    deliver_valid: bytes | None
    deliver_nulls: int
    deliver_at: bytes  # 0 where null
    ordering_valid: bytes | None
    ordering_nulls: int
    ordering_offsets: bytes
    ordering_data: bytes
    schema_valid: bytes | None
    schema_nulls: int
    schema_offsets: bytes
    schema_data: bytes


_PROPERTIES_TYPE = ARROW_SCHEMA.field(PROPERTIES).type
_ENTRY_FIELDS = [_PROPERTIES_TYPE.key_field, _PROPERTIES_TYPE.item_field]


def _buffers(*data: bytes | None) -> list[pa.Buffer | None]:
    return [None if d is None else pa.py_buffer(d) for d in data]


def _table(c: _Columns) -> pa.Table:
    n = len(c.entry_ids) // 8
    from_buffers = pa.Array.from_buffers
    string, binary, int64, int32 = pa.string(), pa.binary(), pa.int64(), pa.int32()
    pairs = len(c.name_offsets) // 4 - 1
    names = from_buffers(string, pairs, _buffers(None, c.name_offsets, c.name_data), null_count=0)
    texts = from_buffers(string, pairs, _buffers(None, c.text_offsets, c.text_data), null_count=0)
    entries = pa.StructArray.from_arrays([names, texts], fields=_ENTRY_FIELDS)
    return pa.Table.from_arrays(
        [
            from_buffers(int64, n, _buffers(None, c.ledger_ids), null_count=0),
            from_buffers(int64, n, _buffers(None, c.entry_ids), null_count=0),
            from_buffers(string, n, _buffers(c.key_valid, c.key_offsets, c.key_data), null_count=c.key_nulls),
            from_buffers(
                binary, n, _buffers(c.value_valid, c.value_offsets, c.value_data), null_count=c.value_nulls
            ),
            from_buffers(pa.bool_(), n, _buffers(None, c.tombstones), null_count=0),
            from_buffers(
                _PROPERTIES_TYPE, n, _buffers(None, c.map_offsets), null_count=0, children=[entries]
            ),
            from_buffers(int64, n, _buffers(None, c.publish_times), null_count=0),
            from_buffers(int64, n, _buffers(c.event_valid, c.event_times), null_count=c.event_nulls),
            from_buffers(int32, n, _buffers(None, c.batch_indexes), null_count=0),
            from_buffers(int32, n, _buffers(None, c.batch_sizes), null_count=0),
            from_buffers(string, n, _buffers(None, c.producer_offsets, c.producer_data), null_count=0),
            from_buffers(int64, n, _buffers(None, c.sequence_ids), null_count=0),
            from_buffers(int64, n, _buffers(c.deliver_valid, c.deliver_at), null_count=c.deliver_nulls),
            from_buffers(
                binary,
                n,
                _buffers(c.ordering_valid, c.ordering_offsets, c.ordering_data),
                null_count=c.ordering_nulls,
            ),
            from_buffers(
                binary,
                n,
                _buffers(c.schema_valid, c.schema_offsets, c.schema_data),
                null_count=c.schema_nulls,
            ),
        ],
        schema=ARROW_SCHEMA,
    )


# ---- the walk in Python (where the extension is not importable) --------------------------------


class _Malformed(Exception):
    """A reason a member's metadata does not parse."""


_MASK64 = 2**64 - 1
_SIZE = struct.Struct(">I")
_BAD_WIRE_TYPES = {3, 4, 6, 7}


def _varint(buf: memoryview, at: int, end: int, max_bytes: int = 10) -> tuple[int, int]:
    value = shift = 0
    for _ in range(max_bytes):
        if at >= end:
            break
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & _MASK64, at
        shift += 7
    raise _Malformed("a field is cut off")


def _u32(buf: memoryview, at: int, end: int) -> tuple[int, int]:
    """A tag or a length: at most 5 bytes and 32 bits."""
    value, at = _varint(buf, at, end, 5)
    if value > 0xFFFFFFFF:
        raise _Malformed("a field is cut off")
    return value, at


def _length(buf: memoryview, at: int, end: int) -> tuple[int, int]:
    n, at = _u32(buf, at, end)
    if n > end - at:
        raise _Malformed("a field is cut off")
    return at, at + n


def _tag(buf: memoryview, at: int, end: int) -> tuple[int, int, int]:
    tag, at = _u32(buf, at, end)
    if tag >> 3 == 0:
        raise _Malformed("a field numbered 0")
    return tag >> 3, tag & 7, at


def _skip(buf: memoryview, at: int, end: int, wire_type: int) -> int:
    if wire_type == 0:
        return _varint(buf, at, end)[1]
    if wire_type == 2:
        return _length(buf, at, end)[1]
    if wire_type in _BAD_WIRE_TYPES:
        raise _Malformed(f"a field of wire type {wire_type}")
    width = 8 if wire_type == 1 else 4
    if end - at < width:
        raise _Malformed("a field is cut off")
    return at + width


def _utf8(buf: memoryview, start: int, end: int, what: str) -> bytes:
    data = bytes(buf[start:end])
    try:
        data.decode()
    except UnicodeDecodeError:
        raise _Malformed(f"a {what} that is not UTF-8") from None
    return data


def _key_value(buf: memoryview, at: int, end: int) -> tuple[bytes, bytes]:
    name = text = b""
    while at < end:
        field, wire_type, at = _tag(buf, at, end)
        if field in (1, 2) and wire_type == 2:
            start, at = _length(buf, at, end)
            if field == 1:
                name = _utf8(buf, start, at, "property")
            else:
                text = _utf8(buf, start, at, "property")
        else:
            at = _skip(buf, at, end, wire_type)
    return name, text


class _Member:
    __slots__ = ("key", "payload_size", "compacted_out", "event_time", "ordering_key", "sequence_id", "null")

    def __init__(self) -> None:
        self.key: bytes | None = None
        self.payload_size: int | None = None
        self.compacted_out = False
        self.event_time = 0
        self.ordering_key: bytes | None = None
        self.sequence_id: int | None = None
        self.null = False


def _member(buf: memoryview, at: int, end: int, properties: dict[bytes, bytes]) -> _Member:
    m = _Member()
    while at < end:
        tag = buf[at]
        if tag < 0x80 and tag > 7:  # a one-byte tag of a field numbered 1..15 (most are)
            at += 1
            field, wire_type = tag >> 3, tag & 7
        else:
            field, wire_type, at = _tag(buf, at, end)
        if wire_type == 0 and field in (3, 4, 5, 8, 9):
            if at < end and buf[at] < 0x80:
                v = buf[at]
                at += 1
            else:
                v, at = _varint(buf, at, end)
            if field == 3:
                v &= 0xFFFFFFFF
                m.payload_size = v - 2**32 if v >= 2**31 else v
            elif field == 4:
                m.compacted_out = v != 0
            elif field == 5:
                m.event_time = v
            elif field == 8:
                m.sequence_id = v
            else:
                m.null = v != 0
        elif wire_type == 2 and field in (1, 2, 7):
            if at < end and buf[at] < 0x80 and buf[at] < end - at:
                start = at + 1
                at = start + buf[at]
            else:
                start, at = _length(buf, at, end)
            if field == 2:
                m.key = _utf8(buf, start, at, "key")
            elif field == 7:
                m.ordering_key = bytes(buf[start:at])
            else:
                name, text = _key_value(buf, start, at)
                properties[name] = text
        else:
            at = _skip(buf, at, end, wire_type)
    return m


class _Variable:
    """A variable-width column as it fills: its data and offsets (and its validity, one byte per
    row, when it is nullable)."""

    __slots__ = ("data", "offsets", "valid")

    def __init__(self, nullable: bool) -> None:
        self.data = bytearray()
        self.offsets = array("i", [0])
        self.valid: bytearray | None = bytearray() if nullable else None

    def add(self, value: bytes | None) -> None:
        if self.valid is not None:
            self.valid.append(value is not None)
        if value is not None:
            self.data += value
        self.offsets.append(len(self.data))

    def repeat(self, value: bytes | None, n: int) -> None:
        """``value`` (or null) on ``n`` rows."""
        if self.valid is not None:
            self.valid += (b"\x00" if value is None else b"\x01") * n
        start = len(self.data)
        width = 0 if value is None else len(value)
        if value:
            self.data += value * n
            self.offsets.extend(range(start + width, start + width * n + 1, width))
        else:
            self.offsets.extend([start] * n)

    def buffers(self) -> tuple[bytes | None, int, bytes, bytes]:
        if len(self.data) > _OFFSET_LIMIT:
            raise ValueError("the batches hold more than 2 GiB in one column")
        valid, nulls = None, 0
        if self.valid is not None:
            nulls = len(self.valid) - sum(self.valid)
            valid = _bits(self.valid) if nulls else None
        return valid, nulls, self.offsets.tobytes(), bytes(self.data)


class _Out:
    """What ``Out`` is in ``ledger/_batch_codec.c``: the columns as they fill."""

    def __init__(self) -> None:
        self.size = 0
        self.key, self.value, self.ordering, self.schema = (_Variable(True) for _ in range(4))
        self.name, self.text, self.producer = (_Variable(False) for _ in range(3))
        self.map_offsets = array("i", [0])
        self.tombstones, self.event_valid, self.deliver_valid = bytearray(), bytearray(), bytearray()
        self.ledger_ids, self.entry_ids, self.publish_times = array("q"), array("q"), array("q")
        self.event_times, self.sequence_ids, self.deliver_at = array("q"), array("q"), array("q")
        self.batch_indexes, self.batch_sizes = array("i"), array("i")

    def columns(self) -> _Columns:
        key_valid, key_nulls, key_offsets, key_data = self.key.buffers()
        value_valid, value_nulls, value_offsets, value_data = self.value.buffers()
        _, _, name_offsets, name_data = self.name.buffers()
        _, _, text_offsets, text_data = self.text.buffers()
        _, _, producer_offsets, producer_data = self.producer.buffers()
        ordering_valid, ordering_nulls, ordering_offsets, ordering_data = self.ordering.buffers()
        schema_valid, schema_nulls, schema_offsets, schema_data = self.schema.buffers()
        event_nulls = len(self.event_valid) - sum(self.event_valid)
        deliver_nulls = len(self.deliver_valid) - sum(self.deliver_valid)
        return _Columns(
            self.size,
            self.ledger_ids.tobytes(),
            self.entry_ids.tobytes(),
            key_valid,
            key_nulls,
            key_offsets,
            key_data,
            value_valid,
            value_nulls,
            value_offsets,
            value_data,
            _bits(self.tombstones),
            self.map_offsets.tobytes(),
            name_offsets,
            name_data,
            text_offsets,
            text_data,
            self.publish_times.tobytes(),
            _bits(self.event_valid) if event_nulls else None,
            event_nulls,
            self.event_times.tobytes(),
            self.batch_indexes.tobytes(),
            self.batch_sizes.tobytes(),
            producer_offsets,
            producer_data,
            self.sequence_ids.tobytes(),
            _bits(self.deliver_valid) if deliver_nulls else None,
            deliver_nulls,
            self.deliver_at.tobytes(),
            ordering_valid,
            ordering_nulls,
            ordering_offsets,
            ordering_data,
            schema_valid,
            schema_nulls,
            schema_offsets,
            schema_data,
        )


def _walk(b: Batch, max_members: int, where: str, out: _Out | None, ledger_id: int) -> int:
    """The walk of ``ledger/_batch_codec.c``, in Python: the same checks in the same order, the
    same messages; appends the rows to ``out`` when given. Returns the sum of the record sizes."""
    count = b.num_messages
    if not 0 < count <= max_members:
        raise ValueError(f"{where}a batch of {count} messages")
    buf = memoryview(b.payload).cast("B")
    total = len(buf)
    at = size = 0
    batch_ordering_key = _bytes(b.ordering_key)
    for i in range(count):
        if total - at < 4:
            raise ValueError(f"{where}member {i}: its metadata size is cut off")
        (meta_size,) = _SIZE.unpack_from(buf, at)
        at += 4
        if meta_size > total - at:
            raise ValueError(f"{where}member {i}: its metadata overruns the batch")
        properties: dict[bytes, bytes] = {}
        try:
            m = _member(buf, at, at + meta_size, properties)
        except _Malformed as e:
            raise ValueError(f"{where}member {i}: its metadata does not parse: {e}") from None
        at += meta_size
        payload_size = m.payload_size
        if payload_size is None:
            raise ValueError(f"{where}member {i}: no payload size")
        if payload_size < 0:
            raise ValueError(f"{where}member {i}: a negative payload size")
        if payload_size > total - at:
            raise ValueError(f"{where}member {i}: its payload overruns the batch")
        if m.compacted_out:
            raise ValueError(f"{where}member {i} is marked compacted out")
        if m.event_time > _INT64_MAX:
            raise ValueError(f"{where}member {i}: an event time above 2**63 - 1")
        sequence_id = b.first_sequence_id + i if m.sequence_id is None else m.sequence_id
        if sequence_id > _INT64_MAX:
            raise ValueError(f"{where}member {i}: a sequence id above 2**63 - 1")
        end = at + payload_size
        key = m.key
        size += (0 if m.null else payload_size) + (0 if key is None else len(key))
        if properties:
            size += sum(len(k) + len(v) for k, v in properties.items())
        if out is not None:
            out.key.add(key)
            out.value.add(None if m.null else buf[at:end].tobytes())
            out.tombstones.append(m.null or (payload_size == 0 and key is not None))
            for name, text in properties.items():
                out.name.add(name)
                out.text.add(text)
            out.map_offsets.append(len(out.name.offsets) - 1)
            out.event_times.append(m.event_time)
            out.event_valid.append(m.event_time != 0)
            out.sequence_ids.append(sequence_id)
            out.ordering.add(m.ordering_key if m.ordering_key is not None else batch_ordering_key)
        at = end
    if at != total:
        raise ValueError(f"{where}{total - at} bytes after its members")
    if out is not None:  # what every member of the batch has alike
        out.ledger_ids.extend([ledger_id] * count)
        out.entry_ids.extend(range(b.first_entry, b.first_entry + count))
        out.publish_times.extend([b.publish_time] * count)
        out.batch_indexes.extend(range(count))
        out.batch_sizes.extend([count] * count)
        out.producer.repeat(b.producer_name.encode(), count)
        out.deliver_at.extend([b.deliver_at_time or 0] * count)
        out.deliver_valid += (b"\x00" if b.deliver_at_time is None else b"\x01") * count
        out.schema.repeat(_bytes(b.schema_version), count)
    return size


def member_entries(ledger_id: int, b: Batch) -> list[Entry]:
    """The members of a batch already checked (``check_batch``), as entries, one by one with
    the Python walk's member parser: for a few members, where building Arrow columns costs more
    than the members themselves. The same entries as ``batches_table``'s rows."""
    buf = memoryview(b.payload).cast("B")
    at = 0
    out: list[Entry] = []
    ordering_key = _bytes(b.ordering_key)
    for i in range(b.num_messages):
        (meta_size,) = _SIZE.unpack_from(buf, at)
        at += 4
        properties: dict[bytes, bytes] = {}
        m = _member(buf, at, at + meta_size, properties)
        at += meta_size
        end = at + (m.payload_size or 0)
        out.append(
            Entry(
                ledger_id,
                b.first_entry + i,
                None if m.key is None else m.key.decode(),
                None if m.null else buf[at:end].tobytes(),
                {k.decode(): v.decode() for k, v in properties.items()},
                b.publish_time,
                m.event_time or None,
                i,
                b.num_messages,
                b.producer_name,
                b.first_sequence_id + i if m.sequence_id is None else m.sequence_id,
                b.deliver_at_time,
                m.ordering_key if m.ordering_key is not None else ordering_key,
                _bytes(b.schema_version),
            )
        )
        at = end
    return out


def _bytes(data: bytes | memoryview | None) -> bytes | None:
    return None if data is None else bytes(data)


def _bits(flags: bytearray) -> bytes:
    """Arrow's bitmap of one byte per flag."""
    return np.packbits(np.frombuffer(flags, np.uint8), bitorder="little").tobytes()


# ---- a consumer's batch: members encoded back ----------------------------------------------------

#: An empty slot of a batch: its size, then SingleMessageMetadata{payload_size: 0,
#: compacted_out: true} (a member not sent: acknowledged, compacted out, or in another message).
PLACEHOLDER = b"\x00\x00\x00\x04\x18\x00\x20\x01"


def encode_batch_payload(entries: Iterable[Entry], batch_size: int) -> bytes:
    """The uncompressed payload of a batch of ``batch_size`` members (see the module docstring)
    from ``entries``, members of one stored batch: slot ``i`` holds the entry whose
    ``batch_index`` is ``i`` (the last given, if several are), an empty slot where none is.
    Entries without a batch index, or with one outside the batch, have no slot.

    The C implementation refuses an item of an entry of another type than ``Entry`` declares
    with ``TypeError`` (``UnicodeEncodeError`` for a string that has no UTF-8, as ``str.encode``);
    the Python one raises what its operations on it raise. ``ValueError`` for a negative size."""
    if batch_size < 0:
        raise ValueError(f"a batch of {batch_size} messages")
    if _native is not None:
        payload: bytes = _native.encode(entries, batch_size)
        return payload
    return _encode(entries, batch_size)


def _encode(entries: Iterable[Entry], n: int) -> bytes:
    present = {e.batch_index: e for e in entries if e.batch_index is not None}
    parts: list[bytes] = []
    for i in range(n):
        e = present.get(i)
        if e is None:
            parts.append(PLACEHOLDER)
        else:
            meta = single_metadata(e)
            parts.append(_SIZE.pack(len(meta)))
            parts.append(meta)
            parts.append(e.value or b"")
    return b"".join(parts)


def single_metadata(e: Entry) -> bytes:
    """A batch member's ``SingleMessageMetadata``, serialized: the bytes protobuf writes for it
    (fields in number order), encoded here because a consumer's batches need one per message
    and building a message object for each costs three times as much."""
    parts: list[bytes] = []
    if e.properties:
        for k, v in e.properties.items():
            kb, vb = k.encode(), v.encode()
            pair = b"".join((b"\x0a", _put_varint(len(kb)), kb, b"\x12", _put_varint(len(vb)), vb))
            parts += (b"\x0a", _put_varint(len(pair)), pair)
    key, value = e.key, e.value
    if key is not None:
        kb = key.encode()
        parts += (b"\x12", _put_varint(len(kb)), kb)
    parts += (b"\x18", _put_varint(len(value) if value is not None else 0))
    if e.event_time:
        parts += (b"\x28", _put_varint(e.event_time))
    if e.ordering_key is not None:
        parts += (b"\x3a", _put_varint(len(e.ordering_key)), e.ordering_key)
    if e.sequence_id is not None:
        parts += (b"\x40", _put_varint(e.sequence_id))
    if value is None:
        parts.append(b"\x48\x01")
    return b"".join(parts)


_ONE_BYTE = [bytes([i]) for i in range(0x80)]


def _put_varint(n: int) -> bytes:
    """Protobuf's base-128 varint of ``n`` (a negative as its 64-bit two's complement)."""
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    if 0 < n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if 0 < n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    n &= _MASK64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# ---- a consumer's batches, from a sealed ledger's rows --------------------------------------------

#: One column as ``_batch_codec.encode_rows`` takes it: its length, the offset of its first row
#: in its buffers, its validity bitmap (None: no nulls), its int32 offsets (None for int64) and
#: its data; or None for a column every row of which is null.
_ArrowColumn = tuple[int, int, pa.Buffer | None, pa.Buffer | None, pa.Buffer | bytes] | None

_STRING, _BINARY, _INT64 = pa.string(), pa.binary(), pa.int64()


def encode_row_batches(
    table: pa.Table, starts: np.ndarray | Sequence[int], counts: np.ndarray | Sequence[int]
) -> tuple[list[bytes], list[int]]:
    """The payloads of batches whose members are rows of ``table`` (rows of a ledger, columns of
    ``ARROW_SCHEMA``; those a file from before them lacks are read as nulls): batch ``k`` is rows
    ``starts[k] .. starts[k] + counts[k] - 1``, row ``j`` of it in slot ``j``. Each payload is
    the bytes :func:`encode_batch_payload` writes for the entries ``table_to_entries`` makes of
    those rows (batch index ``j`` on row ``j``); beside the payloads, the sums of the members'
    ``ledger.entry.record_size``.

    The C implementation reads the columns' Arrow buffers and makes no Python object per member
    (a chunked column is combined first: a copy only where a slice spans row groups). Raises
    ``ValueError`` for a batch outside the table's rows, or a property name or value that is
    null (no ledger writes one)."""
    starts = np.ascontiguousarray(starts, np.int64)
    counts = np.ascontiguousarray(counts, np.int64)
    if starts.shape != counts.shape or starts.ndim != 1:
        raise ValueError("starts and counts must be one-dimensional and of one length")
    n = table.num_rows
    if len(starts) and (starts.min() < 0 or counts.min() < 0 or (starts + counts).max() > n):
        raise ValueError(f"batches outside the table's {n} rows")
    if _native is None:
        return _encode_rows(table, starts, counts)
    have = frozenset(table.column_names)  # (a list built anew on every call: look once)
    props, names, texts = _map_columns(table)
    payloads, sizes = _native.encode_rows(
        n,
        _arrow_column(table, have, KEY, _STRING),
        _arrow_column(table, have, VALUE, _BINARY),
        props,
        names,
        texts,
        _arrow_column(table, have, EVENT_TIME, _INT64),
        _arrow_column(table, have, ORDERING_KEY, _BINARY),
        _arrow_column(table, have, SEQUENCE_ID, _INT64),
        starts,
        counts,
    )
    return payloads, sizes


def _encode_rows(table: pa.Table, starts: np.ndarray, counts: np.ndarray) -> tuple[list[bytes], list[int]]:
    """:func:`encode_row_batches` in Python: through entries, as :func:`_encode` writes them."""
    payloads: list[bytes] = []
    sizes: list[int] = []
    for start, count in zip(starts.tolist(), counts.tolist(), strict=True):
        members = table_to_entries(table.slice(start, count))
        slots = [e._replace(batch_index=i) for i, e in enumerate(members)]
        payloads.append(_encode(slots, count))
        sizes.append(sum(e.size() for e in members))
    return payloads, sizes


def _combined(column: pa.ChunkedArray, expected: pa.DataType) -> pa.Array:
    """One array of a column, of the type the encoder reads (a dictionary decoded)."""
    array = column.combine_chunks()  # one chunk: that chunk itself, no copy
    return array if array.type == expected else array.cast(expected)


def _buffers_of(array: pa.Array) -> _ArrowColumn:
    """``array``'s buffers as ``encode_rows`` takes a column (None when every row is null)."""
    n = len(array)
    if n and array.null_count == n:
        return None
    buffers = array.buffers()
    valid = buffers[0] if array.null_count else None
    if len(buffers) == 2:  # a number
        return (n, array.offset, valid, None, buffers[1])
    # A column of empty strings may have no data buffer at all.
    return (n, array.offset, valid, buffers[1], buffers[2] if buffers[2] is not None else b"")


def _arrow_column(table: pa.Table, have: frozenset[str], name: str, expected: pa.DataType) -> _ArrowColumn:
    if name not in have:  # a file from before the column
        return None
    column = table.column(name)
    if column.null_count == table.num_rows:
        return None
    return _buffers_of(_combined(column, expected))


def _map_columns(table: pa.Table) -> tuple[_ArrowColumn, _ArrowColumn, _ArrowColumn]:
    """The properties map as three columns: the map's own (validity and offsets, into the
    pairs), the pairs' names and their values. All None when no row has a property (most)."""
    column = table.column(PROPERTIES)
    if all_empty(column):
        return None, None, None
    array = _combined(column, _PROPERTIES_TYPE)
    valid = array.buffers()[0] if array.null_count else None
    # The pairs as pyarrow's own conversion reads them (MapArray.keys and .items, which the
    # map's offsets index), so that the bytes are what table_to_entries' dicts give.
    return (
        (len(array), array.offset, valid, array.buffers()[1], b""),
        _buffers_of(array.keys) or _all_null_pairs(len(array.keys)),
        _buffers_of(array.items) or _all_null_pairs(len(array.items)),
    )


def _all_null_pairs(n: int) -> _ArrowColumn:
    """Pairs whose names (or values) are all null: the encoder refuses them (as the Python path
    fails on them), rather than take them for an absent column."""
    return (n, 0, pa.py_buffer(bytes((n + 7) // 8)), pa.py_buffer(bytes(4 * (n + 1))), b"")
