"""The members of a Pulsar batch, decoded and encoded in bulk: checked on the produce path and
made into rows of ``ledger.schema.ARROW_SCHEMA`` when a ledger is sealed
(:mod:`ledger.batch_decoder`), encoded back for a consumer (:mod:`ledger.batch_encoder`). This
module holds what they share: the layout below, which implementation is in use, the stored
batch a walk reads (:class:`Batch`) and the columns it fills (:class:`Columns`).

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

Two implementations: the C extension ``ledger._batch_codec`` (``ledger/_batch_codec.c``) and,
where it cannot be imported (not compiled at install; a Spark executor, which imports this
package from a zip), the same walk in Python (:mod:`ledger.batch_walk`): the same checks in the
same order, the same messages, the same buffers, some 50 times slower (and
:func:`ledger.batch_encoder._encode`, the same bytes, some 30 times slower). :func:`native` says
which one is in use; ``COMPACTOR_BATCH_CODEC=python`` in the environment makes a process use the
Python one, and tests switch with :func:`use_native`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

try:
    from ledger import _batch_codec as _extension
except ImportError:  # no compiler at install, or imported from a zip
    _extension = None  # type: ignore[assignment]

#: The C extension while it is in use; None: the Python walk serves.
native_codec: Any = None if os.environ.get("COMPACTOR_BATCH_CODEC") == "python" else _extension

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
# The data of a variable-width column (int32 offsets) stays below this: one table per run of
# batches that fits (``ledger.batch_decoder._COLUMN_LIMIT``), and an error if one does not.
OFFSET_LIMIT = 2**31 - 1
#: A member's ``metadata_size`` (see the layout above).
METADATA_SIZE = struct.Struct(">I")
MASK64 = 2**64 - 1


def native() -> bool:
    """Whether the C implementation is in use."""
    return native_codec is not None


@contextmanager
def use_native(on: bool) -> Iterator[None]:
    """Within the block, the C implementation (``on``, which needs it built) or the Python one."""
    global native_codec
    if on and _extension is None:
        raise RuntimeError("ledger._batch_codec is not built")
    before, native_codec = native_codec, (_extension if on else None)
    try:
        yield
    finally:
        native_codec = before


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


class Columns(NamedTuple):
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
