"""Avro's schema resolution as a check: can a reader holding one schema read data written with
another? Pulsar's compatibility strategies for AVRO and JSON schemas (``service.schema_compat``)
are this question asked one way, the other, or both.

The rules are those of Avro's Java ``Resolver``, which Pulsar's broker runs through Avro's
``SchemaValidator`` (the resolving grammar, refused when it holds an error), so that a schema
Pulsar accepts is accepted here and one it refuses is refused:

- the same primitive type reads itself; a writer's ``int`` is read as ``long``, ``float`` or
  ``double``, ``long`` as ``float`` or ``double``, ``float`` as ``double``, and ``string`` and
  ``bytes`` as each other (logical types are read as their underlying type);
- records: each field both have is resolved; a reader's field the writer lacks needs a default
  (matched by name or by one of the reader field's aliases); a writer's field the reader lacks is
  skipped. A record's name is not compared (Avro's Java resolver does not; Pulsar relies on it);
- enums and fixed types compare their names (a reader's alias counts); fixed sizes must agree;
  an enum symbol the reader lacks is not refused here (Avro reports it when such a value is read);
- arrays and maps resolve their items and values;
- a writer's union: every branch must be readable (branch by branch when both unions are
  alike); a reader's union reads a writer's type through its first matching branch (the same
  type, a named type by full name or a record by structure, then a promotion).

No schema library of the service's dependencies says this (fastavro resolves only while it
decodes), hence these few rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})
# What a writer's type may be read as, besides itself (Avro's promotions), in Avro's order of
# preference when a reader's union offers several.
_PROMOTIONS = {
    "int": ("long", "double", "float"),
    "long": ("double", "float"),
    "float": ("double",),
    "string": ("bytes",),
    "bytes": ("string",),
}
# Types nest at most this deep in a definition: beyond it the definition is refused rather than
# recursing towards Python's limit (a definition may be 1 MiB; real ones nest a handful of levels).
_MAX_DEPTH = 64


class AvroSchemaError(ValueError):
    """A definition that is not an Avro schema (Avro's ``SchemaParseException``)."""


@dataclass(eq=False)
class AvroType:
    """One node of a parsed schema; named types are shared by every reference to them."""

    kind: str  # a primitive name, "record", "enum", "fixed", "array", "map" or "union"
    name: str | None = None  # a named type's full name
    aliases: frozenset[str] = frozenset()  # full names
    fields: list[AvroField] = field(default_factory=list)
    symbols: tuple[str, ...] = ()
    size: int = 0
    items: AvroType | None = None  # an array's items, a map's values
    branches: list[AvroType] = field(default_factory=list)

    @property
    def short(self) -> str | None:
        return self.name.rsplit(".", 1)[-1] if self.name else None

    def describe(self) -> str:
        return self.name or self.kind


@dataclass(eq=False)
class AvroField:
    name: str
    type: AvroType
    has_default: bool
    aliases: frozenset[str] = frozenset()


def parse(definition: bytes | str) -> AvroType:
    """The schema a definition states; ``AvroSchemaError`` when it is not one."""
    try:
        doc = json.loads(definition)
    except (ValueError, RecursionError) as e:
        raise AvroSchemaError(f"not JSON: {e}") from None
    return _Parser().parse(doc, None, 0)


class _Parser:
    def __init__(self) -> None:
        self.named: dict[str, AvroType] = {}

    def parse(self, doc: object, namespace: str | None, depth: int) -> AvroType:
        if depth > _MAX_DEPTH:
            raise AvroSchemaError(f"types nest deeper than {_MAX_DEPTH} levels")
        if isinstance(doc, str):
            return self._reference(doc, namespace)
        if isinstance(doc, list):
            return AvroType("union", branches=[self.parse(b, namespace, depth + 1) for b in doc])
        if not isinstance(doc, dict):
            raise AvroSchemaError(f"not a schema: {doc!r:.80}")
        kind = doc.get("type")
        if isinstance(kind, dict | list):  # {"type": {...}}: the inner schema, as Avro reads it
            return self.parse(kind, namespace, depth + 1)
        if not isinstance(kind, str):
            raise AvroSchemaError(f"no type in {doc!r:.80}")
        if kind in PRIMITIVES:
            return AvroType(kind)  # a logical type reads as its underlying type
        if kind in ("array", "map"):
            inner = doc.get("items" if kind == "array" else "values")
            if inner is None:
                raise AvroSchemaError(f"{kind} without {'items' if kind == 'array' else 'values'}")
            return AvroType(kind, items=self.parse(inner, namespace, depth + 1))
        if kind in _NAMED:
            return self._named(doc, "record" if kind == "error" else kind, namespace, depth)
        return self._reference(kind, namespace)

    def _named(self, doc: dict[str, object], kind: str, namespace: str | None, depth: int) -> AvroType:
        name = doc.get("name")
        if not isinstance(name, str) or not name:
            raise AvroSchemaError(f"a {kind} without a name")
        ns = doc.get("namespace")
        full = _full(name, ns if isinstance(ns, str) and ns else namespace)
        if full in self.named:
            raise AvroSchemaError(f"{full} is defined twice")
        space = full.rsplit(".", 1)[0] if "." in full else None
        node = AvroType(kind, name=full, aliases=_aliases(doc, space))
        self.named[full] = node  # before its fields: a record may refer to itself
        if kind == "enum":
            symbols = doc.get("symbols")
            if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
                raise AvroSchemaError(f"enum {full} without a list of symbols")
            node.symbols = tuple(symbols)
        elif kind == "fixed":
            size = doc.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise AvroSchemaError(f"fixed {full} without a size")
            node.size = size
        else:
            fields = doc.get("fields")
            if not isinstance(fields, list):
                raise AvroSchemaError(f"record {full} without a list of fields")
            for f in fields:
                if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
                    raise AvroSchemaError(f"a field of {full} without a name or a type")
                aliases = frozenset(_strings(f.get("aliases")))
                node.fields.append(
                    AvroField(f["name"], self.parse(f["type"], space, depth + 1), "default" in f, aliases)
                )
        return node

    def _reference(self, name: str, namespace: str | None) -> AvroType:
        if name in PRIMITIVES:
            return AvroType(name)
        for candidate in (_full(name, namespace), name):
            if candidate in self.named:
                return self.named[candidate]
        raise AvroSchemaError(f"unknown type {name!r}")


def _full(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _aliases(doc: dict[str, object], namespace: str | None) -> frozenset[str]:
    return frozenset(_full(a, namespace) for a in _strings(doc.get("aliases")))


def _strings(raw: object) -> list[str]:
    """The strings of a list (aliases). Anything else is ignored, where Avro's parser refuses it:
    an alias ignored only makes fewer names match."""
    return [a for a in raw if isinstance(a, str)] if isinstance(raw, list) else []


def can_read(writer: AvroType, reader: AvroType) -> str | None:
    """None when data written with ``writer`` can be read with ``reader``; else why not.
    ``AvroSchemaError`` when the pair takes more than ``MAX_STEPS`` steps to decide."""
    return _Walk({}, [0]).resolve(writer, reader)


# Real schema pairs resolve in hundreds of steps (a record of a thousand fields in a few
# thousand); unions of thousands of records compared by structure could take billions. A pair
# past this (about half a second of work) is refused rather than decided slowly.
MAX_STEPS = 50_000


class _Walk:
    """One resolution: the record pairs decided so far (``seen``: recursion and repetition end
    there) and the steps taken, shared with the trial walks a reader's union makes."""

    def __init__(self, seen: dict[tuple[int, int], str | None], steps: list[int]) -> None:
        self.seen = seen
        self.steps = steps

    def resolve(self, w: AvroType, r: AvroType) -> str | None:
        _step(self.steps)
        if w.kind == "union":
            if _alike(w, r, set(), self.steps):
                pairs = list(zip(w.branches, r.branches, strict=True))
            else:
                pairs = [(b, r) for b in w.branches]
            return next((e for a, b in pairs if (e := self.resolve(a, b)) is not None), None)
        if w.kind == r.kind:
            if w.kind in PRIMITIVES:
                return None
            if w.kind in ("array", "map"):
                assert w.items is not None and r.items is not None
                return self.resolve(w.items, r.items)
            if w.kind in ("enum", "fixed"):
                if not _same_name(w, r):
                    return f"found {w.describe()}, expecting {r.describe()}"
                if w.kind == "fixed" and w.size != r.size:
                    return f"{r.describe()} is {r.size} bytes, written as {w.size}"
                return None
            return self.record(w, r)
        if r.kind == "union":
            branch = self.matching_branch(w, r)
            if branch is None:
                return f"found {w.describe()}, expecting one of {[b.describe() for b in r.branches]}"
            return self.resolve(w, branch)
        if r.kind in _PROMOTIONS.get(w.kind, ()):
            return None
        return f"found {w.describe()}, expecting {r.describe()}"

    def record(self, w: AvroType, r: AvroType) -> str | None:
        _step(self.steps)
        key = (id(w), id(r))
        if key in self.seen:  # a recursive record: what holds for the rest holds here
            return self.seen[key]
        self.seen[key] = None
        written = {f.name: f for f in w.fields}
        problem: str | None = None
        for rf in r.fields:
            wf = written.get(rf.name) or next((written[a] for a in rf.aliases if a in written), None)
            if wf is None:
                if not rf.has_default:
                    problem = (
                        f"field {rf.name!r} of {r.describe()} is missing in the writer's and has no default"
                    )
            else:
                inner = self.resolve(wf.type, rf.type)
                if inner is not None:
                    problem = f"field {rf.name!r}: {inner}"
            if problem is not None:
                break
        self.seen[key] = problem
        return problem

    def matching_branch(self, w: AvroType, r: AvroType) -> AvroType | None:
        """The branch of the reader's union that reads the writer's (non-union) type, in Avro's
        order: the same type, a named type by full name, a record by structure (one of the same
        short name preferred), then a promotion."""
        structural: AvroType | None = None
        for b in r.branches:
            if b.kind != w.kind:
                continue
            if w.kind not in ("record", "enum", "fixed"):
                return b
            if w.name is not None and w.name == b.name:
                return b
            better = structural is None or (w.short is not None and w.short == b.short)
            # A trial: what it decides must not stand for the walk that follows.
            if w.kind == "record" and better and _Walk(dict(self.seen), self.steps).record(w, b) is None:
                structural = b
        if structural is not None:
            return structural
        promoted = _PROMOTIONS.get(w.kind, ())
        return next((b for b in r.branches if b.kind in promoted), None)


def _step(steps: list[int]) -> None:
    steps[0] += 1
    if steps[0] > MAX_STEPS:
        raise AvroSchemaError(f"the schemas take more than {MAX_STEPS} steps to compare")


def _same_name(w: AvroType, r: AvroType) -> bool:
    return w.short == r.short or (w.name is not None and w.name in r.aliases)


def _alike(w: AvroType, r: AvroType, seen: set[tuple[int, int]], steps: list[int]) -> bool:
    """Avro's union equivalence: the same shape and (short) names, branch by branch."""
    _step(steps)
    if w.kind != r.kind:
        return False
    if w.kind in _NAMED and w.short != r.short:
        return False
    if w.kind in PRIMITIVES:
        return True
    if w.kind in ("array", "map"):
        assert w.items is not None and r.items is not None
        return _alike(w.items, r.items, seen, steps)
    if w.kind == "fixed":
        return w.size == r.size
    if w.kind == "enum":
        return w.symbols == r.symbols
    if w.kind == "union":
        return len(w.branches) == len(r.branches) and all(
            _alike(a, b, seen, steps) for a, b in zip(w.branches, r.branches, strict=True)
        )
    key = (id(w), id(r))
    if key in seen:
        return True
    seen.add(key)
    return len(w.fields) == len(r.fields) and all(
        a.name == b.name and _alike(a.type, b.type, seen, steps)
        for a, b in zip(w.fields, r.fields, strict=True)
    )
