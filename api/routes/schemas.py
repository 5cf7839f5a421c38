"""Pulsar's schema registry at its admin paths (``/admin/v2/schemas/...``): the versions of a
topic's schema, read by anyone who may look the topic up, uploaded, checked for compatibility and
deleted by its tenant's admins (``service.schemas``)."""

from __future__ import annotations

import base64
from typing import Annotated, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from api.deps import CanLookup, SchemasDep, TenantAdmin, TenantsDep, TopicDep
from service.errors import InvalidInput
from service.schemas import MAX_SCHEMA_BYTES, SCHEMA_TYPES, SchemaInfo, StoredSchema

router = APIRouter(prefix="/admin/v2/schemas/{tenant}/{namespace}/{topic}", tags=["schemas"])


SchemaType = Literal[SCHEMA_TYPES]  # type: ignore[valid-type]


class SchemaOut(BaseModel):
    """One version of a topic's schema, as Pulsar's ``GetSchemaResponse``."""

    version: int
    type: str
    timestamp: int = Field(description="When this version was added, ms since the epoch")
    data: str | None = Field(description="The definition as text (null when it is not UTF-8)")
    dataBase64: str = Field(description="The definition's exact bytes, base64")
    properties: dict[str, str]


class AllSchemasOut(BaseModel):
    getSchemaResponses: list[SchemaOut]


class SchemaIn(BaseModel):
    """A schema to add, as Pulsar's ``PostSchemaPayload``."""

    type: SchemaType
    schema_: str = Field(alias="schema", max_length=MAX_SCHEMA_BYTES, description="The definition")
    properties: dict[str, str] = Field(default_factory=dict, max_length=256)


class CompatibilityOut(BaseModel):
    """Pulsar's ``IsCompatibilityResponse``: whether the topic would take the schema as its next
    version, under which strategy, and (beyond Pulsar's answer) why not."""

    isCompatibility: bool
    schemaCompatibilityStrategy: str
    reason: str | None = Field(default=None, description="Why the schema is refused (null when it is not)")


class VersionOut(BaseModel):
    version: int | None = Field(description="The version added or found (deleted: the last there was)")


def _out(s: StoredSchema) -> SchemaOut:
    try:
        text: str | None = s.info.data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return SchemaOut(
        version=s.version,
        type=s.info.type,
        timestamp=s.created_at,
        data=text,
        dataBase64=base64.b64encode(s.info.data).decode("ascii"),
        properties=s.info.properties,
    )


@router.get("/schema", dependencies=[CanLookup])
def get_latest_schema(name: TopicDep, schemas: SchemasDep) -> SchemaOut:
    """The latest version; 404 when the topic has no schema."""
    return _out(schemas.get(name))


@router.get("/schema/{version}", dependencies=[CanLookup])
def get_schema_version(
    name: TopicDep, schemas: SchemasDep, version: Annotated[int, Path(ge=0, le=2**63 - 1)]
) -> SchemaOut:
    return _out(schemas.get(name, version))


@router.get("/schemas", dependencies=[CanLookup])
def get_all_schemas(name: TopicDep, schemas: SchemasDep) -> AllSchemasOut:
    """Every version, oldest first (an empty list when the topic has none)."""
    return AllSchemasOut(getSchemaResponses=[_out(s) for s in schemas.versions(name)])


@router.post("/schema", dependencies=[TenantAdmin])
def post_schema(name: TopicDep, schemas: SchemasDep, tenants: TenantsDep, body: SchemaIn) -> VersionOut:
    """Add a version (or find the one the topic has with this definition); the namespace must
    exist, the topic need not yet. 409 when the topic's schema compatibility strategy refuses
    it, as Pulsar answers."""
    tenants.require_namespace(tenant=name.tenant, namespace=name.namespace)
    return VersionOut(version=schemas.put(name, _info(body)))


@router.post("/compatibility", dependencies=[TenantAdmin])
def test_compatibility(
    name: TopicDep, schemas: SchemasDep, tenants: TenantsDep, body: SchemaIn
) -> CompatibilityOut:
    """Whether the topic would take this schema as its next version under its strategy (the
    topic's, its namespace's or the service's); nothing changes."""
    tenants.require_namespace(tenant=name.tenant, namespace=name.namespace)
    reason, strategy = schemas.compatibility(name, _info(body))
    return CompatibilityOut(
        isCompatibility=reason is None, schemaCompatibilityStrategy=strategy, reason=reason
    )


def _info(body: SchemaIn) -> SchemaInfo:
    try:
        data = body.schema_.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate, which JSON can escape
        raise InvalidInput(f"the schema is not valid text: {e.reason}") from None
    return SchemaInfo(body.type, data, body.properties)


@router.delete("/schema", dependencies=[TenantAdmin])
def delete_schema(name: TopicDep, schemas: SchemasDep) -> VersionOut:
    """Forget every version (producers that declare a schema later start again at 0)."""
    return VersionOut(version=schemas.delete(name))
