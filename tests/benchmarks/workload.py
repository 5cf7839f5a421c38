"""Synthetic topics for the benchmarks, written as sealed ledgers by the project's own code.

``generate(topic_root, spec)`` writes ``spec.messages`` messages over ``spec.keys`` keys as
sealed original ledgers (``ledger.parquet_store.seal_table``: LZ4 Parquet, temporary name,
fsync, rename), ``spec.entries_per_ledger`` entries each (the service's default roll-over,
50,000), ledger ids ``first_ledger_id``, ``first_ledger_id + 1``, ... One ledger is built and
written at a time, so memory stays bounded whatever the size.

Each message (the defaults): ``key-{i}`` with ``i`` drawn uniformly from ``[0, keys)``
(seeded), so a key has about ``messages / keys`` versions; a value of ``value_bytes`` random
(incompressible) bytes, or a tombstone (null value) with probability ``tombstone_share``; no
properties (an empty map); ``publish_time`` increasing; no event time.

The *shape* fields change one thing each (``tests.benchmarks.shapes`` names the shapes):
``key_bytes`` makes every key ``(lo, hi)`` bytes long (a random length in that range, the
number at its end); ``properties`` gives every message that many properties (a service name
out of 8, a 16-hex-digit trace id of its own, a schema version out of 3, then ``prop-{j}``
values out of 8); ``keyless_share`` leaves that share of the messages without a key;
``key_skew`` > 0 draws key numbers from a Zipf law of that exponent (folded into ``[0, keys)``)
instead of uniformly; ``unique_keys`` gives every message a key of its own (``keys`` is then
ignored: message ``n`` of the topic has key number ``n``).
"""

from __future__ import annotations

import dataclasses
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
    BATCH_INDEX,
    BATCH_SIZE,
    DELIVER_AT_TIME,
    ENTRY_ID,
    EVENT_TIME,
    IS_TOMBSTONE,
    KEY,
    LEDGER_ID,
    ORDERING_KEY,
    PRODUCER_NAME,
    PROPERTIES,
    PUBLISH_TIME,
    SCHEMA_VERSION,
    SEQUENCE_ID,
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
    key_bytes: tuple[int, int] | None = None
    properties: int = 0
    keyless_share: float = 0.0
    key_skew: float = 0.0
    unique_keys: bool = False

    @property
    def label(self) -> str:
        return f"{_short(self.messages)}/{_short(self.keys)}"

    @property
    def key_count(self) -> int:
        """How many distinct key numbers can be drawn."""
        return self.messages if self.unique_keys else self.keys


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


def key_dictionary(keys: int, key_bytes: tuple[int, int] | None = None, seed: int = 42) -> pa.Array:
    """``key-0`` .. ``key-{keys-1}`` as one Arrow string array (indexed by key number); with
    ``key_bytes=(lo, hi)``, each key padded in front to a random length in ``[lo, hi]`` with
    text cut from one random lowercase string (the number at the end keeps keys unique)."""
    numbers = pc.cast(pa.array(np.arange(keys, dtype=np.int64)), pa.string())
    if key_bytes is None:
        return pc.binary_join_element_wise(pa.scalar("key-"), numbers, "")
    lo, hi = key_bytes
    rng = np.random.default_rng([seed, 7])
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz/._-", dtype=np.uint8)
    text = alphabet[rng.integers(0, len(alphabet), size=2 * hi)].tobytes().decode()
    lengths = rng.integers(lo, hi + 1, size=keys)
    pad_len = np.maximum(lengths - 1 - pc.utf8_length(numbers).to_numpy(), 0)
    starts = rng.integers(0, hi, size=keys)
    pads = [text[a : a + n] for a, n in zip(starts.tolist(), pad_len.tolist(), strict=True)]
    return pc.binary_join_element_wise(pa.array(pads, pa.string()), numbers, "-")


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


_SERVICES = pa.array([f"svc-{i}" for i in range(8)], pa.string())
_SCHEMAS = pa.array(["v1", "v2", "v3"], pa.string())
_OTHERS = pa.array([f"value-{i}" for i in range(8)], pa.string())


def _properties(rng: np.random.Generator, n: int, count: int) -> pa.Array:
    """``count`` properties per row (see the module docstring), as a map array."""
    if count <= 0:
        return _empty_maps(n)
    names = ["source", "trace-id", "schema"][:count] + [f"prop-{j}" for j in range(3, count)]
    columns: list[pa.Array] = []
    for j in range(count):
        if j == 1:
            hexes = np.char.mod("%016x", rng.integers(0, 2**63, size=n, dtype=np.int64))
            columns.append(pa.array(hexes.astype(object), pa.string()))
        else:
            choices = _SERVICES if j == 0 else _SCHEMAS if j == 2 else _OTHERS
            columns.append(choices.take(pa.array(rng.integers(0, len(choices), size=n))))
    # Row-major: row r's properties are items r*count .. r*count+count-1.
    order = np.arange(n * count).reshape(count, n).T.reshape(-1)
    items = pa.concat_arrays(columns).take(pa.array(order))
    keys = pa.array(np.tile(np.array(names, dtype=object), n), pa.string())
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * count)
    return pa.MapArray.from_arrays(offsets, keys, items)


def _key_numbers(rng: np.random.Generator, spec: WorkloadSpec, n: int, first_message: int) -> np.ndarray:
    if spec.unique_keys:
        return np.arange(first_message, first_message + n, dtype=np.int64) % spec.key_count
    if spec.key_skew > 0:
        # Zipf ranks from 1; rank r is key number r - 1, folded into range.
        return (rng.zipf(spec.key_skew, size=n).astype(np.int64) - 1) % spec.keys
    return rng.integers(0, spec.keys, size=n, dtype=np.int64)


def ledger_table(
    rng: np.random.Generator,
    keys: pa.Array,
    ledger_id: int,
    n: int,
    *,
    first_publish_time: int,
    value_bytes: int,
    tombstone_share: float,
    spec: WorkloadSpec | None = None,
    first_message: int = 0,
) -> pa.Table:
    """One sealed ledger's rows (entries ``0..n-1``) in ``ARROW_SCHEMA``; ``spec``'s shape
    fields (if given) shape the keys and properties, ``first_message`` is the topic's message
    number of entry 0 (for unique keys)."""
    spec = spec or WorkloadSpec(n, len(keys), value_bytes=value_bytes, tombstone_share=tombstone_share)
    key_idx = _key_numbers(rng, spec, n, first_message)
    tomb = rng.random(n) < tombstone_share
    key_column = keys.take(pa.array(key_idx))
    if spec.keyless_share > 0:
        keyless = rng.random(n) < spec.keyless_share
        key_column = pc.if_else(pa.array(keyless), pa.scalar(None, pa.string()), key_column)
    return pa.table(
        {
            LEDGER_ID: pa.array(np.full(n, ledger_id, dtype=np.int64)),
            ENTRY_ID: pa.array(np.arange(n, dtype=np.int64)),
            KEY: key_column,
            VALUE: _values(rng, tomb, value_bytes),
            IS_TOMBSTONE: pa.array(tomb),
            PROPERTIES: _properties(rng, n, spec.properties),
            PUBLISH_TIME: pa.array(first_publish_time + np.arange(n, dtype=np.int64) // 10),
            EVENT_TIME: pa.nulls(n, pa.int64()),
            BATCH_INDEX: pa.nulls(n, pa.int32()),
            BATCH_SIZE: pa.nulls(n, pa.int32()),
            PRODUCER_NAME: pa.nulls(n, pa.string()),
            SEQUENCE_ID: pa.nulls(n, pa.int64()),
            DELIVER_AT_TIME: pa.nulls(n, pa.int64()),
            ORDERING_KEY: pa.nulls(n, pa.binary()),
            SCHEMA_VERSION: pa.nulls(n, pa.binary()),
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
    keys = key_dict if key_dict is not None else key_dictionary(spec.key_count, spec.key_bytes, spec.seed)
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
            spec=spec,
            first_message=spec.messages - remaining,
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


# ---------------------------------------------------------------- shapes of data (issue 28)

BASE = WorkloadSpec(2_000_000, 200_000)
QUICK_BASE = WorkloadSpec(200_000, 20_000)


@dataclass(frozen=True)
class Shape:
    """A named shape of data: the ``shapes`` benchmark section and the shape tests use them."""

    name: str
    describe: str
    spec: WorkloadSpec


def shapes(base: WorkloadSpec = BASE) -> list[Shape]:
    """The shapes, each ``base`` with one thing changed."""
    r = dataclasses.replace
    return [
        Shape("base", "short keys (`key-N`), 100-byte values", base),
        Shape(
            "long keys + properties",
            "keys of 100-200 bytes, 4 properties on every message",
            r(base, key_bytes=(100, 200), properties=4),
        ),
        Shape("big values", "4 KB values", r(base, value_bytes=4096)),
        Shape("keyless fifth", "a fifth of the messages without a key", r(base, keyless_share=0.2)),
        Shape("Zipf keys", "key numbers drawn from a Zipf law (exponent 1.2)", r(base, key_skew=1.2)),
        Shape("unique keys", "every message a key of its own", r(base, unique_keys=True)),
        Shape("few keys", "100 keys", r(base, keys=100)),
    ]
