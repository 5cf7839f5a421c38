"""Pulsar batches decoded into Arrow columns (see :mod:`ledger.batch_codec` for the layout and
what is refused): checked on the produce path (:func:`check_batch`), made into rows of
``ledger.schema.ARROW_SCHEMA`` when a ledger is sealed (:func:`batch_table`, or
:func:`batches_table` for many batches in one table), by the C extension or the Python walk
(:mod:`ledger.batch_walk`), whichever is in use."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from ledger import batch_codec
from ledger.batch_codec import INT64_MAX, INT64_MIN, OFFSET_LIMIT, Batch, Columns
from ledger.batch_walk import Out, walk
from ledger.schema import ARROW_SCHEMA, PROPERTIES

#: A batch may not claim more members than this (the clients' default is 1,000 messages).
MAX_MEMBERS = 100_000
# What a stored batch may have when it is made into rows (checked against MAX_MEMBERS or the
# caller's limit when it was produced: sealing does not refuse what was accepted).
_NO_LIMIT = 2**31 - 1


def check_batch(
    payload: bytes | memoryview,
    count: int,
    max_members: int = MAX_MEMBERS,
    *,
    first_sequence_id: int = 0,
) -> int:
    """Validates an uncompressed batch payload of ``count`` members (see :mod:`ledger.batch_codec`)
    and returns the sum of the members' ``ledger.entry.record_size``: key, value (none for a
    ``null_value`` member) and property names and values, in bytes. ``first_sequence_id`` is the
    batch's (its MessageMetadata's): a member without one of its own is numbered from it, and
    must stay within int64. Raises ``ValueError(reason)`` for a malformed batch."""
    if not 0 < count <= max_members:
        raise ValueError(f"a batch of {count} messages")
    if not INT64_MIN <= first_sequence_id <= INT64_MAX:
        raise ValueError(f"a first sequence id of {first_sequence_id}")
    if batch_codec.native_codec is not None:
        return int(batch_codec.native_codec.check(payload, count, max_members, first_sequence_id))
    batch = Batch(0, count, payload, 0, "", first_sequence_id, None, None, None)
    return walk(batch, max_members, "", None, 0)


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
    if not INT64_MIN <= first_sequence_id <= INT64_MAX:
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


# One table per run of batches whose variable-width columns fit int32 offsets
# (``ledger.batch_codec.OFFSET_LIMIT``).
_COLUMN_LIMIT = OFFSET_LIMIT


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


def _decode(ledger_id: int, batches: Sequence[Batch], max_members: int) -> Columns:
    if batch_codec.native_codec is not None:
        return Columns._make(batch_codec.native_codec.decode(ledger_id, batches, max_members))
    out = Out()
    for b in batches:
        where = f"the batch at entry {b.first_entry}: " if len(batches) > 1 else ""
        out.size += walk(b, max_members, where, out, ledger_id)
    return out.columns()


_PROPERTIES_TYPE = ARROW_SCHEMA.field(PROPERTIES).type
_ENTRY_FIELDS = [_PROPERTIES_TYPE.key_field, _PROPERTIES_TYPE.item_field]


def _buffers(*data: bytes | None) -> list[pa.Buffer | None]:
    return [None if d is None else pa.py_buffer(d) for d in data]


def _table(c: Columns) -> pa.Table:
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
