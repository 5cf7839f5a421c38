"""Stored Pulsar batches (:class:`ledger.entry.StoredBatch`) as rows and entries, in bulk.

A batch is stored as its producer sent it; its members become rows only where rows are needed:
when its ledger is sealed to Parquet and when a read of its open ledger asks for entries (both
through :func:`appended_table`, which decodes consecutive batches in one walk of
``ledger.batch_codec``), never one Python object per member on the way in.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ledger import batch_codec
from ledger.entry import Entry, Record, StoredBatch
from ledger.schema import records_to_table, table_to_entries

_SIZE = struct.Struct(">I")
# Pulsar's CompressionType numbers, by the codec that inflates each (pyarrow's raw LZ4 block,
# raw Snappy and zstd frames are the formats Pulsar's clients write; ZLIB is the zlib format).
NONE, LZ4, ZLIB, ZSTD, SNAPPY = 0, 1, 2, 3, 4
_CODECS = {LZ4: "lz4_raw", SNAPPY: "snappy", ZSTD: "zstd"}


class BatchError(ValueError):
    """A batch that does not decode (its payload, or a member)."""


def uncompressed(compression: int, payload: bytes, size: int, max_size: int) -> bytes:
    """The payload of a message or batch as its producer wrote it before compressing it.
    ``size`` is the uncompressed size the producer declared; ``max_size`` bounds it."""
    if compression == NONE:
        return payload
    if size > max_size:
        raise BatchError(f"the payload expands to {size} bytes, above {max_size}")
    try:
        if compression == ZLIB:
            d = zlib.decompressobj()
            out = d.decompress(payload, size)
            if d.unconsumed_tail:
                raise ValueError("longer than its uncompressed size")
        else:
            codec = _CODECS.get(compression)
            if codec is None:
                raise ValueError(f"unknown compression {compression}")
            out = pa.decompress(payload, decompressed_size=size, codec=codec, asbytes=True)
    except (ValueError, OSError, zlib.error, pa.ArrowException) as e:
        raise BatchError(f"the payload does not decompress: {e}") from e
    if len(out) != size:
        raise BatchError(f"the payload decompresses to {len(out)} bytes, not {size}")
    return bytes(out)


def batch_size(batch: StoredBatch, max_size: int, max_members: int) -> int:
    """Check ``batch``'s members (their layout, as Pulsar's clients write it) and return their
    payload bytes (``record_size`` summed); :class:`BatchError` if it does not decode."""
    data = uncompressed(batch.compression, batch.payload, batch.uncompressed_size, max_size)
    try:
        # With the batch's first sequence id: members numbered from it must stay within int64.
        return batch_codec.check_batch(data, batch.count, max_members, first_sequence_id=batch.sequence_id)
    except ValueError as e:
        raise BatchError(f"malformed batch: {e}") from e


def batch_table(ledger_id: int, first_entry: int, batch: StoredBatch) -> pa.Table:
    """The rows of ``batch``'s members, entries ``first_entry``.. of ledger ``ledger_id``."""
    return batch_codec.batches_table(ledger_id, [_decodable(first_entry, batch)])


def _decodable(first_entry: int, batch: StoredBatch) -> batch_codec.Batch:
    data = uncompressed(batch.compression, batch.payload, batch.uncompressed_size, 2**62)
    return batch_codec.Batch(
        first_entry,
        batch.count,
        data,
        batch.publish_time,
        batch.producer_name,
        batch.sequence_id,
        batch.deliver_at_time,
        batch.ordering_key,
        batch.schema_version,
    )


# A read of fewer members than this decodes them one by one: building Arrow columns costs
# about 0.1 ms a read whatever its size, ten times a small batch's members decoded in Python.
SMALL_READ = 64


def small_batch_entries(ledger_id: int, first_entry: int, batch: StoredBatch) -> list[Entry]:
    """``batch``'s members as entries, decoded one by one (for a small batch: see
    :data:`SMALL_READ`); the same entries as :func:`batch_entries`."""
    data = memoryview(uncompressed(batch.compression, batch.payload, batch.uncompressed_size, 2**62))
    out: list[Entry] = []
    for i, (key, value, props, event_time, seq, ordering) in enumerate(_members(data, batch.count)):
        out.append(
            Entry(
                ledger_id,
                first_entry + i,
                key,
                value,
                props,
                batch.publish_time,
                event_time or None,
                i,
                batch.count,
                batch.producer_name,
                seq if seq is not None else batch.sequence_id + i,
                batch.deliver_at_time,
                ordering if ordering is not None else batch.ordering_key,
                batch.schema_version,
            )
        )
    return out


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """Protobuf's base-128 varint at ``pos``; returns it and where the next field starts."""
    result = shift = 0
    while True:
        if pos >= end:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _members(view: memoryview, count: int) -> list[tuple]:  # type: ignore[type-arg]
    """Each member of a batch checked at produce time (``batch_codec.check_batch``) as
    ``(key, value, properties, event_time, sequence_id, ordering_key)``, by a plain walk of
    their ``SingleMessageMetadata`` (unknown fields skipped)."""
    total = len(view)
    at = 0
    out = []
    for i in range(count):
        if at + 4 > total:
            raise ValueError("a member's size overruns the batch")
        (size,) = _SIZE.unpack_from(view, at)
        at += 4
        end = at + size
        if end > total:
            raise ValueError("a member's metadata overruns the batch")
        props: dict[str, str] = {}
        key = ordering = None
        payload_size = None
        compacted = null_value = False
        event_time = 0
        seq = None
        pos = at
        while pos < end:
            tag, pos = _varint(view, pos, end)
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                v, pos = _varint(view, pos, end)
                if field == 3:
                    payload_size = v if v < 2**31 else v - 2**64
                elif field == 4:
                    compacted = bool(v)
                elif field == 5:
                    event_time = v
                elif field == 8:
                    seq = v
                elif field == 9:
                    null_value = bool(v)
            elif wire == 2:
                n, pos = _varint(view, pos, end)
                if pos + n > end:
                    raise ValueError("a field overruns a member's metadata")
                chunk = view[pos : pos + n]
                pos += n
                if field == 2:
                    key = str(chunk, "utf-8")
                elif field == 7:
                    ordering = bytes(chunk)
                elif field == 1:
                    p, q, kv = 0, len(chunk), ["", ""]
                    while p < q:
                        t, p = _varint(chunk, p, q)
                        if t & 7 != 2:
                            raise ValueError("bad property")
                        m, p = _varint(chunk, p, q)
                        if p + m > q:
                            raise ValueError("a property overruns")
                        if (t >> 3) in (1, 2):
                            kv[(t >> 3) - 1] = str(chunk[p : p + m], "utf-8")
                        p += m
                    props[kv[0]] = kv[1]
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise ValueError(f"wire type {wire}")
            if pos > end:
                raise ValueError("a field overruns a member's metadata")
        if payload_size is None or payload_size < 0:
            raise ValueError("a member without its payload size")
        if compacted:
            raise ValueError(f"member {i} is marked compacted out")
        at = end
        end = at + payload_size
        if end > total:
            raise ValueError("a member's payload overruns the batch")
        out.append((key, None if null_value else bytes(view[at:end]), props, event_time, seq, ordering))
        at = end
    if at != total:
        raise ValueError(f"{total - at} bytes after its members")
    return out




def batch_entries(ledger_id: int, first_entry: int, batch: StoredBatch) -> list[Entry]:
    """``batch``'s members as entries."""
    return table_to_entries(batch_table(ledger_id, first_entry, batch))


def appended_table(
    ledger_id: int, items: Sequence[Record | Entry | StoredBatch], first_entry: int = 0
) -> pa.Table:
    """The rows of a ledger whose entries from ``first_entry`` on are ``items`` (records,
    entries read back, and whole batches), in order. Consecutive batches make one table in one
    walk (``batch_codec.batches_table``): most of a small batch's cost would be a table of its own."""
    tables: list[pa.Table] = []
    run: list[Any] = []  # records, or entries read back: rows alike
    batches: list[batch_codec.Batch] = []
    at = run_start = first_entry
    for item in items:
        if type(item) is StoredBatch:
            if run:
                tables.append(records_to_table(ledger_id, run, run_start))
                run = []
            batches.append(_decodable(at, item))
            at += item.count
            run_start = at
        else:
            if batches:
                tables.append(batch_codec.batches_table(ledger_id, batches))
                batches = []
            run.append(item)
            at += 1
    if batches:
        tables.append(batch_codec.batches_table(ledger_id, batches))
    if run or not tables:
        tables.append(records_to_table(ledger_id, run, run_start))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
