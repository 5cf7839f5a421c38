"""The shapes of Iceberg's REST catalog protocol (``api.routes.iceberg``), as the protocol's
OpenAPI document (apache/iceberg ``open-api/rest-catalog-open-api.yaml``) names their fields:
kebab-case where it has them (``metadata-location``, ``next-page-token``).

Errors are the protocol's ``{"error": {"message", "type", "code"}}``, with the service's own
``reason`` beside it (the same sentence), so that a client of either kind reads it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: The routes the catalog serves, as a config response advertises them (Java's client calls
#: only what is listed: no views, no writes).
ENDPOINTS = (
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
)


class _Kebab(BaseModel):
    model_config = ConfigDict(populate_by_name=True)


class CatalogConfigOut(_Kebab):
    """``GET /v1/config``: no prefix, nothing for the client to change, the routes served."""

    defaults: dict[str, str] = {}
    overrides: dict[str, str] = {}
    endpoints: list[str] = list(ENDPOINTS)


class NamespacesOut(_Kebab):
    """``GET /v1/namespaces``: the namespaces directly under ``parent`` (the tenants without)."""

    namespaces: list[list[str]]
    next_page_token: str | None = Field(default=None, serialization_alias="next-page-token")


class NamespaceOut(_Kebab):
    """``GET /v1/namespaces/{namespace}``: a namespace has no properties of its own here."""

    namespace: list[str]
    properties: dict[str, str] = {}


class TableIdentifierOut(_Kebab):
    namespace: list[str]
    name: str


class TablesOut(_Kebab):
    """``GET /v1/namespaces/{namespace}/tables``: the tables the role may see."""

    identifiers: list[TableIdentifierOut]
    next_page_token: str | None = Field(default=None, serialization_alias="next-page-token")


class StorageCredentialOut(_Kebab):
    """FileIO properties for the files under ``prefix``."""

    prefix: str
    config: dict[str, str]


class LoadTableOut(_Kebab):
    """``GET /v1/namespaces/{namespace}/tables/{table}``: Iceberg's LoadTableResult. ``metadata``
    is the table's metadata file as stored; ``config`` the FileIO properties an engine reads
    the files with (the bucket's endpoint and keys when the ledgers are in one), and the same
    per directory of the bucket as ``storage-credentials``."""

    metadata_location: str = Field(alias="metadata-location")
    metadata: dict[str, Any]
    config: dict[str, str] = {}
    storage_credentials: list[StorageCredentialOut] | None = Field(
        default=None, serialization_alias="storage-credentials"
    )


class IcebergErrorModel(BaseModel):
    message: str
    type: str
    code: int


class IcebergErrorOut(BaseModel):
    """Every error under ``/iceberg``: Iceberg's ErrorModel, and ``reason`` as elsewhere."""

    error: IcebergErrorModel
    reason: str


#: Iceberg's exception type of each status (what its clients raise for it).
ERROR_TYPES = {
    400: "BadRequestException",
    401: "NotAuthorizedException",
    403: "ForbiddenException",
    404: "NotFoundException",
    405: "UnsupportedOperationException",
    413: "BadRequestException",
    500: "InternalServerError",
    503: "ServiceUnavailableException",
}


def iceberg_error(status: int, reason: str, error_type: str | None = None) -> dict[str, Any]:
    """The body of an error under ``/iceberg``."""
    kind = error_type or ERROR_TYPES.get(status, "RESTException")
    return {"error": {"message": reason, "type": kind, "code": status}, "reason": reason}
