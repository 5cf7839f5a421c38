"""Pulsar batches encoded for consumers, the way back of :mod:`ledger.batch_decoder`
(:func:`encode_batch_payload`): stored members (``ledger.entry.Entry``) encoded as
such a payload again, for a consumer (``api.pulsar.messages.batch_message``), member ``i`` in slot
``i``, and in a slot without a member an empty one (``PLACEHOLDER``: ``payload_size`` 0 and
``compacted_out``, which the consumer's ``ack_set`` leaves out). Each member's
SingleMessageMetadata is what protobuf writes for it (fields in number order: properties in the
dict's order, key, payload size, event time when not 0, ordering key, sequence id, ``null_value``
for a null value; a negative int as its 64-bit two's complement).

:func:`encode_row_batches` writes the same bytes for batches whose members are rows of a sealed
ledger (a ``pyarrow.Table`` slice), straight from the columns' Arrow buffers: a consumer's read of
a sealed ledger makes no Python object per member.

Each in C (``ledger/_batch_codec.c``) or, where the extension is not in use (see
:mod:`ledger.batch_codec`), in Python: :func:`_encode` and :func:`_encode_rows`, the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

from ledger import batch_codec
from ledger.batch_codec import MASK64, METADATA_SIZE
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

_PROPERTIES_TYPE = ARROW_SCHEMA.field(PROPERTIES).type

#: An empty slot of a batch: its size, then SingleMessageMetadata{payload_size: 0,
#: compacted_out: true} (a member not sent: acknowledged, compacted out, or in another message).
PLACEHOLDER = b"\x00\x00\x00\x04\x18\x00\x20\x01"


def encode_batch_payload(entries: Iterable[Entry], batch_size: int) -> bytes:
    """The uncompressed payload of a batch of ``batch_size`` members (see :mod:`ledger.batch_codec`)
    from ``entries``, members of one stored batch: slot ``i`` holds the entry whose
    ``batch_index`` is ``i`` (the last given, if several are), an empty slot where none is.
    Entries without a batch index, or with one outside the batch, have no slot.

    The C implementation refuses an item of an entry of another type than ``Entry`` declares
    with ``TypeError`` (``UnicodeEncodeError`` for a string that has no UTF-8, as ``str.encode``);
    the Python one raises what its operations on it raise. ``ValueError`` for a negative size."""
    if batch_size < 0:
        raise ValueError(f"a batch of {batch_size} messages")
    if batch_codec.native_codec is not None:
        payload: bytes = batch_codec.native_codec.encode(entries, batch_size)
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
            parts.append(METADATA_SIZE.pack(len(meta)))
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
    n &= MASK64
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
    if batch_codec.native_codec is None:
        return _encode_rows(table, starts, counts)
    have = frozenset(table.column_names)  # (a list built anew on every call: look once)
    props, names, texts = _map_columns(table)
    payloads, sizes = batch_codec.native_codec.encode_rows(
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
