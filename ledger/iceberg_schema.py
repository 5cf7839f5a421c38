"""The Iceberg schema of a compacted topic's table, its partition spec and its name mapping.

Columns, as users see them (ids fixed for the message columns, so every table has the same)::

    partition      int      the partition's index (-1: a non-partitioned topic); identity-
                            partitioned, held by no file: readers take it from each data file's
                            partition tuple
    ledger_id      long     the message id: ledger, entry, batch index (and partition)
    entry_id       long
    batch_index    int
    key            string
    value          binary
    properties     map<string, string>
    publish_time   long     ms since the epoch (Iceberg timestamps are in us: a long keeps the
    event_time     long     part files as they are)
    producer_name  string
    sequence_id    long
    ...            the typed value columns, if the topic has them (``RoundState.value_columns``)

The part files carry no field ids: the table property ``schema.name-mapping.default`` maps the
files' column names to the ids. Columns of the part files the table leaves out
(``is_tombstone``, ``batch_size``, ``deliver_at_time``, ``ordering_key``, ``schema_version``,
and any a later format adds) are mapped too, to ids no schema uses (``HIDDEN_ID_BASE`` + the
column's index in ``ledger.schema.COLUMNS``): pyiceberg refuses a file with a column the
mapping does not name; readers project them away. So are typed columns a later schema dropped,
kept with their old ids. A part written before a column existed reads null there.

Typed value columns change with the topic's schema: a column keeps its field id while its name
and type stay; one whose type changes, or a new one, gets new ids, and the table a new schema.
"""

from __future__ import annotations

import itertools

import pyarrow as pa
from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table.name_mapping import (
    MappedField,
    NameMapping,
    create_mapping_from_schema,
    parse_mapping_from_json,
)
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    IcebergType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    StringType,
)

from ledger import schema as cols

PARTITION = "partition"
PARTITION_ID = 1
LEDGER_ID_ID = 2
ENTRY_ID_ID = 3
NAME_MAPPING = "schema.name-mapping.default"
# Partition field ids start at 1000 (Iceberg's convention, which engines assume).
PARTITION_FIELD_ID = 1000

MESSAGE_FIELDS: tuple[NestedField, ...] = (
    NestedField(PARTITION_ID, PARTITION, IntegerType(), required=False),
    NestedField(LEDGER_ID_ID, cols.LEDGER_ID, LongType(), required=True),
    NestedField(ENTRY_ID_ID, cols.ENTRY_ID, LongType(), required=True),
    NestedField(4, cols.BATCH_INDEX, IntegerType(), required=False),
    NestedField(5, cols.KEY, StringType(), required=False),
    NestedField(6, cols.VALUE, BinaryType(), required=False),
    NestedField(
        7, cols.PROPERTIES, MapType(12, StringType(), 13, StringType(), value_required=False), required=False
    ),
    NestedField(8, cols.PUBLISH_TIME, LongType(), required=True),
    NestedField(9, cols.EVENT_TIME, LongType(), required=False),
    NestedField(10, cols.PRODUCER_NAME, StringType(), required=False),
    NestedField(11, cols.SEQUENCE_ID, LongType(), required=False),
)
MESSAGE_LAST_COLUMN_ID = 13
# Ids of the part files' columns the table does not show (never assigned to a table column).
HIDDEN_ID_BASE = 1_000_000
MESSAGE_SCHEMA = Schema(*MESSAGE_FIELDS, schema_id=0)

SPEC = PartitionSpec(
    PartitionField(
        source_id=PARTITION_ID, field_id=PARTITION_FIELD_ID, transform=IdentityTransform(), name=PARTITION
    ),
    spec_id=0,
)


def _shape(field: NestedField) -> tuple[bool, IcebergType]:
    """A field's requiredness and type with its nested ids renumbered from 1, to compare
    two fields' types whatever ids they were given."""
    counter = itertools.count(1)
    renumbered = assign_fresh_schema_ids(Schema(field), lambda: next(counter))
    only = renumbered.fields[0]
    return only.required, only.field_type


def table_schema(
    value_columns: pa.Schema | None, current: Schema | None, last_column_id: int
) -> tuple[Schema, int]:
    """The schema for a round with typed ``value_columns`` (None: none), given the table's
    ``current`` schema (None: a new table) and its last assigned column id; returns the schema
    (``current`` itself when nothing changed) and the new last column id. ``ValueError`` when
    a typed column has a message column's name."""
    typed: list[NestedField] = []
    if value_columns is not None and len(value_columns):
        converted = _pyarrow_to_schema_without_ids(value_columns)
        taken = {f.name for f in MESSAGE_FIELDS}
        counter = itertools.count(last_column_id + 1)
        for field in converted.fields:
            if field.name in taken:
                raise ValueError(f"a typed value column is named {field.name!r}, as a message column is")
            field = field.model_copy(update={"required": False})  # a value that does not decode is null
            old = (
                current.find_field(field.name)
                if current is not None and field.name in _names(current)
                else None
            )
            if old is not None and old.field_id > MESSAGE_LAST_COLUMN_ID and _shape(old) == _shape(field):
                typed.append(old)
                continue
            fresh = assign_fresh_schema_ids(Schema(field), lambda: next(counter)).fields[0]
            typed.append(fresh)
            last_column_id = max(last_column_id, _highest_id(fresh))
    fields = (*MESSAGE_FIELDS, *typed)
    if current is not None and tuple(current.fields) == fields:
        return current, last_column_id
    schema_id = 0 if current is None else current.schema_id + 1
    return Schema(*fields, schema_id=schema_id), max(last_column_id, MESSAGE_LAST_COLUMN_ID)


def _names(schema: Schema) -> set[str]:
    return {f.name for f in schema.fields}


def _highest_id(field: NestedField) -> int:
    return Schema(field).highest_field_id


def name_mapping_json(schema: Schema, previous: str | None = None) -> str:
    """``schema.name-mapping.default``: the part files' column names to ``schema``'s ids, the
    hidden ledger columns to theirs, and the top-level names of ``previous`` (the table's
    mapping so far) that ``schema`` no longer has to their old ids."""
    fields = list(create_mapping_from_schema(schema))
    names = {name for f in fields for name in f.names}
    for i, column in enumerate(cols.COLUMNS):
        if column not in names:
            fields.append(MappedField.model_validate({"field-id": HIDDEN_ID_BASE + i, "names": [column]}))
            names.add(column)
    if previous:
        for old in parse_mapping_from_json(previous):
            if not names.intersection(old.names):
                fields.append(old)
                names.update(old.names)
    return NameMapping(fields).model_dump_json()
