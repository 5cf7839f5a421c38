"""Request and response shapes of the REST API (Pulsar's names, camelCase on the wire)."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, with_config
from typing_extensions import TypedDict

from ledger.entry import ENCRYPTION_PROPERTY, Entry, Record
from service.chunked import CHUNK_PROPERTY
from service.errors import InvalidInput


@with_config(ConfigDict(extra="forbid"))
class MessageIn(TypedDict, total=False):
    """One message to produce; ``value`` is base64, null for a tombstone. Every field may be
    left out (a keyless message of no value)."""

    key: str | None
    value: str | None
    properties: dict[str, str]
    eventTime: Annotated[int, Field(ge=0)] | None


@with_config(ConfigDict(extra="forbid"))
class ProduceRequest(TypedDict):
    messages: list[MessageIn]


# A produce request is parsed into plain dicts, not models: a batch of a thousand messages
# then costs a fraction of the models' validation and of their garbage collection.
PRODUCE_REQUEST: TypeAdapter[ProduceRequest] = TypeAdapter(ProduceRequest)


def to_records(messages: list[MessageIn]) -> list[Record]:
    """The records of a produce request's messages; ``InvalidInput`` naming the first value
    that is not base64 (strict: the standard alphabet and padding, nothing else), or the first
    message with the property chunks of Pulsar's chunked messages are stored with."""
    a2b = binascii.a2b_base64
    records = []
    for index, m in enumerate(messages):
        value: bytes | None = None
        text = m.get("value")
        if text is not None:
            try:
                value = a2b(text, strict_mode=True)
            except (binascii.Error, ValueError):
                raise InvalidInput(f"messages[{index}].value is not valid base64") from None
        props = m.get("properties", {})
        for reserved in (ENCRYPTION_PROPERTY, CHUNK_PROPERTY):
            if props and reserved in props:
                # Pulsar's encryption context and chunk fields, which only the binary protocol's
                # producers send.
                raise InvalidInput(f"messages[{index}].properties: {reserved!r} is the service's own")
        records.append(Record(m.get("key"), value, props, 0, m.get("eventTime")))
    return records


class ProduceResponse(BaseModel):
    messageIds: list[str]
    # A partitioned topic's: the partition each message went to (its id is that partition's).
    partitions: list[int] | None = None


class EncryptionKeyOut(BaseModel):
    """A consumer key an encrypted message's data key is encrypted with (Pulsar's ``EncryptionKeys``)."""

    key: str
    value: str  # the encrypted data key, base64
    metadata: dict[str, str]


class EncryptionOut(BaseModel):
    """The encryption context of a message its Pulsar producer encrypted (``api.pulsar.encryption``):
    its value is the ciphertext. A later member of an encrypted batch has only
    ``batchFirstMessageId``, the member whose value is the whole batch's ciphertext."""

    keys: list[EncryptionKeyOut] | None = None
    algorithm: str | None = None
    param: str | None = None  # base64
    compression: str | None = None
    uncompressedSize: int | None = None
    batchSize: int | None = None
    batchFirstMessageId: str | None = None


class MessageOut(BaseModel):
    messageId: str
    key: str | None
    value: str | None
    properties: dict[str, str]
    publishTime: int
    eventTime: int | None
    # Only on a message a Pulsar producer encrypted.
    encryption: EncryptionOut | None = None

    @classmethod
    def of(cls, e: Entry) -> MessageOut:
        return cls(
            messageId=e.message_id,
            key=e.key,
            value=base64.b64encode(e.value).decode() if e.value is not None else None,
            properties=e.properties,
            publishTime=e.publish_time,
            eventTime=e.event_time,
        )


class ReadResponse(BaseModel):
    messages: list[MessageOut]
    nextMessageId: str | None


class LookupOut(BaseModel):
    """Pulsar's ``LookupData``: where the topic's owner serves it (``brokerUrl`` is its HTTP(S)
    URL too when it does not serve the binary protocol)."""

    brokerUrl: str
    brokerUrlTls: str | None = None
    httpUrl: str
    httpUrlTls: str | None = None
    # Legacy names Pulsar's broker still sends: nativeUrl is brokerUrl; brokerUrlSsl is always
    # empty, but older C++ clients (the Python client's core) fail a lookup that lacks it.
    nativeUrl: str
    brokerUrlSsl: str = ""


# A partition count: at least one, a Java int (Pulsar's field); the service's own limit is
# COMPACTOR_MAX_PARTITIONS_PER_TOPIC (400 above it).
PartitionCount = Annotated[int, Field(ge=1, le=2**31 - 1, description="The number of partitions")]
# A property of a partitioned topic: Pulsar bounds neither, the request size limit does; these
# bounds keep one row of metadata small.
_PropertyName = Annotated[str, Field(min_length=1, max_length=256)]
_PropertyValue = Annotated[str, Field(max_length=4096)]


class PartitionedTopicMetadataIn(BaseModel):
    """Pulsar's ``PartitionedTopicMetadata`` as its admin clients send it to create a partitioned
    topic with properties (Java's with ``application/vnd.partitioned-topic-metadata+json``, Go's
    pulsaradmin always); other fields it has (``deleted``) are ignored, as Pulsar ignores them."""

    model_config = ConfigDict(extra="ignore")

    partitions: PartitionCount
    properties: Annotated[dict[_PropertyName, _PropertyValue], Field(max_length=256)] | None = None


class PartitionedTopicMetadataOut(BaseModel):
    """A partitioned topic's metadata as Pulsar answers it: ``partitions`` (0 for any other
    name), and ``properties`` when it was created with some."""

    partitions: int
    properties: dict[str, str] | None = None


class Health(BaseModel):
    status: str  # "ok" or "degraded"
    reason: str | None = None  # why it is degraded
    # Whether compactions can run: "available", "starting", "on demand" (Spark starts with
    # the first round) or "unavailable: <one-line reason>".
    compaction: str
    # Present (true) while the start-up warm-up still runs Spark jobs in the background
    # (COMPACTOR_SPARK_WARMUP_JOBS): rounds run meanwhile, but share the cores with it.
    warmingUp: bool | None = None
    # pulsar://host:port while Pulsar's binary protocol listens (absent when it is off:
    # COMPACTOR_BROKER_SERVICE_PORT=0).
    brokerServiceUrl: str | None = None
    # pulsar+ssl://host:port while the binary protocol's TLS port listens
    # (COMPACTOR_BROKER_SERVICE_PORT_TLS), https://host:port of the REST API when it serves HTTPS.
    brokerServiceUrlTls: str | None = None
    webServiceUrlTls: str | None = None


# A role as a path segment: what token subjects look like (names, e-mail addresses, DNs
# without spaces), never a '/'.
ROLE_PATTERN = r"^[A-Za-z0-9_.,=@+:-]{1,256}$"
Action = Literal["produce", "consume"]
RoleName = Annotated[str, Field(min_length=1, max_length=256, pattern=ROLE_PATTERN)]


class TenantInfoBody(BaseModel):
    """A tenant's admin roles and allowed clusters (Pulsar's ``TenantInfo``)."""

    model_config = ConfigDict(extra="forbid")

    adminRoles: Annotated[list[RoleName], Field(max_length=1000)] = Field(default_factory=list)
    allowedClusters: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=1000)
    ] = Field(default_factory=list)


class NamespaceOut(BaseModel):
    name: str
    permissions: dict[str, list[str]]


class ErrorOut(BaseModel):
    """Every error: a sentence for people. Validation errors (422) add ``detail``."""

    reason: str
