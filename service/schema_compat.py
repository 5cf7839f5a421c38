"""Pulsar's schema compatibility strategies: whether a topic whose schema history is ``existing``
may take ``new`` as its next version (a producer's, or an admin's upload), and whether a consumer
may read the topic with its schema.

Strategy (Pulsar's ``SchemaCompatibilityStrategy``) and what a new schema must do:

- ``ALWAYS_COMPATIBLE``: nothing; ``ALWAYS_INCOMPATIBLE``: be a schema the topic has;
- ``BACKWARD``: read the data written with the latest version (a field added needs a default);
- ``FORWARD``: be readable with the latest version (a field removed needs a default there);
- ``FULL``: both (Pulsar's broker default);
- ``BACKWARD_TRANSITIVE``, ``FORWARD_TRANSITIVE``, ``FULL_TRANSITIVE``: the same against every
  version, not only the latest.

``UNDEFINED`` is not a strategy: it says "inherit" (a namespace without one takes the broker's).
As in Pulsar's registry, a schema of another type than the version it is compared with is
refused (unless ``ALWAYS_COMPATIBLE``); AVRO, JSON and PROTOBUF schemas are Avro definitions and
are checked by Avro's resolution (``service.avro_resolution``); other types (STRING, INT64, ...)
are refused only by ``ALWAYS_INCOMPATIBLE``. A definition that is not Avro is incompatible, except
that JSON keeps Pulsar's allowance for its older JSON-Schema format (compatible with an Avro one
either way; two of them by their ``id``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal, Protocol, get_args

from service.avro_resolution import AvroSchemaError, AvroType, can_read, parse
from service.errors import IncompatibleSchema

Strategy = Literal[
    "ALWAYS_INCOMPATIBLE",
    "ALWAYS_COMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
]
# In Pulsar's order (its enum's), with UNDEFINED first: what the admin paths accept.
STRATEGIES: tuple[str, ...] = ("UNDEFINED", *get_args(Strategy))
TRANSITIVE = frozenset({"BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE"})
AVRO_BASED = frozenset({"AVRO", "JSON", "PROTOBUF"})


class Definition(Protocol):
    """What the checks need of one schema (``service.schemas.SchemaInfo`` is one): its type and
    definition; properties play no part."""

    @property
    def type(self) -> str: ...

    @property
    def data(self) -> bytes: ...


def same_definition(a: Definition, b: Definition) -> bool:
    """Whether two schemas are one: the same type and definition (an Avro-based definition
    compared as JSON, so that spacing and key order do not make a new version)."""
    if a.type != b.type:
        return False
    if a.data == b.data:
        return True
    if a.type not in AVRO_BASED:
        return False
    try:
        return bool(json.loads(a.data) == json.loads(b.data))
    except (ValueError, RecursionError):
        return False


def check(existing: Sequence[Definition], new: Definition, strategy: str) -> None:
    """Refuse (``IncompatibleSchema``) ``new`` as the next version of a topic whose versions are
    ``existing`` (oldest first) under ``strategy``; a topic without versions takes any."""
    if not existing or strategy == "ALWAYS_COMPATIBLE":
        return
    targets = list(reversed(existing)) if strategy in TRANSITIVE else [existing[-1]]
    _against(targets, new, strategy)


def check_consumer(existing: Sequence[Definition], new: Definition, strategy: str) -> None:
    """Refuse a consumer's schema that cannot read the topic, as Pulsar's broker decides: with
    ``BACKWARD``, ``FORWARD``, ``FORWARD_TRANSITIVE`` or ``FULL`` it must read the latest version;
    with the other strategies the strategy holds against every version."""
    if not existing or strategy == "ALWAYS_COMPATIBLE":
        return
    if strategy in ("BACKWARD", "FORWARD", "FORWARD_TRANSITIVE", "FULL"):
        _against([existing[-1]], new, "BACKWARD")
    else:
        _against(list(reversed(existing)), new, strategy)


def _against(targets: list[Definition], new: Definition, strategy: str) -> None:
    for old in targets:
        if old.type != new.type:
            raise IncompatibleSchema(
                f"Incompatible schema: exists schema type {old.type}, new schema type {new.type}"
            )
    others = [old for old in targets if not same_definition(old, new)]
    if not others:
        return
    if strategy == "ALWAYS_INCOMPATIBLE":
        raise IncompatibleSchema("Schema compatibility strategy is ALWAYS_INCOMPATIBLE")
    if new.type not in AVRO_BASED:
        return
    reason = _avro_reason(others, new, strategy)
    if reason is not None:
        raise IncompatibleSchema(
            f"Error during schema compatibility check with strategy {strategy}: {reason}"
        )


def _avro_reason(others: list[Definition], new: Definition, strategy: str) -> str | None:
    try:
        reader = parse(new.data)
    except AvroSchemaError as e:
        if new.type == "JSON" and _json_schema(new.data) is not None:
            return _legacy_json(others, new)
        return f"the new schema is not an Avro definition: {e}"
    for old in others:
        try:
            written = parse(old.data)
        except AvroSchemaError:
            if old.type == "JSON" and _json_schema(old.data) is not None:
                continue  # Pulsar's older JSON format, replaced by an Avro definition
            return "the existing schema is not an Avro definition"
        try:
            reason = _directions(written, reader, strategy)
        except AvroSchemaError as e:  # a pair too costly to decide
            return str(e)
        if reason is not None:
            return reason
    return None


def _directions(old: AvroType, new: AvroType, strategy: str) -> str | None:
    """The first way ``new`` fails ``strategy`` against ``old``, or None."""
    if strategy.startswith(("BACKWARD", "FULL")):
        reason = can_read(old, new)
        if reason is not None:
            return f"the new schema cannot read data written with an existing one: {reason}"
    if strategy.startswith(("FORWARD", "FULL")):
        reason = can_read(new, old)
        if reason is not None:
            return f"an existing schema cannot read data written with the new one: {reason}"
    return None


def _legacy_json(others: list[Definition], new: Definition) -> str | None:
    """A new schema in Pulsar's older JSON-Schema format: compatible with Avro definitions (it
    is kept beside them), and with one of its own format when both have the same ``id``."""
    new_id = (_json_schema(new.data) or {}).get("id")
    for old in others:
        try:
            parse(old.data)
            continue
        except AvroSchemaError:
            pass
        old_doc = _json_schema(old.data)
        if old_doc is None or old_doc.get("id") != new_id:
            return "Incompatible Schema: JSON schemas with different ids"
    return None


def _json_schema(data: bytes) -> dict[str, object] | None:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None
