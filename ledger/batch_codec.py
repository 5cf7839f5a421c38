"""Interim pure-Python decoding of a Pulsar batch's members (replaced by the bulk decoder)."""

from __future__ import annotations

import struct

import pyarrow as pa

from ledger.entry import Record, record_size
from ledger.schema import records_to_table

_SIZE = struct.Struct(">I")


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
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


def _members(payload: bytes | memoryview, count: int, max_members: int) -> list[tuple]:  # type: ignore[type-arg]
    if not 0 < count <= max_members:
        raise ValueError(f"a batch of {count} messages")
    view = memoryview(payload)
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


def check_batch(payload: bytes | memoryview, count: int, max_members: int = 100_000) -> int:
    return sum(record_size(k, v, p) for k, v, p, *_ in _members(payload, count, max_members))


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
) -> pa.Table:
    records = [
        Record(
            k,
            v,
            p,
            publish_time,
            et or None,
            i,
            count,
            producer_name,
            seq if seq is not None else first_sequence_id + i,
            deliver_at_time,
            ok if ok is not None else ordering_key,
            schema_version,
        )
        for i, (k, v, p, et, seq, ok) in enumerate(_members(payload, count, 2**31))
    ]
    return records_to_table(ledger_id, records, first_entry)
