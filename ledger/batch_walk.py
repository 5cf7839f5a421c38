"""The walk of ``ledger/_batch_codec.c`` in Python, where the extension cannot be imported (not
compiled at install; a Spark executor, which imports this package from a zip): the same checks
in the same order, the same messages, the same buffers (see :mod:`ledger.batch_codec`). Also
:func:`member_entries`, a few members as entries with its member parser.
"""

from __future__ import annotations

from array import array

import numpy as np

from ledger.batch_codec import INT64_MAX, MASK64, METADATA_SIZE, OFFSET_LIMIT, Batch, Columns
from ledger.entry import Entry


class _Malformed(Exception):
    """A reason a member's metadata does not parse."""


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
            return value & MASK64, at
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
        if len(self.data) > OFFSET_LIMIT:
            raise ValueError("the batches hold more than 2 GiB in one column")
        valid, nulls = None, 0
        if self.valid is not None:
            nulls = len(self.valid) - sum(self.valid)
            valid = _bits(self.valid) if nulls else None
        return valid, nulls, self.offsets.tobytes(), bytes(self.data)


class Out:
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

    def columns(self) -> Columns:
        key_valid, key_nulls, key_offsets, key_data = self.key.buffers()
        value_valid, value_nulls, value_offsets, value_data = self.value.buffers()
        _, _, name_offsets, name_data = self.name.buffers()
        _, _, text_offsets, text_data = self.text.buffers()
        _, _, producer_offsets, producer_data = self.producer.buffers()
        ordering_valid, ordering_nulls, ordering_offsets, ordering_data = self.ordering.buffers()
        schema_valid, schema_nulls, schema_offsets, schema_data = self.schema.buffers()
        event_nulls = len(self.event_valid) - sum(self.event_valid)
        deliver_nulls = len(self.deliver_valid) - sum(self.deliver_valid)
        return Columns(
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


def walk(b: Batch, max_members: int, where: str, out: Out | None, ledger_id: int) -> int:
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
        (meta_size,) = METADATA_SIZE.unpack_from(buf, at)
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
        if m.event_time > INT64_MAX:
            raise ValueError(f"{where}member {i}: an event time above 2**63 - 1")
        sequence_id = b.first_sequence_id + i if m.sequence_id is None else m.sequence_id
        if sequence_id > INT64_MAX:
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
        (meta_size,) = METADATA_SIZE.unpack_from(buf, at)
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
