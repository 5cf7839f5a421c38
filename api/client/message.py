"""Message ids, messages as received and as sent, and the page decoder (the column form of a
receive or a read)."""

from __future__ import annotations

import base64
import binascii
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from api.client.errors import ServerError

#: A ``send_many`` request holds at most this many messages ...
MAX_BATCH_MESSAGES = 1000
#: ... and about this many bytes of JSON (the server refuses requests over ``maxRequestBytes``).
MAX_BATCH_BYTES = 8 * 1024 * 1024


_MAX_ID = 2**63 - 1
_ID_STRUCT = struct.Struct(">Bqq")  # version, ledger id, entry id
assert _ID_STRUCT.size == 17
_ID_VERSION = 1


@dataclass(frozen=True, order=True, slots=True)
class MessageId:
    """A message's position ``(ledger_id, entry_id)``, ordered, written ``"L:E"``.

    A member of a Pulsar batch (sent by a Pulsar client) carries its ``batch_index`` too and is
    written as Pulsar names it, ``"L:B:i"``: the batch's entry ``B = entry_id - i`` and its index
    ``i``; the position alone orders and compares ids (``"L:B:i"`` and ``"L:E"`` with
    ``E = B + i`` are one message).

    ``MessageId.earliest`` and ``MessageId.latest`` are the sentinels Pulsar has; they order
    before and after every real id and are written ``"earliest"`` and ``"latest"``.
    ``serialize()`` gives bytes to store (a reader can be positioned by them later).
    """

    ledger_id: int
    entry_id: int
    batch_index: int | None = field(default=None, compare=False)

    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    def __post_init__(self) -> None:
        for v in (self.ledger_id, self.entry_id):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"message id parts are integers, not {type(v).__name__}")
        pair = (self.ledger_id, self.entry_id)
        if pair not in ((-1, -1), (_MAX_ID, _MAX_ID)) and not (
            0 <= self.ledger_id <= _MAX_ID and 0 <= self.entry_id <= _MAX_ID
        ):
            raise ValueError(f"message id out of range: {pair}")
        if self.batch_index is not None and not 0 <= self.batch_index <= self.entry_id:
            raise ValueError(f"batch index out of range: {self.batch_index} (entry {self.entry_id})")

    def __str__(self) -> str:
        if self == MessageId.earliest:
            return "earliest"
        if self == MessageId.latest:
            return "latest"
        if self.batch_index is not None:
            return f"{self.ledger_id}:{self.entry_id - self.batch_index}:{self.batch_index}"
        return f"{self.ledger_id}:{self.entry_id}"

    def __repr__(self) -> str:
        if self in (MessageId.earliest, MessageId.latest):
            return f"MessageId.{self}"
        if self.batch_index is not None:
            return f"MessageId({self.ledger_id}, {self.entry_id}, batch_index={self.batch_index})"
        return f"MessageId({self.ledger_id}, {self.entry_id})"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """``"L:E"``, a batch member's ``"L:B:i"``, ``"earliest"`` or ``"latest"``;
        ``ValueError`` for anything else."""
        if text == "earliest":
            return cls.earliest
        if text == "latest":
            return cls.latest
        parts = text.split(":")
        if not (2 <= len(parts) <= 3 and all(p.isdigit() and p.isascii() for p in parts)):
            raise ValueError(
                f"not a message id: {text!r} (expected 'ledgerId:entryId', 'ledgerId:entryId:batchIndex', "
                "'earliest', 'latest')"
            )
        if len(parts) == 3:
            index = int(parts[2])
            return cls(int(parts[0]), int(parts[1]) + index, index)
        return cls(int(parts[0]), int(parts[1]))

    def serialize(self) -> bytes:
        """17 bytes: a version byte, then ledger and entry id as big-endian signed 64-bit."""
        return _ID_STRUCT.pack(_ID_VERSION, self.ledger_id, self.entry_id)

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        """The inverse of ``serialize``; ``ValueError`` for bytes it did not produce."""
        if len(data) != _ID_STRUCT.size:
            raise ValueError(f"a serialized message id is {_ID_STRUCT.size} bytes, not {len(data)}")
        version, ledger, entry = _ID_STRUCT.unpack(data)
        if version != _ID_VERSION:
            raise ValueError(f"unknown serialized message id version {version}")
        return cls(ledger, entry)


MessageId.earliest = MessageId(-1, -1)
MessageId.latest = MessageId(_MAX_ID, _MAX_ID)

MessageIdLike: TypeAlias = MessageId | str


def _as_id(value: MessageIdLike | Message) -> MessageId:
    if isinstance(value, MessageId):
        return value
    if isinstance(value, Message):
        return value.id
    if isinstance(value, str):
        return MessageId.parse(value)
    raise TypeError(f"expected a Message, MessageId or 'L:E' string, not {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class Message:
    """A message as received, with Pulsar's accessor methods.

    The same data is in plain attributes (named apart from the methods): ``id``,
    ``partition_key``, ``payload`` (``None`` for a tombstone), ``props``, ``publish_time``
    and ``event_time`` (ms), ``redeliveries``, ``topic``.
    """

    id: MessageId
    partition_key: str | None
    payload: bytes | None
    props: dict[str, str] = field(default_factory=dict)
    publish_time: int = 0
    event_time: int | None = None
    redeliveries: int = 0
    topic: str = ""

    def message_id(self) -> MessageId:
        return self.id

    def key(self) -> str | None:
        """The key compaction keeps the latest value of (Pulsar's ``partition_key``)."""
        return self.partition_key

    def value(self) -> bytes | None:
        """The payload; ``None`` for a tombstone (a message that deletes its key)."""
        return self.payload

    def data(self) -> bytes | None:
        """Alias of ``value()`` (Pulsar's name)."""
        return self.payload

    def properties(self) -> dict[str, str]:
        return dict(self.props)

    def publish_timestamp(self) -> int:
        """When the service stored the message, in ms since the epoch."""
        return self.publish_time

    def event_timestamp(self) -> int | None:
        """The producer's event time in ms, if it set one."""
        return self.event_time

    def redelivery_count(self) -> int:
        """How often a subscription delivered this message before (0 from a reader)."""
        return self.redeliveries

    def topic_name(self) -> str:
        return self.topic


def _setters(cls: type, names: Sequence[str]) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot setters of a frozen slots dataclass: filling an instance through them skips
    the dataclass ``__init__`` (and its checks), which costs several times as much."""
    return tuple(cls.__dict__[name].__set__ for name in names)


_SET_ID = _setters(MessageId, ("ledger_id", "entry_id", "batch_index"))
_SET_MESSAGE = _setters(
    Message,
    ("id", "partition_key", "payload", "props", "publish_time", "event_time", "redeliveries", "topic"),
)


def _page(topic: str, body: Mapping[str, Any]) -> list[Message]:
    """Messages from a page in the column form (``"format": "columns"`` of a receive or a
    read): ids, keys and times arrive as arrays, and every value is a slice of one
    base64-decoded string, so a page of thousands costs one decode, not one per message.
    They are built through the slot setters (see ``_setters``)."""
    n = body["count"]
    lengths = body["valueLengths"]
    blob = binascii.a2b_base64(body["values"])
    props = body.get("properties") or itertools.repeat(None, n)
    events = body.get("eventTimes") or itertools.repeat(None, n)
    redeliveries = body.get("redeliveryCounts") or itertools.repeat(0, n)
    batches = body.get("batchIndexes") or itertools.repeat(None, n)
    columns = (body["ledgerIds"], body["entryIds"], body["keys"], lengths, props, body["publishTimes"])
    if any(len(c) != n for c in (*columns, events, redeliveries, batches) if isinstance(c, list)):
        raise ServerError(200, "the server sent a page whose columns differ in length")
    set_ledger, set_entry, set_batch = _SET_ID
    s_id, s_key, s_payload, s_props, s_publish, s_event, s_redeliveries, s_topic = _SET_MESSAGE
    new = object.__new__
    out: list[Message] = []
    append = out.append
    at = 0
    for ledger, entry, key, size, p, publish, event, redelivered, batch in zip(
        *columns, events, redeliveries, batches, strict=True
    ):
        mid = new(MessageId)
        set_ledger(mid, ledger)
        set_entry(mid, entry)
        set_batch(mid, batch)
        m = new(Message)
        s_id(m, mid)
        s_key(m, key)
        if size >= 0:
            s_payload(m, blob[at : at + size])
            at += size
        else:
            s_payload(m, None)
        s_props(m, dict(p) if p else {})
        s_publish(m, publish)
        s_event(m, event)
        s_redeliveries(m, redelivered)
        s_topic(m, topic)
        append(m)
    if at != len(blob):
        raise ServerError(200, "the server sent a page whose values do not add up")
    return out


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message for ``Producer.send_many``; ``value=None`` is a tombstone for ``key``.

    ``send_many`` also takes, for each message: ``bytes`` or ``str`` (a value without a key),
    a ``(key, value)`` pair (so ``send_many(d.items())`` writes a dict), or a mapping with the
    fields of this class.
    """

    value: bytes | str | None
    key: str | None = None
    properties: Mapping[str, str] | None = None
    event_timestamp: int | None = None


MessageLike: TypeAlias = (
    "OutgoingMessage | bytes | str | tuple[str | None, bytes | str | None] | Mapping[str, Any]"
)
_OUTGOING_FIELDS = frozenset(OutgoingMessage.__dataclass_fields__)


def _outgoing(item: MessageLike) -> OutgoingMessage:
    if isinstance(item, OutgoingMessage):
        return item
    if isinstance(item, bytes | bytearray | memoryview | str):
        return OutgoingMessage(value=bytes(item) if not isinstance(item, str) else item)
    if isinstance(item, tuple):
        if len(item) != 2:
            raise TypeError(f"a message tuple is (key, value), not {len(item)} items")
        return OutgoingMessage(key=item[0], value=item[1])
    if isinstance(item, Mapping):
        unknown = set(item) - _OUTGOING_FIELDS
        if unknown:
            raise TypeError(f"unknown message fields {sorted(unknown)}; use {sorted(_OUTGOING_FIELDS)}")
        return OutgoingMessage(**item)
    raise TypeError(f"cannot send a {type(item).__name__} as a message")


def _wire(m: OutgoingMessage) -> dict[str, Any]:
    value = m.value
    if isinstance(value, str):
        value = value.encode()
    elif value is not None and not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"a message value is bytes, str or None, not {type(value).__name__}")
    if m.key is not None and not isinstance(m.key, str):
        raise TypeError(f"a message key is a str or None, not {type(m.key).__name__}")
    out: dict[str, Any] = {
        "key": m.key,
        "value": base64.b64encode(value).decode("ascii") if value is not None else None,
    }
    if m.properties:
        out["properties"] = dict(m.properties)
    if m.event_timestamp is not None:
        out["eventTime"] = int(m.event_timestamp)
    return out


def _batches(messages: Iterable[MessageLike]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    size = 0
    for item in messages:
        wire = _wire(_outgoing(item))
        n = len(wire["value"] or "") + len(wire["key"] or "") + 64
        n += sum(len(k) + len(v) + 8 for k, v in wire.get("properties", {}).items())
        if batch and (len(batch) >= MAX_BATCH_MESSAGES or size + n > MAX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(wire)
        size += n
    if batch:
        yield batch
