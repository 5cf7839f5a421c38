"""The Avro reader for processes without fastavro (``ledger.avro_binary``): the same data as
fastavro for every type a value column has, and an error for bytes that are not a datum."""

from __future__ import annotations

import io
import json
import random
import sys
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from ledger import avro_binary, value_columns

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Everything",
    "namespace": "test",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": ["null", "long"]},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "raw", "type": "bytes"},
        {"name": "s", "type": "string"},
        {"name": "fx", "type": {"type": "fixed", "name": "Two", "size": 2}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
        {"name": "arr", "type": {"type": "array", "items": "Two"}},
        {"name": "m", "type": {"type": "map", "values": ["null", "string"]}},
        {"name": "either", "type": ["null", "string", "long"]},
        {"name": "next", "type": ["null", "Everything"]},
    ],
}


def _row(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    return {
        "b": rng.random() < 0.5,
        "i": rng.randint(-(2**31), 2**31 - 1),
        "l": None if rng.random() < 0.3 else rng.randint(-(2**63), 2**63 - 1),
        "f": 1.5,
        "d": rng.random(),
        "raw": rng.randbytes(rng.randrange(5)),
        "s": "é" * rng.randrange(4),
        "fx": rng.randbytes(2),
        "e": rng.choice("ABC"),
        "arr": [rng.randbytes(2) for _ in range(rng.randrange(3))],
        "m": {f"k{j}": None if j % 2 else "v" for j in range(rng.randrange(3))},
        "either": rng.choice([None, "x", 7]),
        "next": _row(rng, depth + 1) if depth < 2 and rng.random() < 0.5 else None,
    }


def _encode(row: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), row)
    return out.getvalue()


def test_decodes_what_fastavro_writes_as_fastavro_reads_it() -> None:
    rng = random.Random(52)
    read = avro_binary.reader(SCHEMA)
    parsed = fastavro.parse_schema(SCHEMA)
    for _ in range(300):
        value = _encode(_row(rng))
        assert read(value) == fastavro.schemaless_reader(io.BytesIO(value), parsed, None)


def test_bytes_that_are_not_a_datum_raise_or_leave_bytes_over() -> None:
    read = avro_binary.reader(SCHEMA)
    value = _encode(_row(random.Random(1)))
    assert read(value + b"\x00") is None  # bytes left over
    for bad in (value[: len(value) // 2], b"", b"\x02", b"\xff" * 12):
        with pytest.raises((ValueError, IndexError, UnicodeDecodeError)):
            read(bad)
    # A block count far beyond the bytes is refused at once, not looped over.
    huge = avro_binary.reader({"type": "array", "items": "long"})
    with pytest.raises(ValueError, match="block"):
        huge(b"\xfe\xff\xff\xff\x0f")


def test_value_columns_decode_avro_without_fastavro(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fastavro", None)  # import fastavro raises ImportError
    value_columns._layout.cache_clear()
    try:
        definition = json.dumps(SCHEMA)
        values = [_encode(_row(random.Random(i))) for i in range(5)]
        table = value_columns.decode("AVRO", definition, pa.array([*values, b"\x01"], pa.binary()))
    finally:
        value_columns._layout.cache_clear()
    rows = table.to_pylist()
    assert [r["e"] for r in rows[:5]] == [_row(random.Random(i))["e"] for i in range(5)]
    assert [r[value_columns.DECODE_FAILED] for r in rows] == [False] * 5 + [True]
    assert "either" not in table.column_names and "next" not in table.column_names
