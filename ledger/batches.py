"""Stored Pulsar batches (:class:`ledger.entry.StoredBatch`) as rows and entries, in bulk.

A batch is stored as its producer sent it; its members become rows only where rows are needed:
when its ledger is sealed to Parquet and when a read of its open ledger asks for entries (both
through :func:`appended_table`, which decodes consecutive batches in one walk of
``ledger.batch_decoder``), never one Python object per member on the way in.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ledger import batch_codec, batch_decoder, batch_walk
from ledger.entry import Entry, Record, StoredBatch
from ledger.schema import records_to_table, table_to_entries

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
        return batch_decoder.check_batch(data, batch.count, max_members, first_sequence_id=batch.sequence_id)
    except ValueError as e:
        raise BatchError(f"malformed batch: {e}") from e


def batch_table(ledger_id: int, first_entry: int, batch: StoredBatch) -> pa.Table:
    """The rows of ``batch``'s members, entries ``first_entry``.. of ledger ``ledger_id``."""
    return batch_decoder.batches_table(ledger_id, [_decodable(first_entry, batch)])


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
    return batch_walk.member_entries(ledger_id, _decodable(first_entry, batch))


def batch_entries(ledger_id: int, first_entry: int, batch: StoredBatch) -> list[Entry]:
    """``batch``'s members as entries."""
    return table_to_entries(batch_table(ledger_id, first_entry, batch))


def appended_table(
    ledger_id: int, items: Sequence[Record | Entry | StoredBatch], first_entry: int = 0
) -> pa.Table:
    """The rows of a ledger whose entries from ``first_entry`` on are ``items`` (records,
    entries read back, and whole batches), in order. Consecutive batches make one table in one
    walk (``batch_decoder.batches_table``): most of a small batch's cost would be a table of its own."""
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
                tables.append(batch_decoder.batches_table(ledger_id, batches))
                batches = []
            run.append(item)
            at += 1
    if batches:
        tables.append(batch_decoder.batches_table(ledger_id, batches))
    if run or not tables:
        tables.append(records_to_table(ledger_id, run, run_start))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
