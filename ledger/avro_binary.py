"""A reader of Avro's binary encoding (schemaless: one datum, as Pulsar's clients write a
value), for a process without fastavro: a cluster's executors may have only pyarrow, numpy
and pandas, and a table topic's Avro values must still decode there
(``ledger.value_columns``). Several times slower than fastavro, which is used where present.

:func:`reader` compiles a definition into one function per type, each taking the bytes and a
position and giving the datum and the position after it; records as dicts, enums as their
symbol, logical types as their stored values. Bytes that are not a datum of the schema raise
(``ValueError``, ``IndexError``, ``KeyError``, ``UnicodeDecodeError``, ``struct.error``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

Decoder = Callable[[bytes, int], tuple[Any, int]]

# A varint of a long has at most 10 bytes.
_MAX_SHIFT = 63
_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")


def reader(definition: Any) -> Callable[[bytes], Any]:
    """A function giving the datum ``value`` holds, None when bytes are left over after it."""
    decode = _compile(definition, {}, None)

    def read(value: bytes) -> Any:
        datum, end = decode(value, 0)
        return datum if end == len(value) else None

    return read


def _long(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    pos += 1
    n = b & 0x7F
    shift = 7
    while b & 0x80:
        if shift > _MAX_SHIFT:
            raise ValueError("a varint longer than a long")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
    return (n >> 1) ^ -(n & 1), pos


def _null(buf: bytes, pos: int) -> tuple[Any, int]:
    return None, pos


def _boolean(buf: bytes, pos: int) -> tuple[bool, int]:
    b = buf[pos]
    if b > 1:
        raise ValueError(f"a boolean byte {b}")
    return b == 1, pos + 1


def _float(buf: bytes, pos: int) -> tuple[float, int]:
    return _FLOAT.unpack_from(buf, pos)[0], pos + 4


def _double(buf: bytes, pos: int) -> tuple[float, int]:
    return _DOUBLE.unpack_from(buf, pos)[0], pos + 8


def _bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _long(buf, pos)
    end = pos + n
    if n < 0 or end > len(buf):
        raise ValueError(f"{n} bytes at {pos} of {len(buf)}")
    return buf[pos:end], end


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _bytes(buf, pos)
    return raw.decode("utf-8"), pos


_PRIMITIVES: dict[str, Decoder] = {
    "null": _null,
    "boolean": _boolean,
    "int": _long,
    "long": _long,
    "float": _float,
    "double": _double,
    "bytes": _bytes,
    "string": _string,
}


def _full(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _compile(node: Any, named: dict[str, Decoder], namespace: str | None) -> Decoder:
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return _PRIMITIVES[node]
        full = _full(node, namespace)

        def by_name(buf: bytes, pos: int) -> tuple[Any, int]:  # looked up when called: recursion
            return named[full if full in named else node](buf, pos)

        return by_name
    if isinstance(node, list):
        return _union([_compile(branch, named, namespace) for branch in node])
    kind = node["type"]
    if kind == "record":
        space = node.get("namespace", namespace)
        full = _full(node["name"], space)
        fields: list[tuple[str, Decoder]] = []
        decode = _record(fields)
        named[full] = named[node["name"]] = decode  # before its fields: they may refer to it
        fields.extend((f["name"], _compile(f["type"], named, space)) for f in node["fields"])
        return decode
    if kind == "enum":
        decode = _enum(tuple(node["symbols"]))
    elif kind == "fixed":
        decode = _fixed(int(node["size"]))
    elif kind == "array":
        return _array(_compile(node["items"], named, namespace))
    elif kind == "map":
        return _map(_compile(node["values"], named, namespace))
    else:
        return _compile(kind, named, namespace)  # {"type": "long", ...}
    named[_full(node["name"], node.get("namespace", namespace))] = named[node["name"]] = decode
    return decode


def _record(fields: list[tuple[str, Decoder]]) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        for name, field in fields:
            out[name], pos = field(buf, pos)
        return out, pos

    return decode


def _union(branches: list[Decoder]) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        index, pos = _long(buf, pos)
        if index < 0:
            raise ValueError(f"union branch {index}")
        return branches[index](buf, pos)

    return decode


def _enum(symbols: tuple[str, ...]) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[str, int]:
        index, pos = _long(buf, pos)
        if index < 0:
            raise ValueError(f"enum symbol {index}")
        return symbols[index], pos

    return decode


def _fixed(size: int) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[bytes, int]:
        end = pos + size
        if end > len(buf):
            raise ValueError(f"{size} bytes at {pos} of {len(buf)}")
        return buf[pos:end], end

    return decode


def _blocks(buf: bytes, pos: int, item: Callable[[bytes, int], int], *, sized: bool = True) -> int:
    """Avro's blocks of items (a count, negative with a byte size after it; 0 ends them). A
    count beyond the bytes left is refused at once when each item takes a byte at least
    (``sized``: all but nulls), not after a loop of that many."""
    while True:
        count, pos = _long(buf, pos)
        if count == 0:
            return pos
        if count < 0:
            count = -count
            _, pos = _long(buf, pos)  # the block's size in bytes: not needed here
        if sized and count > len(buf) - pos:
            raise ValueError(f"a block of {count} items in {len(buf) - pos} bytes")
        for _ in range(count):
            pos = item(buf, pos)


def _array(items: Decoder) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[list[Any], int]:
        out: list[Any] = []

        def item(b: bytes, p: int) -> int:
            value, p = items(b, p)
            out.append(value)
            return p

        return out, _blocks(buf, pos, item, sized=items is not _null)

    return decode


def _map(values: Decoder) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}

        def item(b: bytes, p: int) -> int:
            key, p = _string(b, p)
            out[key], p = values(b, p)
            return p

        return out, _blocks(buf, pos, item)

    return decode
