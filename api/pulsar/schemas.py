"""Schemas on the wire: what PRODUCER and SUBSCRIBE declare, GET_SCHEMA and
GET_OR_CREATE_SCHEMA (``service.schemas`` keeps them)."""

from __future__ import annotations

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.connection import Handler, PulsarConnection
from api.pulsar.errors import ProtocolError, server_error
from api.pulsar.framing import Frame
from api.pulsar.non_persistent import topic_name as non_persistent_name
from service.authorization import Rule
from service.errors import InvalidInput, NotFound, ServiceError
from service.names import TopicName
from service.non_persistent import is_non_persistent
from service.schemas import SCHEMA_TYPES, SchemaInfo, StoredSchema, parse_version, version_bytes

# Types a client declares that are not a schema to keep: raw bytes (``None``), and the
# placeholders of consumers and producers that take whatever the topic has.
_NOT_KEPT = {pb.Schema.Type.Value("None"), pb.Schema.AutoConsume, pb.Schema.External}


def declared(schema: pb.Schema) -> SchemaInfo | None:
    """The schema a PRODUCER, SUBSCRIBE or GET_OR_CREATE_SCHEMA declares; None for raw bytes.
    A schema the registry refuses is Pulsar's IncompatibleSchema."""
    if schema.type in _NOT_KEPT:
        return None
    if not 0 < schema.type < len(SCHEMA_TYPES):
        raise ProtocolError(pb.IncompatibleSchema, f"unknown schema type {schema.type}")
    try:
        return SchemaInfo(
            SCHEMA_TYPES[schema.type], bytes(schema.schema_data), {p.key: p.value for p in schema.properties}
        )
    except InvalidInput as e:
        raise ProtocolError(pb.IncompatibleSchema, str(e)) from None


def as_wire(name: TopicName, stored: StoredSchema) -> pb.Schema:
    return pb.Schema(
        name=str(name),
        schema_data=stored.info.data,
        type=SCHEMA_TYPES.index(stored.info.type),
        properties=[pb.KeyValue(key=k, value=v) for k, v in stored.info.properties.items()],
    )


async def producer_schema(conn: PulsarConnection, name: TopicName, schema: pb.Schema | None) -> bytes | None:
    """The version a producer's schema has in the topic's history (added as the next one if
    new and the topic's compatibility strategy admits it), as the 8 bytes the client then puts
    in every message; None without a schema (refused where the topic enforces its schema)."""
    info = declared(schema) if schema is not None else None
    if info is None:
        await conn.call(conn.ctx.schemas.for_producer_without_schema, name)
        return None
    return version_bytes(await conn.call(conn.ctx.schemas.put_for_producer, name, info))


async def consumer_schema(conn: PulsarConnection, name: TopicName, schema: pb.Schema | None) -> None:
    """A consumer's schema: checked against the topic's (Pulsar's rules for consumers), or the
    topic's first if it has none and is idle: no message stored and no producer connected."""
    info = declared(schema) if schema is not None else None
    if info is None:
        return
    active = conn.ctx.access.has_producers(name) or await conn.call(_has_data, conn, name)
    await conn.call(conn.ctx.schemas.for_consumer, name, info, active=active)


def _has_data(conn: PulsarConnection, name: TopicName) -> bool:
    try:
        return conn.ctx.broker.last_message_id(name, read_compacted=False) is not None
    except NotFound:
        return False


async def get_schema(conn: PulsarConnection, frame: Frame) -> None:
    """A version of the topic's schema (the latest without one): what a client asks to decode
    a message written with another version than its own, or an AUTO_CONSUME consumer."""
    req = frame.command.getSchema
    try:
        if is_non_persistent(req.topic):
            raise NotFound("no schema is kept for a non-persistent topic")  # answered as one without
        name = conn.topic_name(req.topic)
        conn.authorize(Rule.PRODUCE_OR_CONSUME, name)
        try:
            version = parse_version(req.schema_version) if req.HasField("schema_version") else None
        except InvalidInput as e:
            raise ProtocolError(pb.NotAllowedError, str(e)) from None
        stored = await conn.call(conn.ctx.schemas.get, name, version)
    except NotFound:
        conn.send(
            pb.BaseCommand.GET_SCHEMA_RESPONSE,
            request_id=req.request_id,
            error_code=pb.TopicNotFound,
            error_message="Topic not found or no-schema",  # Pulsar's words: clients match them
        )
        return
    except (ServiceError, ProtocolError) as e:
        conn.send(
            pb.BaseCommand.GET_SCHEMA_RESPONSE,
            request_id=req.request_id,
            error_code=server_error(e),
            error_message=str(e),
        )
        return
    conn.send(
        pb.BaseCommand.GET_SCHEMA_RESPONSE,
        request_id=req.request_id,
        schema=as_wire(name, stored),
        schema_version=version_bytes(stored.version),
    )


async def get_or_create_schema(conn: PulsarConnection, frame: Frame) -> None:
    """The version of a schema in the topic's history, added if new (a producer's right)."""
    req = frame.command.getOrCreateSchema
    try:
        if is_non_persistent(req.topic):
            # Taken as given, not kept (api.pulsar.non_persistent): no version to name.
            conn.authorize(Rule.PRODUCE, non_persistent_name(req.topic))
            version = None
        else:
            name = conn.topic_name(req.topic)
            conn.authorize(Rule.PRODUCE, name)
            version = await producer_schema(conn, name, req.schema)
    except (ServiceError, ProtocolError) as e:
        conn.send(
            pb.BaseCommand.GET_OR_CREATE_SCHEMA_RESPONSE,
            request_id=req.request_id,
            error_code=server_error(e),
            error_message=str(e),
        )
        return
    # Empty for raw bytes (no schema kept), as Pulsar's broker answers: the Java client reads it
    # unguarded and takes an empty version for "the topic has no schema".
    conn.send(
        pb.BaseCommand.GET_OR_CREATE_SCHEMA_RESPONSE, request_id=req.request_id, schema_version=version or b""
    )


HANDLERS: dict[int, Handler] = {
    pb.BaseCommand.GET_SCHEMA: get_schema,
    pb.BaseCommand.GET_OR_CREATE_SCHEMA: get_or_create_schema,
}
