"""The OpenAPI document at ``/openapi.json``, made to tell the truth about the service.

FastAPI's document knows the routes' parameters, bodies and success replies; it does not know
what this service adds around them, so it is completed here, in one place:

- every error status a route can answer, with its JSON shape (``{"reason": ...}``): 400 for a
  bad name or an encoded slash (``api.guard``) on every route, 413 for a request over the size
  limit, 404 where a path names something, 409 on changes, 422 for a malformed query or body;
  401 and 403 when authentication is on, with the bearer security scheme;
- name parameters (tenant, namespace, topic, subscription) with the pattern and length limits
  ``service.names`` enforces;
- schemas that a route hands over whole (the produce body) moved to ``components`` so that
  every ``$ref`` resolves;
- the column page a read may answer with (``format=columns``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.schemas import ErrorOut
from service.names import PARTITION_SUFFIX
from service.schema_compat import STRATEGIES

# A name part: 1-128 of [A-Za-z0-9_.=-], never "." or ".." (service.names), without a lookahead
# so that every generator of strings from patterns can use it.
NAME_PATTERN = (
    r"^([A-Za-z0-9_=-][A-Za-z0-9_.=-]{0,127}|\.[A-Za-z0-9_=-][A-Za-z0-9_.=-]{0,126}"
    r"|\.\.[A-Za-z0-9_.=-]{1,126})$"
)
# A subscription: a name part that does not start with "__" (reserved for the service's own).
SUBSCRIPTION_PATTERN = (
    r"^([A-Za-z0-9=-][A-Za-z0-9_.=-]{0,255}|_[A-Za-z0-9.=-][A-Za-z0-9_.=-]{0,254}|_"
    r"|\.[A-Za-z0-9_=-][A-Za-z0-9_.=-]{0,254}|\.\.[A-Za-z0-9_.=-]{1,254})$"
)
_NAME_LIMITS = {
    "tenant": {"pattern": NAME_PATTERN, "minLength": 1, "maxLength": 128},
    "namespace": {"pattern": NAME_PATTERN, "minLength": 1, "maxLength": 128},
    "topic": {"pattern": NAME_PATTERN, "minLength": 1, "maxLength": 128},
    "sub": {"pattern": SUBSCRIPTION_PATTERN, "minLength": 1, "maxLength": 256},
}
# A dead letter topic: a topic name, alone or with the topic's own tenant and namespace (which
# the route checks), with or without ``persistent://`` (service.dead_letters).
_PART = NAME_PATTERN[1:-1]
DEAD_LETTER_TOPIC_PATTERN = rf"^(persistent://)?({_PART}/{_PART}/)?({_PART})$"
# A message id as the service writes it ("L:E", a Pulsar batch's member "L:E:i"), or where a
# read or seek may start.
MESSAGE_ID_PATTERN = r"^[0-9]{1,18}:[0-9]{1,18}(:[0-9]{1,9})?$"
POSITION_PATTERN = r"^(earliest|latest|[0-9]{1,18}:[0-9]{1,18}(:[0-9]{1,9})?)$"
BASE64_PATTERN = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_POSITION = {"type": "string", "pattern": POSITION_PATTERN, "maxLength": 64}
_WHOLE = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


# Bodies whose rules the route checks itself (service.policies.validate, the seek's "one of"):
# written out here so that a body the document allows is one the service accepts.
POLICY_BODY: dict[str, Any] = {
    "title": "PolicyUpdate",
    "type": "object",
    "description": "Fields to set; a field given as null is unset (inherits again).",
    "additionalProperties": False,
    "properties": {
        "compactionThreshold": _nullable(_WHOLE),
        "minCleanableDirtyRatio": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "maxCompactionLagMs": _nullable(_WHOLE),
        "minCompactionLagMs": _nullable(_WHOLE),
        "deleteRetentionMs": _nullable(_WHOLE),
        "retainNullKey": _nullable({"type": "boolean"}),
        "compactionStrategy": _nullable(
            {"type": "string", "pattern": r"^(offset|eventTime|property:[A-Za-z0-9_.\-]{1,128})$"}
        ),
        "retentionTimeMs": _nullable(_WHOLE),
        "retentionSizeBytes": _nullable(_WHOLE),
        "deduplicationEnabled": _nullable({"type": "boolean"}),
        "schemaCompatibilityStrategy": _nullable({"type": "string", "enum": list(STRATEGIES)}),
        "isAllowAutoUpdateSchema": _nullable({"type": "boolean"}),
        "schemaValidationEnforced": _nullable({"type": "boolean"}),
        "table": _nullable({"type": "boolean"}),
    },
}
SCHEMA_PATCHES: dict[str, dict[str, Any]] = {
    "SeekRequest": {
        "title": "SeekRequest",
        "description": "Exactly one of messageId and publishTime.",
        "oneOf": [
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["messageId"],
                "properties": {"messageId": _POSITION},
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["publishTime"],
                "properties": {"publishTime": _WHOLE},
            },
        ],
    },
}
_ERROR_REF = {"$ref": "#/components/schemas/ErrorOut"}
_VALIDATION_REF = {"$ref": "#/components/schemas/ValidationErrorOut"}
_ICEBERG_ERROR_REF = {"$ref": "#/components/schemas/IcebergErrorOut"}
_DESCRIPTIONS = {
    400: "Invalid name, value or request",
    401: "No token, or a token that is malformed, wrongly signed, expired or not yet valid",
    403: "The role is not authorized to do this",
    404: "No such tenant, namespace, topic, subscription or consumer",
    409: "Exists already, not empty, or busy (a compaction runs, a consumer is attached)",
    413: "A message or the request over the size limit",
    422: "The query or body does not have the expected shape",
    503: "Out of a resource for now, or (several instances) the topic is changing owners: retry",
}
# With several instances, a request for a topic another instance owns is redirected there.
_REDIRECT = {
    "description": "Another instance owns the topic: the same request at its URL (Location)",
    "headers": {"Location": {"schema": {"type": "string"}, "description": "The request at the owner"}},
    "content": {"application/json": {"schema": _ERROR_REF}},
}
# What a route that reads stored data may answer besides (``responses=`` on the route): a
# damaged file is a 500 with a reason naming topic, ledger and check; a damaged compacted
# ledger being rebuilt is a 503 with Retry-After (README, "Integrity and repair").
DAMAGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    500: {"description": "A stored file failed an integrity check: the reason names topic, ledger and check"},
    503: {"description": "Unavailable for now (a damaged compacted ledger is rebuilt, a full seal backlog)"},
}

# Routes anyone may call, with or without authentication: liveness, and the dashboard's page,
# script and styles (they hold no data; the page sends a token with every call it makes).
# /metrics too, unless authenticateMetricsEndpoint (see install_openapi).
OPEN_PATHS = frozenset(
    {"/health", "/dashboard/", "/dashboard/topics/{tenant}/{namespace}/{topic}", "/dashboard/static/{file}"}
)

COLUMNS_PAGE: dict[str, Any] = {
    "title": "ColumnsPage",
    "type": "object",
    "description": "A page of messages as columns (format=columns): one array per field.",
    "required": ["count", "ledgerIds", "entryIds", "keys", "valueLengths", "values", "publishTimes"],
    "properties": {
        "count": {"type": "integer"},
        "ledgerIds": {"type": "array", "items": {"type": "integer"}},
        "entryIds": {"type": "array", "items": {"type": "integer"}},
        "keys": {"type": "array", "items": {"type": ["string", "null"]}},
        "valueLengths": {"type": "array", "items": {"type": "integer"}},
        "values": {"type": "string", "description": "The non-null values end to end, base64."},
        "properties": {"type": ["array", "null"], "items": {"type": "object"}},
        "publishTimes": {"type": "array", "items": {"type": "integer"}},
        "eventTimes": {"type": ["array", "null"], "items": {"type": ["integer", "null"]}},
        "redeliveryCounts": {"type": ["array", "null"], "items": {"type": "integer"}},
        "batchIndexes": {
            "type": ["array", "null"],
            "items": {"type": ["integer", "null"]},
            "description": "A Pulsar batch member's index in its batch (its id is ledgerId:"
            "(entryId - batchIndex):batchIndex); null for the other messages, or for a page without any.",
        },
        "nextMessageId": {"type": ["string", "null"]},
    },
}


#: The security scheme of each authentication provider (``service.authentication``).
_SECURITY_SCHEMES: dict[str, tuple[str, dict[str, str]]] = {
    "token": ("bearerAuth", {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}),
    "basic": ("basicAuth", {"type": "http", "scheme": "basic"}),
    "tls": ("clientCertificate", {"type": "mutualTLS"}),
}
#: The schemes a 401's ``WWW-Authenticate`` names (a client certificate has none).
_CHALLENGES = {"token": "Bearer", "basic": "Basic"}


def install_openapi(
    app: FastAPI,
    *,
    secured: bool,
    metrics_open: bool = True,
    max_partitions: int = 256,
    methods: Sequence[str] = ("token",),
    anonymous: bool = False,
) -> None:
    """Serve the completed document (built once, on first request, as FastAPI's). ``methods``
    are the authentication providers served (each a security scheme); with ``anonymous`` a
    request without credentials is one of the alternatives too."""
    open_paths = OPEN_PATHS | {"/metrics"} if metrics_open else OPEN_PATHS

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            app.openapi_schema = complete(
                doc, secured=secured, open_paths=open_paths, methods=methods, anonymous=anonymous
            )
            _partition_bounds(app.openapi_schema, max_partitions)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(
    doc: dict[str, Any],
    *,
    secured: bool,
    open_paths: frozenset[str] = OPEN_PATHS,
    methods: Sequence[str] = ("token",),
    anonymous: bool = False,
) -> dict[str, Any]:
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    _hoist_defs(doc, schemas)
    schemas["ErrorOut"] = ErrorOut.model_json_schema()
    schemas["ValidationErrorOut"] = {
        "title": "ValidationErrorOut",
        "type": "object",
        "required": ["reason"],
        "properties": {
            "reason": {"type": "string"},
            "detail": {"type": "array", "items": {"type": "object"}},
        },
    }
    schemas["ColumnsPage"] = COLUMNS_PAGE
    schemas.update(SCHEMA_PATCHES)
    _patch_properties(schemas)
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    if secured:
        schemas_root = doc["components"]
        schemas_root["securitySchemes"] = {
            name: scheme for method, (name, scheme) in _SECURITY_SCHEMES.items() if method in methods
        }
    security: list[dict[str, list[str]]] = [
        {_SECURITY_SCHEMES[m][0]: []} for m in methods if m in _SECURITY_SCHEMES
    ]
    if anonymous:
        security.append({})  # no credentials: the anonymous role
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            _complete_operation(
                path,
                method.upper(),
                op,
                secured=secured and path not in open_paths,
                security=security,
                challenge=", ".join(_CHALLENGES[m] for m in methods if m in _CHALLENGES),
            )
    return doc


def _complete_operation(
    path: str,
    method: str,
    op: dict[str, Any],
    *,
    secured: bool,
    security: list[dict[str, list[str]]] | None = None,
    challenge: str = "Bearer",
) -> None:
    for param in op.get("parameters", ()):
        if param.get("in") == "path" and param["name"] in _NAME_LIMITS:
            param["schema"] = {**param.get("schema", {}), "type": "string", **_NAME_LIMITS[param["name"]]}
        elif param.get("name") == "startMessageId":
            param["schema"] = {**param["schema"], **_POSITION}
    responses = op.setdefault("responses", {})
    # The table catalog answers Iceberg's ErrorModel, and a malformed query is its 400.
    iceberg = path.startswith("/iceberg/")
    statuses = {400, 413}
    if "{" in path:
        statuses.add(404)
    if method != "GET" and not iceberg:
        statuses.add(409)
    if iceberg:
        responses.pop("422", None)  # FastAPI's own: a malformed query is the catalog's 400
    elif op.get("parameters") or "requestBody" in op:
        statuses.add(422)
    if secured:
        statuses |= {401, 403}
        op["security"] = security if security is not None else [{"bearerAuth": []}]
    if "{topic}" in path and not path.startswith("/dashboard/topics/"):
        statuses.add(503)
        if not path.startswith("/lookup/"):  # a lookup answers the owner instead
            responses.setdefault("307", _REDIRECT)
    for status in sorted(statuses):
        ref = _VALIDATION_REF if status == 422 else _ICEBERG_ERROR_REF if iceberg else _ERROR_REF
        described = responses.get(str(status), {}).get("description") if iceberg else None
        responses[str(status)] = {
            "description": described or _DESCRIPTIONS[status],
            "content": {"application/json": {"schema": ref}},
        }
        if status == 401:
            responses["401"]["headers"] = {
                "WWW-Authenticate": {"schema": {"type": "string"}, "description": challenge or "Bearer"}
            }
    for code in ("500", "503"):
        declared = responses.get(code)
        if declared is not None and "content" not in declared:
            declared["content"] = {"application/json": {"schema": _ERROR_REF}}
    body = op.get("requestBody", {}).get("content", {}).get("application/json")
    if body is not None:
        if path.endswith("/compactionPolicy"):
            body["schema"] = POLICY_BODY
        elif path.endswith("/compactionThreshold"):
            body["schema"] = {
                **_nullable(_WHOLE),
                "title": "CompactionThreshold",
                "description": "Bytes; 0: off; null: unset.",
            }
        elif path.endswith(("/deduplication", "/deduplicationEnabled")):
            body["schema"] = {
                **_nullable({"type": "boolean"}),
                "title": "Deduplication",
                "description": "Pulsar's producer deduplication on or off; null: unset.",
            }
        elif path.endswith("/schemaCompatibilityStrategy"):
            body["schema"] = {
                **_nullable({"type": "string", "enum": list(STRATEGIES)}),
                "title": "SchemaCompatibilityStrategy",
                "description": "Pulsar's strategy; UNDEFINED or null: unset (inherit).",
            }
        elif path.endswith(("/isAllowAutoUpdateSchema", "/schemaValidationEnforced")):
            body["schema"] = {
                **_nullable({"type": "boolean"}),
                "title": "Switch",
                "description": "null: unset.",
            }
        elif "messages" in body["schema"].get("properties", {}):  # the produce batch
            body["schema"]["properties"]["messages"]["minItems"] = 1
    if path.endswith("/messages") and method == "GET":
        ok = responses["200"]["content"]["application/json"]
        ok["schema"] = {"anyOf": [ok["schema"], {"$ref": "#/components/schemas/ColumnsPage"}]}


def _hoist_defs(node: Any, schemas: dict[str, Any]) -> None:
    """Move every ``$defs`` a hand-written schema carries into ``components/schemas`` and point
    its references there: ``#/$defs/X`` would resolve against the document root, where it is not."""
    if isinstance(node, dict):
        defs = node.pop("$defs", None)
        if defs:
            for name, schema in defs.items():
                _hoist_defs(schema, schemas)
                schemas.setdefault(name, schema)
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            node["$ref"] = "#/components/schemas/" + ref.removeprefix("#/$defs/")
        for v in node.values():
            _hoist_defs(v, schemas)
    elif isinstance(node, list):
        for v in node:
            _hoist_defs(v, schemas)


def _patch_properties(schemas: dict[str, Any]) -> None:
    """Patterns the models leave to the code that reads them: message ids and base64 values."""
    for shape in ("AckRequest", "NegativeAckRequest"):
        ack = schemas.get(shape)
        if ack:
            ack["properties"]["messageIds"]["items"] = {"type": "string", "pattern": MESSAGE_ID_PATTERN}
    reset = schemas.get("ResetCursor")
    if reset:
        reset["properties"]["messageId"] = _POSITION
    message = schemas.get("MessageIn")
    if message:
        message["properties"]["value"] = _nullable({"type": "string", "pattern": BASE64_PATTERN})
    dead_letters = schemas.get("DeadLetterPolicyBody")
    if dead_letters:
        dead_letters["properties"]["deadLetterTopic"] = _nullable(
            {"type": "string", "pattern": DEAD_LETTER_TOPIC_PATTERN, "minLength": 1, "maxLength": 400}
        )


def _partition_bounds(doc: dict[str, Any], max_partitions: int) -> None:
    """The bounds the routes that create or grow a partitioned topic apply, which depend on
    the service's setting: the count, and a name short enough for ``-partition-<N-1>``."""
    room = 128 - len(PARTITION_SUFFIX) - len(str(max_partitions - 1))
    for path, item in doc.get("paths", {}).items():
        if not path.endswith("/{topic}/partitions"):
            continue
        for method in ("put", "post"):
            op = item.get(method)
            if op is None:
                continue
            for param in op.get("parameters", ()):
                if param.get("in") == "path" and param["name"] == "topic":
                    param["schema"] = {**param["schema"], "maxLength": room}
            count: dict[str, Any] = {
                "type": "integer",
                "minimum": 1,
                "maximum": max_partitions,
                "title": "Partitions",
                "description": f"The number of partitions (at most {max_partitions}: "
                "COMPACTOR_MAX_PARTITIONS_PER_TOPIC)",
            }
            schema = count
            if method == "put":
                # A create takes Pulsar's PartitionedTopicMetadata too (api.routes.partitions),
                # under either of its media types.
                schema = {"anyOf": [count, _partitioned_metadata(count)]}
            for body in op["requestBody"]["content"].values():
                body["schema"] = schema


def _partitioned_metadata(count: dict[str, Any]) -> dict[str, Any]:
    """``api.schemas.PartitionedTopicMetadataIn`` with the service's bound on the count."""
    props = {
        "type": "object",
        "maxProperties": 256,
        "propertyNames": {"minLength": 1, "maxLength": 256},
        "additionalProperties": {"type": "string", "maxLength": 4096},
    }
    return {
        "title": "PartitionedTopicMetadata",
        "type": "object",
        "properties": {"partitions": count, "properties": _nullable(props)},
        "required": ["partitions"],
    }
