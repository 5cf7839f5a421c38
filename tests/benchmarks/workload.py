"""Synthetic topics for the benchmarks, written as sealed ledgers by the project's own code.

``generate(topic_root, spec)`` writes ``spec.messages`` messages over ``spec.keys`` keys as
sealed original ledgers (``ledger.parquet_store.seal_table``: zstd Parquet, temporary name,
fsync, rename), ``spec.entries_per_ledger`` entries each (the service's default roll-over,
50,000), ledger ids ``first_ledger_id``, ``first_ledger_id + 1``, ... One ledger is built and
written at a time, so memory stays bounded whatever the size.

Each message: ``key-{i}`` with ``i`` drawn uniformly from ``[0, keys)`` (seeded), so a key has
about ``messages / keys`` versions; a value of ``value_bytes`` random (incompressible) bytes,
or a tombstone (null value) with probability ``tombstone_share``; no properties (an empty
map); ``publish_time`` increasing; no event time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledger.entry import Position
from ledger.parquet_store import seal_table
from ledger.paths import sealed_path
from ledger.schema import (
    ARROW_SCHEMA,
    ENTRY_ID,
    EVENT_TIME,
    IS_TOMBSTONE,
    KEY,
    LEDGER_ID,
    PROPERTIES,
    PUBLISH_TIME,
    VALUE,
)

DEFAULT_ENTRIES_PER_LEDGER = 50_000  # the service's maxEntriesPerLedger default
BASE_PUBLISH_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class WorkloadSpec:
    """What to generate: ``messages`` over ``keys`` keys, ``value_bytes``-byte values."""

    messages: int
    keys: int
    value_bytes: int = 100
    tombstone_share: float = 0.05
    entries_per_ledger: int = DEFAULT_ENTRIES_PER_LEDGER
    seed: int = 42

    @property
    def label(self) -> str:
        return f"{_short(self.messages)}/{_short(self.keys)}"


@dataclass(frozen=True)
class Workload:
    """Sealed ledgers written for a spec: ``ledgers`` is ``(ledger_id, path)`` in id order."""

    spec: WorkloadSpec
    topic_root: Path
    ledgers: list[tuple[int, Path]]
    horizon: Position
    messages: int
    parquet_bytes: int  # size of the sealed Parquet files on disk
    payload_bytes: int  # raw key + value bytes of the messages (what a producer sent)

    @property
    def paths(self) -> list[Path]:
        return [p for _, p in self.ledgers]

    @property
    def ledger_ids(self) -> list[int]:
        return [i for i, _ in self.ledgers]


def _short(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div and n % (div // 10) == 0:
            q = n / div
            return f"{q:g}{unit}"
    return str(n)


def key_dictionary(keys: int) -> pa.Array:
    """``key-0`` .. ``key-{keys-1}`` as one Arrow string array (indexed by key number)."""
    numbers = pc.cast(pa.array(np.arange(keys, dtype=np.int64)), pa.string())
    return pc.binary_join_element_wise(pa.scalar("key-"), numbers, "")


def _values(rng: np.random.Generator, tomb: np.ndarray, value_bytes: int) -> pa.Array:
    """A binary array: ``value_bytes`` random bytes per row, null where ``tomb``."""
    n = len(tomb)
    lengths = np.where(tomb, 0, value_bytes).astype(np.int32)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = rng.bytes(int(offsets[-1]))
    validity = np.packbits(~tomb, bitorder="little")
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=int(tomb.sum()),
    )


def _empty_maps(n: int) -> pa.Array:
    offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
    return pa.MapArray.from_arrays(offsets, pa.array([], pa.string()), pa.array([], pa.string()))


def ledger_table(
    rng: np.random.Generator,
    keys: pa.Array,
    ledger_id: int,
    n: int,
    *,
    first_publish_time: int,
    value_bytes: int,
    tombstone_share: float,
) -> pa.Table:
    """One sealed ledger's rows (entries ``0..n-1``) in ``ARROW_SCHEMA``."""
    key_idx = rng.integers(0, len(keys), size=n, dtype=np.int64)
    tomb = rng.random(n) < tombstone_share
    return pa.table(
        {
            LEDGER_ID: pa.array(np.full(n, ledger_id, dtype=np.int64)),
            ENTRY_ID: pa.array(np.arange(n, dtype=np.int64)),
            KEY: keys.take(pa.array(key_idx)),
            VALUE: _values(rng, tomb, value_bytes),
            IS_TOMBSTONE: pa.array(tomb),
            PROPERTIES: _empty_maps(n),
            PUBLISH_TIME: pa.array(first_publish_time + np.arange(n, dtype=np.int64) // 10),
            EVENT_TIME: pa.nulls(n, pa.int64()),
        },
        schema=ARROW_SCHEMA,
    )


def generate(
    topic_root: Path,
    spec: WorkloadSpec,
    *,
    first_ledger_id: int = 1,
    key_dict: pa.Array | None = None,
) -> Workload:
    """Write ``spec`` as sealed ledgers under ``topic_root`` (created if missing).

    ``first_ledger_id`` > 1 appends to an existing topic (the incremental round adds a ledger
    this way); the seed is mixed with it so appended ledgers draw fresh keys and values.
    """
    topic_root = Path(topic_root)
    topic_root.mkdir(parents=True, exist_ok=True)
    keys = key_dict if key_dict is not None else key_dictionary(spec.keys)
    rng = np.random.default_rng([spec.seed, first_ledger_id])
    ledgers: list[tuple[int, Path]] = []
    parquet_bytes = payload_bytes = 0
    remaining = spec.messages
    ledger_id = first_ledger_id
    publish_time = BASE_PUBLISH_TIME_MS + (first_ledger_id - 1) * spec.entries_per_ledger
    last = Position(ledger_id, 0)
    while remaining > 0:
        n = min(spec.entries_per_ledger, remaining)
        table = ledger_table(
            rng,
            keys,
            ledger_id,
            n,
            first_publish_time=publish_time,
            value_bytes=spec.value_bytes,
            tombstone_share=spec.tombstone_share,
        )
        payload_bytes += int(pc.sum(pc.binary_length(table.column(KEY))).as_py() or 0)
        payload_bytes += int(n - table.column(VALUE).null_count) * spec.value_bytes
        path = sealed_path(topic_root, ledger_id)
        info = seal_table(table, path)
        parquet_bytes += info.file_bytes
        ledgers.append((ledger_id, path))
        last = Position(ledger_id, n - 1)
        remaining -= n
        publish_time += n
        ledger_id += 1
    return Workload(
        spec=spec,
        topic_root=topic_root,
        ledgers=ledgers,
        horizon=last,
        messages=spec.messages,
        parquet_bytes=parquet_bytes,
        payload_bytes=payload_bytes,
    )
