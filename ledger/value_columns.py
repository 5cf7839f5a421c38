"""A table topic's typed value columns: the fields of its JSON or Avro schema as columns of its
compacted parts, beside the binary ``value`` (issue 52: engines query them as the Iceberg
table's columns).

Iceberg reads a column from each data file or as null, so the compactor writes these columns
into the parts it writes from the moment the topic has such a schema (parts written before
read as null there). The columns are those of the schema's latest version (:func:`columns`),
decoded from each part's values as it is written (:func:`decode`).

Types (Avro's, which Pulsar's JSON schemas carry too):

- primitives as their Arrow types (``int`` int32, ``long`` int64, ``float`` float32,
  ``bytes`` and ``fixed`` binary, ...); a union of ``null`` and one type as that type (every
  column is nullable); enums as strings (their symbol); records as structs; arrays as lists;
  maps as maps of string keys.
- logical types: ``date`` as date32, ``time-millis``/``time-micros`` as time64[us],
  ``timestamp-millis``/``timestamp-micros`` as timestamp[us, UTC] and their ``local-``
  forms as timestamp[us] (Iceberg's time and timestamp types are microseconds); any other
  (decimal, uuid, duration, nanoseconds) as its underlying type.
- a field that has no such type (a union of several types, a record that contains itself,
  ``null`` alone) is left out: its data stays in ``value``.

A top-level field named like one of the parts' own columns (``ledger.schema.COLUMNS``) or
``partition`` (the table's partition column) is prefixed ``value_`` (``key`` becomes
``value_key``); the last column, :data:`DECODE_FAILED`, says which values did not decode.

A value that does not decode -- not JSON text of an object (or not Avro binary of the record,
schemaless as Pulsar's clients write it, with nothing left over), or a field whose value does
not fit its column -- gives nulls in every typed column and ``true`` in the flag; decoding
never raises for a value. A null or empty value (a tombstone, or a message without a value)
has nothing to decode: nulls and ``false``, since nothing failed (``is_tombstone`` tells a
delete apart).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ledger.schema import COLUMNS

# The flag column, last of the typed columns.
DECODE_FAILED = "value_decode_failed"
# Key-value metadata of a part with typed columns: the digest of the schema they are of
# (:attr:`ValueSchema.digest`), so that a reader tells parts of an older version apart.
VALUE_SCHEMA_KEY = b"compactor.value-schema"
# Schema types whose values have typed columns (Pulsar's admin names).
TYPED_SCHEMAS = ("JSON", "AVRO")
# Top-level field names that would clash with the parts' own columns or the table's partition.
RESERVED = frozenset(COLUMNS) | {"partition", DECODE_FAILED}
PREFIX = "value_"
# Rows converted to Arrow at once; a chunk that does not convert is done row by row.
_CHUNK = 4096
# JSON values in a run that Arrow's JSON reader refused are decoded row by row below this many.
_SMALL = 64

_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
# Logical types read as the Arrow type that holds the stored number as is (``build``), then
# cast to the column's type (``final``: microseconds, as Iceberg has them).
_LOGICAL: dict[tuple[str, str], tuple[pa.DataType, pa.DataType]] = {
    ("date", "int"): (pa.date32(), pa.date32()),
    ("time-millis", "int"): (pa.time32("ms"), pa.time64("us")),
    ("time-micros", "long"): (pa.time64("us"), pa.time64("us")),
    ("timestamp-millis", "long"): (pa.timestamp("ms", tz="UTC"), pa.timestamp("us", tz="UTC")),
    ("timestamp-micros", "long"): (pa.timestamp("us", tz="UTC"), pa.timestamp("us", tz="UTC")),
    ("local-timestamp-millis", "long"): (pa.timestamp("ms"), pa.timestamp("us")),
    ("local-timestamp-micros", "long"): (pa.timestamp("us"), pa.timestamp("us")),
}


@dataclass(frozen=True)
class ValueSchema:
    """What a round is given of a table topic's schema: its type (``JSON`` or ``AVRO``) and
    its latest version's definition (pickled into the round's tasks)."""

    type: str
    definition: bytes

    def columns(self) -> pa.Schema | None:
        return columns(self.type, self.definition)

    @property
    def digest(self) -> str:
        """What :data:`VALUE_SCHEMA_KEY` records: a SHA-256 of the type and definition (hex)."""
        return hashlib.sha256(self.type.encode() + b"\0" + self.definition).hexdigest()

    def decode(self, values: pa.Array | pa.ChunkedArray) -> pa.Table:
        return decode(self.type, self.definition, values)


class _Unsupported(Exception):
    """A field type with no column (see the module's docstring): the field is left out."""


@dataclass(frozen=True)
class _Layout:
    """A schema's typed columns: how rows are built (``build``, whose field names are the
    schema's), the columns' type (``final``), the output names, and how values are read."""

    build: pa.StructType
    final: pa.StructType
    names: tuple[str, ...]
    read: Callable[[bytes], Any]
    # For JSON values whose columns Arrow's JSON reader parses (no binary, no map): the type
    # it reads them as (temporal types as their stored numbers). None: row by row in Python.
    json_storage: pa.StructType | None = None


def columns(schema_type: str, definition: str | bytes) -> pa.Schema | None:
    """The typed columns of a schema (its latest version's ``type`` and definition), the
    :data:`DECODE_FAILED` flag last; None for other schema types, a definition that is not
    an Avro record, or one without a field that has a column."""
    layout = _layout(schema_type, definition)
    if layout is None:
        return None
    fields = [pa.field(name, f.type) for name, f in zip(layout.names, layout.final, strict=True)]
    return pa.schema([*fields, pa.field(DECODE_FAILED, pa.bool_())])


def decode(schema_type: str, definition: str | bytes, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    """The typed columns (:func:`columns`) of ``values`` (binary: JSON text or schemaless Avro
    binary), one row per value; never raises for a value (see the module's docstring).
    ``ValueError`` for a schema without typed columns."""
    layout = _layout(schema_type, definition)
    if layout is None:
        raise ValueError(f"a {schema_type} schema without typed columns")
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.binary())
    if layout.json_storage is not None:
        struct, failed = _json_fast(layout, layout.json_storage, values)
    else:
        struct, failed = _rows(layout, values.to_pylist())
    if layout.build != layout.final:
        struct = struct.cast(layout.final)
    out = struct.flatten() if len(struct) else [pa.array([], f.type) for f in layout.final]
    schema = columns(schema_type, definition)
    assert schema is not None
    return pa.Table.from_arrays([*out, pa.array(failed, pa.bool_())], schema=schema)


def _rows(layout: _Layout, values: list[bytes | None]) -> tuple[pa.StructArray, list[bool]]:
    """``values`` decoded one by one into rows, then made a struct array (of ``build``
    types) at once; with each row's flag."""
    rows: list[Any] = []
    failed: list[bool] = []
    read = layout.read
    for value in values:
        if not value:  # null or empty: nothing to decode
            rows.append(None)
            failed.append(False)
            continue
        try:
            row = read(value)
        except Exception:  # noqa: BLE001 - any value that does not decode is flagged, never raised
            row = None
        rows.append(row)
        failed.append(row is None)
    return _to_arrow(rows, failed, layout.build), failed


def _json_fast(
    layout: _Layout, storage: pa.StructType, values: pa.Array
) -> tuple[pa.StructArray, list[bool]]:
    """JSON values parsed by Arrow's JSON reader, several times faster than row by row, and
    without making them Python objects: the values with something to decode, one per line
    (pretty-printed values span lines, which the reader is told), read at once; where that
    fails (a value that does not decode), the two halves again, down to runs of
    :data:`_SMALL` values decoded row by row."""
    n = len(values)
    nothing = _bool_numpy(pc.equal(pc.binary_length(values), 0))  # null or empty
    # Each text gives one row or an error, so a run's row count says it was read right; but
    # blank text gives none: it fails without being read.
    blank = _bool_numpy(pc.match_substring_regex(values, r"^\s*$")) & ~nothing
    present = np.flatnonzero(~nothing & ~blank)
    texts = values if len(present) == n else values.take(pa.array(present))
    empty, newline = pa.scalar(b"", pa.large_binary()), pa.scalar(b"\n", pa.large_binary())
    lines = pc.binary_join_element_wise(texts.cast(pa.large_binary()), empty, newline)
    offsets = np.frombuffer(lines.buffers()[1], np.int64)[lines.offset : lines.offset + len(lines) + 1]
    data = lines.buffers()[2]
    schema = pa.schema(list(storage))
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    options.newlines_in_values = True

    def parse(lo: int, hi: int) -> list[tuple[pa.StructArray, list[bool]]]:
        if hi - lo <= _SMALL:
            return [_rows(layout, texts.slice(lo, hi - lo).to_pylist())] if hi > lo else []
        size = int(offsets[hi] - offsets[lo])
        read = pj.ReadOptions(use_threads=False, block_size=max(1 << 20, size + 1))
        try:
            source = pa.BufferReader(data.slice(int(offsets[lo]), size))
            table = pj.read_json(source, read_options=read, parse_options=options)
        except (pa.ArrowException, ValueError):
            table = None
        if table is not None and table.num_rows == hi - lo and table.schema == schema:
            arrays = [c.combine_chunks() for c in table.columns]
            struct = pa.StructArray.from_arrays(arrays, fields=list(storage)).cast(layout.build)
            return [(struct, [False] * (hi - lo))]
        mid = (lo + hi) // 2
        return parse(lo, mid) + parse(mid, hi)

    runs = parse(0, len(present))
    decoded = pa.concat_arrays([r[0] for r in runs]) if runs else pa.array([], layout.build)
    failed = blank.copy()
    failed[present] = [f for r in runs for f in r[1]]
    if len(present) != n:  # rows without a value, or blank: null (a take of a null index)
        at = np.full(n, -1, np.int64)
        at[present] = np.arange(len(present))
        decoded = decoded.take(pa.array(at, mask=at < 0))
    return decoded, failed.tolist()  # type: ignore[return-value]


def _bool_numpy(flags: pa.Array) -> np.ndarray:
    """A boolean column as numpy, null as true (no text: nothing to decode)."""
    return np.asarray(pc.fill_null(flags, True).to_numpy(zero_copy_only=False), dtype=bool)


def _json_storage(build: pa.StructType) -> pa.StructType | None:
    """How Arrow's JSON reader reads a JSON schema's columns (temporal types as the numbers
    they are sent as, to be cast to ``build``); None where it cannot (binary, maps)."""
    fields = []
    for f in build:
        kind = _json_type(f.type)
        if kind is None:
            return None
        fields.append(pa.field(f.name, kind))
    return pa.struct(fields)


def _json_type(kind: pa.DataType) -> pa.DataType | None:
    if pa.types.is_struct(kind):
        return _json_storage(kind)
    if pa.types.is_list(kind):
        item = _json_type(kind.value_type)
        return pa.list_(item) if item is not None else None
    if pa.types.is_date32(kind) or pa.types.is_time32(kind):
        return pa.int32()
    if pa.types.is_timestamp(kind) or pa.types.is_time64(kind):
        return pa.int64()
    if pa.types.is_binary(kind) or pa.types.is_map(kind):
        return None
    return kind


def _to_arrow(rows: list[Any], failed: list[bool], build: pa.StructType) -> pa.StructArray:
    """``rows`` (dicts, None for no value) as a struct array, chunk by chunk; a row whose
    fields do not fit their types becomes null, its flag set in ``failed``."""
    chunks: list[pa.Array] = []
    for start in range(0, len(rows), _CHUNK):
        part = rows[start : start + _CHUNK]
        try:
            chunks.append(pa.array(part, build))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            for i, row in enumerate(part):
                try:
                    chunks.append(pa.array([row], build))
                except (pa.ArrowException, TypeError, ValueError, OverflowError):
                    chunks.append(pa.nulls(1, build))
                    failed[start + i] = True
    if not chunks:
        return pa.array([], build)  # type: ignore[return-value]
    return pa.concat_arrays(chunks) if len(chunks) > 1 else chunks[0]  # type: ignore[return-value]


@functools.lru_cache(maxsize=64)
def _layout(schema_type: str, definition: str | bytes) -> _Layout | None:
    """The columns and reader of a schema, parsed once per schema (a round decodes many chunks)."""
    if schema_type not in TYPED_SCHEMAS:
        return None
    try:
        parsed = json.loads(definition)
    except ValueError:
        return None
    if (
        not isinstance(parsed, dict)
        or parsed.get("type") != "record"
        or not isinstance(parsed.get("fields"), list)
    ):
        return None
    try:
        build, final = _record_types(parsed, _Names(parsed.get("namespace")))
    except (_Unsupported, KeyError, TypeError, ValueError):
        return None
    if not build.num_fields:
        return None
    names = _renamed(f.name for f in build)
    if schema_type == "JSON":
        return _Layout(build, final, names, _read_json, _json_storage(build))
    try:
        read = _avro_reader(parsed)
    except Exception:  # noqa: BLE001 - fastavro refuses the definition: no typed columns
        return None
    return _Layout(build=build, final=final, names=names, read=read)


def _renamed(names: Iterable[str]) -> tuple[str, ...]:
    """Top-level field names as columns: a reserved name prefixed (again, should that clash)."""
    out: list[str] = []
    taken = set(RESERVED)
    original = list(names)
    taken.update(n for n in original if n not in RESERVED)
    for name in original:
        if name in RESERVED:
            name = PREFIX + name
            while name in taken:
                name = PREFIX + name
            taken.add(name)
        out.append(name)
    return tuple(out)


class _Names:
    """Named Avro types seen so far (records, enums, fixed), by full name and by short name,
    for fields that refer to a type by its name; and the records being defined (a record
    inside itself has no column type)."""

    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace
        self.types: dict[str, tuple[pa.DataType, pa.DataType]] = {}
        self.open: set[str] = set()

    def full(self, name: str, namespace: str | None) -> str:
        if "." in name:
            return name
        space = namespace if namespace is not None else self.namespace
        return f"{space}.{name}" if space else name

    def add(
        self, node: dict[str, Any], types: tuple[pa.DataType, pa.DataType], namespace: str | None
    ) -> None:
        name = node["name"]
        self.types[self.full(name, node.get("namespace", namespace))] = types
        self.types.setdefault(name.rsplit(".", 1)[-1], types)

    def find(self, name: str, namespace: str | None) -> tuple[pa.DataType, pa.DataType]:
        for candidate in (self.full(name, namespace), name, name.rsplit(".", 1)[-1]):
            if candidate in self.open:
                raise _Unsupported(f"record {name} contains itself")
            if candidate in self.types:
                return self.types[candidate]
        raise _Unsupported(f"unknown type {name}")


def _record_types(
    node: dict[str, Any], names: _Names, namespace: str | None = None
) -> tuple[pa.StructType, pa.StructType]:
    """A record's (build, final) struct types: its fields that have a column type."""
    space = node.get("namespace", namespace)
    full = names.full(node["name"], space) if "name" in node else ""
    names.open.add(full)
    build: list[pa.Field] = []
    final: list[pa.Field] = []
    try:
        for f in node["fields"]:
            try:
                b, t = _types(f["type"], names, space)
            except _Unsupported:
                continue
            build.append(pa.field(f["name"], b))
            final.append(pa.field(f["name"], t))
    finally:
        names.open.discard(full)
    types = (pa.struct(build), pa.struct(final))
    if "name" in node:
        names.add(node, types, namespace)
    return types


def _types(node: Any, names: _Names, namespace: str | None) -> tuple[pa.DataType, pa.DataType]:
    """An Avro type's (build, final) Arrow types; ``_Unsupported`` for one without a column."""
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return _PRIMITIVES[node], _PRIMITIVES[node]
        if node == "null":
            raise _Unsupported("null")
        return names.find(node, namespace)
    if isinstance(node, list):  # a union
        branches = [b for b in node if b != "null"]
        if len(branches) != 1:
            raise _Unsupported("a union of several types")
        return _types(branches[0], names, namespace)
    if not isinstance(node, dict):
        raise _Unsupported(f"type {node!r}")
    kind = node.get("type")
    logical = _LOGICAL.get((node.get("logicalType", ""), kind)) if isinstance(kind, str) else None
    if logical is not None:
        return logical
    if kind == "record":
        return _record_types(node, names, namespace)
    if kind == "enum":
        types: tuple[pa.DataType, pa.DataType] = (pa.string(), pa.string())
        names.add(node, types, namespace)
        return types
    if kind == "fixed":
        types = (pa.binary(), pa.binary())
        names.add(node, types, namespace)
        return types
    if kind == "array":
        b, t = _types(node["items"], names, namespace)
        return pa.list_(b), pa.list_(t)
    if kind == "map":
        b, t = _types(node["values"], names, namespace)
        return pa.map_(pa.string(), b), pa.map_(pa.string(), t)
    return _types(kind, names, namespace)  # {"type": "long"} and the like


def _json_loads() -> Callable[[bytes], Any]:
    """orjson's parser where the process has it (twice as fast), else the standard library's: a
    cluster's executors may have only pyarrow, numpy and pandas."""
    try:
        import orjson
    except ImportError:
        return json.loads
    return orjson.loads  # type: ignore[no-any-return]


_loads = _json_loads()


def _read_json(value: bytes) -> Any:
    """JSON text of an object (as Pulsar's clients send a JSON schema's values)."""
    row = _loads(value)
    return row if isinstance(row, dict) else None


def _avro_reader(definition: dict[str, Any]) -> Callable[[bytes], Any]:
    """Avro binary of the record, schemaless (as Pulsar's clients send an Avro schema's
    values), read with logical types left as their stored numbers (the columns convert them);
    bytes left over mean the value is not of this schema."""
    plain = _without_logical_types(definition)
    import fastavro  # only where a topic has an Avro schema (a cluster's executors have it too)

    parsed = fastavro.parse_schema(plain)
    reader = fastavro.schemaless_reader

    def read(value: bytes) -> Any:
        source = io.BytesIO(value)
        row = reader(source, parsed, None)
        return row if source.tell() == len(value) else None

    return read


def _without_logical_types(node: Any) -> Any:
    """An Avro definition with its logical types removed (fastavro would make them Python
    objects; the columns take the stored numbers and cast them)."""
    if isinstance(node, list):
        return [_without_logical_types(n) for n in node]
    if isinstance(node, dict):
        return {k: _without_logical_types(v) for k, v in node.items() if k != "logicalType"}
    return node
