"""Pulsar's schema compatibility rules: Avro's resolution (what a reader can read of what a
writer wrote), the strategies built on it, and the registry that applies them with the topic's,
namespace's or service's policy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.avro_resolution import AvroSchemaError, can_read, parse
from service.db import Database
from service.errors import IncompatibleSchema, InvalidInput
from service.names import TopicName, partition
from service.policies import PolicyStore, Scope, validate
from service.schema_compat import check, check_consumer, same_definition
from service.schemas import AUTO_UPDATE_DISABLED, SCHEMA_REQUIRED, SchemaInfo, SchemaRegistry
from service.settings import Settings

ORDERS = TopicName("public", "default", "orders")


def record(*fields: dict[str, Any], name: str = "User", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def f(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def avro(doc: Any) -> SchemaInfo:
    return SchemaInfo("AVRO", json.dumps(doc).encode())


def reads(writer: Any, reader: Any) -> bool:
    return can_read(parse(json.dumps(writer)), parse(json.dumps(reader))) is None


# Versions of one record as applications evolve it.
V1 = record(f("name", "string"))
WITH_DEFAULT = record(f("name", "string"), f("age", "int", default=0))
WITHOUT_DEFAULT = record(f("name", "string"), f("age", "int"))


# --- Avro's resolution ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("writer", "reader", "ok"),
    [
        ("int", "long", True),
        ("int", "double", True),
        ("long", "float", True),
        ("float", "double", True),
        ("long", "int", False),
        ("double", "float", False),
        ("string", "bytes", True),
        ("bytes", "string", True),
        ("string", "int", False),
        ("boolean", "null", False),
        ({"type": "int", "logicalType": "date"}, "int", True),  # a logical type reads as its base
    ],
)
def test_primitives_read_themselves_and_avros_promotions(writer: Any, reader: Any, ok: bool) -> None:
    assert reads(writer, reader) is ok


def test_a_field_the_writer_lacks_needs_a_default_a_field_the_reader_lacks_is_skipped() -> None:
    assert reads(V1, WITH_DEFAULT)
    assert not reads(V1, WITHOUT_DEFAULT)
    why = can_read(parse(json.dumps(V1)), parse(json.dumps(WITHOUT_DEFAULT)))
    assert why is not None and "'age'" in why and "no default" in why
    assert reads(WITHOUT_DEFAULT, V1)  # age is skipped
    # A field present in both resolves its types; a record's own name is not compared (as Avro's
    # Java resolver, which Pulsar runs: the Python client names a record after its class).
    assert not reads(record(f("age", "long")), record(f("age", "int")))
    assert reads(record(f("age", "int"), name="User1"), record(f("age", "long"), name="User2"))


def test_a_reader_field_alias_matches_a_renamed_field() -> None:
    renamed = record(f("fullName", "string", aliases=["name"]))
    assert reads(V1, renamed)
    assert not reads(V1, record(f("fullName", "string")))


def test_unions_every_writer_branch_must_be_readable_a_reader_union_picks_a_branch() -> None:
    optional = ["null", "string"]
    assert reads("string", optional)
    assert not reads(optional, "string")  # a null written cannot be read as a string
    assert reads(optional, ["string", "null"])  # other order, same branches
    assert reads("int", ["null", "long"])  # through a promotion
    assert not reads("int", ["null", "string"])
    assert reads(["int", "long"], ["long", "double"])
    # A record in a reader's union: by full name, else by structure.
    point = record(f("x", "int"), name="Point")
    assert reads(point, ["null", point])
    assert reads(point, ["null", record(f("x", "long"), name="Other")])
    assert not reads(point, ["null", record(f("y", "int"), name="Other")])


def test_enums_and_fixed_compare_names_fixed_compares_sizes() -> None:
    colour = {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}
    assert reads(colour, {**colour, "symbols": ["RED", "GREEN", "BLUE"]})  # a symbol added
    assert not reads(colour, {**colour, "name": "Shade"})
    assert reads(colour, {**colour, "name": "Shade", "aliases": ["Colour"]})
    md5 = {"type": "fixed", "name": "MD5", "size": 16}
    assert reads(md5, md5)
    assert not reads(md5, {**md5, "size": 20})
    assert not reads(md5, {**md5, "name": "SHA"})


def test_arrays_and_maps_resolve_their_items() -> None:
    assert reads({"type": "array", "items": "int"}, {"type": "array", "items": "long"})
    assert not reads({"type": "map", "values": "long"}, {"type": "map", "values": "int"})
    assert not reads({"type": "array", "items": "int"}, {"type": "map", "values": "int"})


def test_named_types_are_referenced_by_name_and_may_be_recursive() -> None:
    node = {
        "type": "record",
        "name": "Node",
        "namespace": "com.example",
        "fields": [f("value", "int"), f("next", ["null", "Node"])],
    }
    evolved = {**node, "fields": [f("value", "long"), f("next", ["null", "com.example.Node"])]}
    assert reads(node, evolved)
    assert not reads(evolved, node)
    shared = record(
        f("home", {"type": "record", "name": "Address", "fields": [f("city", "string")]}),
        f("work", "Address"),
    )
    assert reads(shared, shared)


@pytest.mark.parametrize(
    "definition",
    [
        "not json",
        '"Unknown"',
        '{"type": "record", "name": "R"}',  # no fields
        '{"type": "record", "name": "R", "fields": [{"name": "x", "type": "Missing"}]}',
        '{"type": "enum", "name": "E", "symbols": "A"}',
        '{"type": "array"}',
        "[" * 100 + "]" * 100,  # deeper than any real schema
        "[" * 100_000 + "]" * 100_000,  # deeper than Python's own limit
    ],
)
def test_a_definition_that_is_not_avro_is_refused_with_a_reason(definition: str) -> None:
    with pytest.raises(AvroSchemaError):
        parse(definition)


@pytest.mark.parametrize(
    "odd",
    [
        {"aliases": 5},
        {"aliases": [5, None]},
        {"namespace": 5},
        {"fields": [{"name": "a", "type": "int", "aliases": 5}]},
        {"fields": [5]},
        {"fields": [{"name": 5, "type": "int"}]},
        {"name": ["R"]},
        {"type": 5},
    ],
)
def test_odd_attribute_values_are_ignored_or_refused_never_a_crash(odd: dict[str, Any]) -> None:
    doc = {**record(f("a", "int")), **odd}
    try:
        parsed = parse(json.dumps(doc))
    except AvroSchemaError:
        return
    assert can_read(parsed, parsed) is None


def test_a_pair_too_costly_to_compare_is_refused_quickly_not_decided_slowly() -> None:
    # Unions of many records that match by no name: every writer branch tries every reader
    # branch by structure (Avro's rule) and matches only the last, 250 x 250 trials, past the
    # step budget.
    def union(prefix: str, field: str) -> list[Any]:
        return [record(f(field, "int"), name=f"{prefix}{i}") for i in range(250)]

    writer = record(f("v", union("A", "x")))
    reader = record(f("v", [*union("B", "y"), record(f("x", "int"), name="C")]))
    with pytest.raises(IncompatibleSchema, match="steps"):
        check([avro(writer)], avro(reader), "FULL")
    # A large schema of real shape stays well within the budget: a thousand optional fields,
    # one more added with a default, against every version.
    wide = record(*(f(f"f{i}", ["null", "string"], default=None) for i in range(1000)))
    wider = {**wide, "fields": [*wide["fields"], f("extra", ["null", "long"], default=None)]}
    check([avro(wide), avro(wide)], avro(wider), "FULL_TRANSITIVE")


# Definitions as a client may send them: mostly schemas (records, enums, fixed, arrays, maps,
# unions, named references), with any JSON where a value is expected.
_NAMES = st.sampled_from(["R", "S", "a.R", "E", "F"])
_ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 20) | _NAMES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NAMES, inner, max_size=3),
    max_leaves=6,
)


def _composite(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    name = st.sampled_from(["a", "b", "c"])
    field = st.fixed_dictionaries(
        {"name": name, "type": inner}, optional={"default": _ANY, "aliases": st.lists(name) | _ANY}
    )
    named = {"name": _NAMES}
    optional = {"aliases": st.lists(_NAMES) | _ANY, "namespace": _ANY}
    return (
        st.fixed_dictionaries(
            {"type": st.just("record"), **named, "fields": st.lists(field, max_size=3) | _ANY},
            optional=optional,
        )
        | st.fixed_dictionaries(
            {"type": st.just("enum"), **named, "symbols": st.lists(st.sampled_from("ABC")) | _ANY},
            optional=optional,
        )
        | st.fixed_dictionaries({"type": st.just("fixed"), **named, "size": st.integers(-1, 3) | _ANY})
        | st.fixed_dictionaries({"type": st.just("array"), "items": inner})
        | st.fixed_dictionaries({"type": st.just("map"), "values": inner})
        | st.lists(inner, max_size=3)
    )


_SCHEMAS = st.recursive(
    st.sampled_from(["int", "long", "float", "double", "string", "bytes", "null", "boolean"]) | _NAMES | _ANY,
    _composite,
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(writer=_SCHEMAS, reader=_SCHEMAS)
def test_any_definition_is_parsed_and_compared_or_refused_with_a_reason_never_a_crash(
    writer: Any, reader: Any
) -> None:
    for strategy in ("FULL", "BACKWARD_TRANSITIVE"):
        try:
            check([avro(writer)], avro(reader), strategy)
        except IncompatibleSchema as e:
            assert e.reason


# --- strategies ----------------------------------------------------------------------------------

# Each strategy against adding a field with a default, adding one without, removing one without.
EXPECTED = {
    "ALWAYS_COMPATIBLE": (True, True, True),
    "ALWAYS_INCOMPATIBLE": (False, False, False),
    "BACKWARD": (True, False, True),
    "FORWARD": (True, True, False),
    "FULL": (True, False, False),
    "BACKWARD_TRANSITIVE": (True, False, True),
    "FORWARD_TRANSITIVE": (True, True, False),
    "FULL_TRANSITIVE": (True, False, False),
}


def admits(existing: list[Any], new: Any, strategy: str) -> bool:
    try:
        check([avro(d) for d in existing], avro(new), strategy)
    except IncompatibleSchema:
        return False
    return True


@pytest.mark.parametrize("strategy", sorted(EXPECTED))
def test_each_strategy_on_adding_and_removing_fields(strategy: str) -> None:
    add_default = admits([V1], WITH_DEFAULT, strategy)
    add_required = admits([V1], WITHOUT_DEFAULT, strategy)
    remove_required = admits([WITHOUT_DEFAULT], V1, strategy)
    assert (add_default, add_required, remove_required) == EXPECTED[strategy]
    # A topic without a schema takes any; the same definition is always compatible with itself
    # (the registry gives its version back before any check).
    assert admits([], WITHOUT_DEFAULT, strategy)
    assert admits([WITHOUT_DEFAULT], WITHOUT_DEFAULT, strategy)


def test_transitive_strategies_check_every_version_the_others_only_the_latest() -> None:
    # v3 reads v2 (age is there) but not v1 (age missing, no default).
    history = [V1, WITH_DEFAULT]
    assert admits(history, WITHOUT_DEFAULT, "BACKWARD")
    assert not admits(history, WITHOUT_DEFAULT, "BACKWARD_TRANSITIVE")
    # v1 (no age) can be read with v2 (age has a default) but not with v3.
    history = [WITHOUT_DEFAULT, WITH_DEFAULT]
    assert admits(history, V1, "FORWARD")
    assert not admits(history, V1, "FORWARD_TRANSITIVE")


def test_a_schema_of_another_type_is_refused_with_pulsars_words() -> None:
    with pytest.raises(IncompatibleSchema, match="exists schema type AVRO, new schema type JSON"):
        check([avro(V1)], SchemaInfo("JSON", json.dumps(V1).encode()), "FULL")
    check([avro(V1)], SchemaInfo("STRING", b""), "ALWAYS_COMPATIBLE")
    # Types without a definition to resolve: refused only by ALWAYS_INCOMPATIBLE.
    check([SchemaInfo("STRING", b"")], SchemaInfo("STRING", b"x"), "FULL")
    with pytest.raises(IncompatibleSchema, match="ALWAYS_INCOMPATIBLE"):
        check([SchemaInfo("STRING", b"")], SchemaInfo("STRING", b"x"), "ALWAYS_INCOMPATIBLE")


def test_json_schemas_are_avro_definitions_and_pulsars_old_json_format_is_tolerated() -> None:
    def js(doc: Any) -> SchemaInfo:
        return SchemaInfo("JSON", json.dumps(doc).encode())

    with pytest.raises(IncompatibleSchema, match="'age'"):
        check([js(V1)], js(WITHOUT_DEFAULT), "FULL")
    check([js(V1)], js(WITH_DEFAULT), "FULL")
    old = {"type": "object", "id": "urn:jsonschema:User", "properties": {"name": {"type": "string"}}}
    check([js(old)], js(V1), "FULL")  # the Avro form replaces the old one
    check([js(V1)], js(old), "FULL")
    check([js(old)], js({**old, "properties": {}}), "FULL")  # same id
    with pytest.raises(IncompatibleSchema):
        check([js(old)], js({**old, "id": "urn:jsonschema:Other"}), "FULL")
    with pytest.raises(IncompatibleSchema, match="not an Avro definition"):
        check([avro(V1)], SchemaInfo("AVRO", b"{nope"), "FULL")


def test_the_same_definition_ignores_spacing_key_order_and_properties() -> None:
    compact = SchemaInfo("AVRO", json.dumps(V1, separators=(",", ":")).encode(), {"a": "1"})
    spaced = SchemaInfo("AVRO", json.dumps(V1, indent=2, sort_keys=True).encode())
    assert same_definition(compact, spaced)
    assert not same_definition(compact, avro(WITH_DEFAULT))
    assert not same_definition(compact, SchemaInfo("JSON", compact.data))
    assert same_definition(SchemaInfo("STRING", b"x"), SchemaInfo("STRING", b"x"))
    assert not same_definition(SchemaInfo("STRING", b"{}"), SchemaInfo("STRING", b"{ }"))


def test_a_consumer_must_read_the_latest_version_or_every_one_under_the_full_transitive_strategies() -> None:
    history = [avro(V1), avro(WITH_DEFAULT)]
    for strategy in ("BACKWARD", "FORWARD", "FORWARD_TRANSITIVE", "FULL"):
        check_consumer(history, avro(V1), strategy)  # V1 reads v2's data (age skipped)
        with pytest.raises(IncompatibleSchema):
            check_consumer([avro(V1)], avro(WITHOUT_DEFAULT), strategy)
    # BACKWARD_TRANSITIVE: the consumer's schema reads every version.
    check_consumer(history, avro(WITH_DEFAULT), "BACKWARD_TRANSITIVE")
    with pytest.raises(IncompatibleSchema):
        check_consumer(history, avro(WITHOUT_DEFAULT), "BACKWARD_TRANSITIVE")
    check_consumer(history, avro(WITHOUT_DEFAULT), "ALWAYS_COMPATIBLE")


# --- the registry with its policies --------------------------------------------------------------


@pytest.fixture
def policies(db: Database, settings: Settings) -> PolicyStore:
    return PolicyStore(db=db, settings=settings)


@pytest.fixture
def registry(db: Database, policies: PolicyStore) -> SchemaRegistry:
    return SchemaRegistry(db, policies=policies)


def test_the_registry_refuses_an_incompatible_version_under_the_service_default_full(
    registry: SchemaRegistry,
) -> None:
    assert registry.put_for_producer(ORDERS, avro(V1)) == 0
    assert registry.compatibility(ORDERS, avro(WITHOUT_DEFAULT))[1] == "FULL"
    with pytest.raises(IncompatibleSchema, match="strategy FULL"):
        registry.put_for_producer(ORDERS, avro(WITHOUT_DEFAULT))
    with pytest.raises(IncompatibleSchema, match="strategy FULL"):
        registry.put(ORDERS, avro(WITHOUT_DEFAULT))  # an admin's upload too
    assert [v.version for v in registry.versions(ORDERS)] == [0]  # nothing added
    assert registry.compatibility(ORDERS, avro(WITH_DEFAULT)) == (None, "FULL")
    assert registry.put_for_producer(ORDERS, avro(WITH_DEFAULT)) == 1
    # The same definition, spaced otherwise and with other properties, is its old version.
    again = SchemaInfo("AVRO", json.dumps(V1, indent=4).encode(), {"k": "v"})
    assert registry.put_for_producer(ORDERS, again) == 0


def test_topic_over_namespace_over_the_service_and_undefined_inherits(
    registry: SchemaRegistry, policies: PolicyStore
) -> None:
    namespace, topic = Scope.namespace_of("public", "default"), Scope.topic_of(ORDERS)
    policies.set(namespace, schemaCompatibilityStrategy="BACKWARD")
    assert registry.strategy(ORDERS) == "BACKWARD"
    policies.set(topic, schemaCompatibilityStrategy="ALWAYS_COMPATIBLE")
    assert registry.strategy(ORDERS) == "ALWAYS_COMPATIBLE"
    # A partition takes its partitioned topic's.
    assert registry.strategy(partition(ORDERS, 1)) == "ALWAYS_COMPATIBLE"
    policies.set(topic, schemaCompatibilityStrategy="UNDEFINED")  # unset: the namespace's again
    assert registry.strategy(ORDERS) == "BACKWARD"
    assert policies.get(topic).schemaCompatibilityStrategy is None
    with pytest.raises(InvalidInput):
        validate("schemaCompatibilityStrategy", "SOMETIMES")


def test_without_auto_update_producers_use_only_the_versions_an_admin_uploaded(
    registry: SchemaRegistry, policies: PolicyStore
) -> None:
    policies.set(Scope.namespace_of("public", "default"), isAllowAutoUpdateSchema=False)
    with pytest.raises(IncompatibleSchema, match=AUTO_UPDATE_DISABLED):
        registry.put_for_producer(ORDERS, avro(V1))
    assert registry.put(ORDERS, avro(V1)) == 0  # an admin's upload
    assert registry.put_for_producer(ORDERS, avro(V1)) == 0
    with pytest.raises(IncompatibleSchema, match=AUTO_UPDATE_DISABLED):
        registry.put_for_producer(ORDERS, avro(WITH_DEFAULT))


def test_a_consumer_schema_is_checked_or_becomes_the_first_on_an_idle_topic(
    registry: SchemaRegistry, policies: PolicyStore
) -> None:
    with pytest.raises(IncompatibleSchema, match="active topic"):
        registry.for_consumer(ORDERS, avro(V1), active=True)
    assert registry.versions(ORDERS) == []
    registry.for_consumer(ORDERS, avro(V1), active=False)
    assert [v.info.data for v in registry.versions(ORDERS)] == [avro(V1).data]
    registry.for_consumer(ORDERS, avro(WITH_DEFAULT), active=True)  # reads V1's data; not kept
    with pytest.raises(IncompatibleSchema):
        registry.for_consumer(ORDERS, avro(WITHOUT_DEFAULT), active=True)
    assert len(registry.versions(ORDERS)) == 1
    other = TopicName("public", "default", "other")
    policies.set(Scope.topic_of(other), schemaCompatibilityStrategy="ALWAYS_COMPATIBLE")
    registry.for_consumer(other, avro(V1), active=True)  # accepted, nothing kept
    assert registry.versions(other) == []


def test_validation_enforced_refuses_a_producer_without_schema_on_a_topic_with_one(
    registry: SchemaRegistry, policies: PolicyStore
) -> None:
    registry.for_producer_without_schema(ORDERS)
    registry.put_for_producer(ORDERS, avro(V1))
    registry.for_producer_without_schema(ORDERS)  # not enforced by default
    policies.set(Scope.topic_of(ORDERS), schemaValidationEnforced=True)
    with pytest.raises(IncompatibleSchema, match=SCHEMA_REQUIRED):
        registry.for_producer_without_schema(ORDERS)
    registry.for_producer_without_schema(TopicName("public", "default", "schemaless"))
