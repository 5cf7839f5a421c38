"""A table topic's typed value columns (``ledger.value_columns``): the columns a JSON or Avro
schema gives, and the values decoded into them as Pulsar's own Python client encodes them."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pulsar.schema import Array, AvroSchema, Integer, JsonSchema, Map, Record, String

from ledger.value_columns import DECODE_FAILED, ValueSchema, columns, decode


class Address(Record):
    city = String()


class User(Record):
    name = String()
    key = String()  # a part's own column: becomes value_key
    age = Integer()
    tags = Array(String())
    scores = Map(Integer())
    address = Address()


def _user(i: int) -> User:
    return User(
        name=f"u{i}", key=f"k{i}", age=i, tags=["a", str(i)], scores={"x": i}, address=Address(city=f"c{i}")
    )


def _definition(schema: Any) -> str:
    return str(schema.schema_info().schema())


def _binary(values: list[bytes | None]) -> pa.Array:
    return pa.array(values, pa.binary())


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()  # type: ignore[no-any-return]


# ------------------------------------------------------------------ columns


def test_a_pulsar_record_gives_typed_columns_with_the_reserved_name_prefixed() -> None:
    schema = columns("JSON", _definition(JsonSchema(User)))
    assert schema is not None
    assert schema.names == ["name", "value_key", "age", "tags", "scores", "address", DECODE_FAILED]
    assert schema.field("age").type == pa.int32()
    assert schema.field("tags").type == pa.list_(pa.string())
    assert schema.field("scores").type == pa.map_(pa.string(), pa.int32())
    assert schema.field("address").type == pa.struct([pa.field("city", pa.string())])
    assert schema.field(DECODE_FAILED).type == pa.bool_()
    # Pulsar's JSON schemas carry the same Avro record definition as its Avro schemas.
    assert columns("AVRO", _definition(AvroSchema(User))) == schema


def _record(*fields: dict[str, Any], namespace: str | None = None) -> str:
    node: dict[str, Any] = {"type": "record", "name": "R", "fields": list(fields)}
    if namespace is not None:
        node["namespace"] = namespace
    return json.dumps(node)


def test_avro_types_and_logical_types_map_to_iceberg_readable_arrow_types() -> None:
    definition = _record(
        {"name": "b", "type": "boolean"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "raw", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "again", "type": "Four"},  # a named type referred to by name
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    )
    schema = columns("AVRO", definition)
    assert schema is not None
    assert {f.name: f.type for f in schema} == {
        "b": pa.bool_(),
        "l": pa.int64(),
        "f": pa.float32(),
        "d": pa.float64(),
        "raw": pa.binary(),
        "fx": pa.binary(),
        "again": pa.binary(),
        "color": pa.string(),
        "day": pa.date32(),
        "at": pa.timestamp("us", tz="UTC"),
        "at_us": pa.timestamp("us", tz="UTC"),
        "local": pa.timestamp("us"),
        "clock": pa.time64("us"),
        "price": pa.binary(),  # not simple: its underlying type
        "id": pa.string(),
        DECODE_FAILED: pa.bool_(),
    }
    assert all(f.nullable for f in schema)  # a value that does not decode gives nulls


def test_fields_without_a_column_type_are_left_out_and_clashing_renames_stay_unique() -> None:
    definition = _record(
        {"name": "either", "type": ["null", "string", "long"]},  # several types
        {"name": "nothing", "type": "null"},
        {"name": "next", "type": ["null", "R"]},  # the record inside itself
        {"name": "partition", "type": "int"},
        {"name": "value", "type": "string"},
        {"name": "value_value", "type": "string"},
        {"name": "kept", "type": "string"},
    )
    schema = columns("JSON", definition)
    assert schema is not None
    assert schema.names == ["value_partition", "value_value_value", "value_value", "kept", DECODE_FAILED]


@pytest.mark.parametrize(
    ("schema_type", "definition"),
    [
        ("STRING", _record({"name": "a", "type": "string"})),
        ("PROTOBUF", _record({"name": "a", "type": "string"})),
        ("KEY_VALUE", _record({"name": "a", "type": "string"})),
        ("JSON", '"string"'),  # not a record
        ("AVRO", "{not json"),
        ("JSON", _record()),  # no fields
        ("JSON", _record({"name": "a", "type": ["null", "string", "int"]})),  # no field with a column
        ("AVRO", _record({"name": "a", "type": "Unknown"})),
    ],
)
def test_no_typed_columns_for_other_schemas(schema_type: str, definition: str) -> None:
    assert columns(schema_type, definition) is None
    with pytest.raises(ValueError, match="without typed columns"):
        decode(schema_type, definition, _binary([b"{}"]))


# ------------------------------------------------------------------ decode


@pytest.mark.parametrize("kind", [JsonSchema, AvroSchema])
def test_values_encoded_by_pulsars_client_decode_into_their_columns(kind: Any) -> None:
    codec = kind(User)
    definition = _definition(codec)
    typed = ValueSchema("JSON" if kind is JsonSchema else "AVRO", definition.encode())
    table = typed.decode(_binary([codec.encode(_user(i)) for i in range(3)]))
    assert table.schema == typed.columns()
    assert _rows(table)[2] == {
        "name": "u2",
        "value_key": "k2",
        "age": 2,
        "tags": ["a", "2"],
        "scores": [("x", 2)],
        "address": {"city": "c2"},
        DECODE_FAILED: False,
    }


def test_json_values_that_do_not_decode_give_nulls_and_the_flag_never_an_error() -> None:
    definition = _record({"name": "n", "type": "long"}, {"name": "s", "type": ["null", "string"]})
    good = [json.dumps({"n": i, "s": f"s{i}"}, indent=True).encode() for i in range(200)]
    bad = [b"not json", b'{"n": "a string"}', b"[1, 2]", b'{"n": 1}{"n": 2}', b"  \n ", b'{"n": 1', b"5"]
    values: list[bytes | None] = good[:100] + bad + [None, b""] + good[100:]
    table = decode("JSON", definition, _binary(values))
    rows = _rows(table)
    assert len(rows) == len(values)
    assert [r[DECODE_FAILED] for r in rows[100:109]] == [True] * len(bad) + [False, False]
    assert all(r["n"] is None and r["s"] is None for r in rows[100:109])
    # Every good value around them still decodes (the fast path splits around the bad ones).
    decoded = rows[:100] + rows[109:]
    assert [r["n"] for r in decoded] == list(range(200))
    assert not any(r[DECODE_FAILED] for r in decoded)


def test_json_missing_fields_are_null_and_unknown_fields_ignored() -> None:
    definition = _record({"name": "n", "type": ["null", "long"]}, {"name": "s", "type": ["null", "string"]})
    table = decode("JSON", definition, _binary([b'{"s": "x", "extra": [1, {"y": 2}]}', b"{}"]))
    assert _rows(table) == [
        {"n": None, "s": "x", DECODE_FAILED: False},
        {"n": None, "s": None, DECODE_FAILED: False},
    ]


def test_json_timestamps_and_dates_sent_as_numbers_become_temporal_columns() -> None:
    definition = _record(
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
    )
    values = [json.dumps({"at": 1_700_000_000_123, "day": 19_000, "clock": 3_600_001}).encode()] * 100
    row = _rows(decode("JSON", definition, _binary(values)))[0]
    assert row == {
        "at": dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC),
        "day": dt.date(2022, 1, 8),
        "clock": dt.time(1, 0, 0, 1000),
        DECODE_FAILED: False,
    }


def _avro(schema: dict[str, Any], row: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), row)
    return out.getvalue()


def test_avro_logical_types_enums_and_bad_values() -> None:
    schema = json.loads(
        _record(
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
            {
                "name": "nested",
                "type": {"type": "record", "name": "N", "fields": [{"name": "x", "type": "int"}]},
            },
            namespace="shop",
        )
    )
    good = _avro(schema, {"at": 1_700_000_000_000_001, "color": "GREEN", "nested": {"x": 7}})
    values = [good, good + b"\x00", good[:3], b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", None]
    rows = _rows(decode("AVRO", json.dumps(schema), _binary(values)))
    assert rows[0] == {
        "at": dt.datetime(2023, 11, 14, 22, 13, 20, 1, tzinfo=dt.UTC),
        "color": "GREEN",
        "nested": {"x": 7},
        DECODE_FAILED: False,
    }
    # Bytes left over, cut short, garbage: nulls and the flag; no value (a tombstone): no flag.
    assert [r[DECODE_FAILED] for r in rows[1:]] == [True, True, True, False]
    assert all(r["at"] is None and r["color"] is None and r["nested"] is None for r in rows[1:])


def test_decoding_a_chunked_column_of_no_rows() -> None:
    definition = _record({"name": "n", "type": "long"})
    table = decode("JSON", definition, pa.chunked_array([], pa.binary()))
    assert table.num_rows == 0
    assert table.schema == columns("JSON", definition)
