"""The Python client of the topic compactor: Apache Pulsar's vocabulary over the REST API, on httpx.

::

    from api.client import Client, MessageId

    with Client("http://127.0.0.1:8080") as client:
        client.admin.topics.create("public/default/orders")
        producer = client.create_producer("public/default/orders")
        producer.send(b"v1", key="a")
        consumer = client.subscribe("public/default/orders", "billing", initial_position="earliest")
        msg = consumer.receive(timeout_millis=1000)
        consumer.acknowledge(msg)
        reader = client.create_reader("public/default/orders", MessageId.earliest, read_compacted=True)
        table = client.create_table_view("public/default/orders")  # key -> latest value

``AsyncClient`` has the same surface with ``async def`` (``async with AsyncClient(url) as c``).

A service with authentication wants a token, as pulsar-client-python gives it::

    Client("https://broker:8443", authentication=AuthenticationToken(token),
           tls_trust_certs_file_path="/etc/compactor/ca.pem")

``AuthenticationToken`` takes the token or a function that returns one (read again, once,
when the server answers 401: a token file that was renewed). The token is never logged.
Topics are named ``persistent://tenant/namespace/topic`` or just ``tenant/namespace/topic``.

Exceptions::

    ClientError                  every error raised here; ``reason`` is a sentence for people
    ├── TransportError           no HTTP answer: refused, reset, DNS, timed out (httpx's errors)
    ├── Timeout                  receive(), read_next() or wait_for_compaction() ran out of time
    ├── AlreadyClosed            a client, producer, consumer or reader used after close()
    └── ServerError              the server answered with an error: ``status``, ``reason``
        ├── BadRequest           400, 422: a malformed name, message id, body or query
        ├── AuthenticationError  401: no token, or one the server does not accept
        ├── AuthorizationError   403: the role may not do this
        ├── NotFound             404: topic, subscription, consumer
        ├── Conflict             409: exists already, a compaction is running
        │   └── ConsumerBusy     409 on attaching a consumer: the subscription has an Exclusive
        │                        one, or consumers of another subscription type
        ├── TooLarge             413: a message or a request over the server's limits
        └── Unavailable          503 after the retries: the server is out of a resource for now

A 503 (the server changed nothing) is retried with exponential back-off, honouring its
``Retry-After``, for up to ``Client(retry_unavailable_s=...)`` seconds (default 30; 0 = never).

Several instances (README, "Running several instances"): the service URL may list several,
``"http://a:8080,http://b:8080"``, as a Pulsar service URL does. A request for a topic another
instance owns is answered ``307`` with the owner's URL: the client sends it again there (the
token with it) and keeps sending that topic's requests to the owner until a redirect says
otherwise. A 503, or an owner that cannot be reached (the request never left), forgets the
owner: the retry goes through the service URL again (the next one when one cannot be reached),
which redirects to the current owner, with the same back-off and time bound as a 503.

Arguments that are malformed before any request is made (a topic name without three parts, a
message id that does not parse) raise ``ValueError`` or ``TypeError``, as Python does.

How it is built: every operation is written once, as a generator that yields *effects* -- an
HTTP call (``_Call``) or a pause (``_Sleep``) -- and is sent their results (the decoded JSON
body; a ``ClientError`` is thrown in instead). ``Client._run`` drives an operation with
``httpx.Client`` and ``time.sleep``, ``AsyncClient._run`` with ``httpx.AsyncClient`` and
``asyncio.sleep``: that is the only difference between the two sides. Requests are built in one
place (``_BaseClient._build``), responses become results or errors in one place (``_decode``),
and httpx's exceptions are translated in one place (``_transport_errors``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import builtins
import contextlib
import itertools
import logging
import random
import ssl
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
import orjson

__all__ = [
    "AlreadyClosed",
    "Admin",
    "AuthenticationError",
    "AuthenticationToken",
    "AuthorizationError",
    "AsyncAdmin",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncReader",
    "AsyncTableView",
    "BadRequest",
    "Client",
    "ClientError",
    "CompactionProgress",
    "CompactionStatus",
    "Conflict",
    "Consumer",
    "ConsumerBusy",
    "ConsumerType",
    "DeadLetterPolicy",
    "Message",
    "MessageId",
    "NotFound",
    "OutgoingMessage",
    "Producer",
    "Reader",
    "ServerError",
    "TableView",
    "Timeout",
    "TooLarge",
    "TransportError",
    "Unavailable",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8080"
#: A ``send_many`` request holds at most this many messages ...
MAX_BATCH_MESSAGES = 1000
#: ... and about this many bytes of JSON (the server refuses requests over ``maxRequestBytes``).
MAX_BATCH_BYTES = 8 * 1024 * 1024
#: The reserved cursor that holds the compaction horizon; not a subscription a consumer may use.
COMPACTION_SUBSCRIPTION = "__compaction"

#: Individual acknowledgements a consumer holds before it sends them regardless of the time
#: (Pulsar's ``maxAcknowledgmentGroupSize``).
MAX_ACK_GROUP = 1000
_LONG_POLL_MS = 10_000  # one receive long poll when waiting without a deadline (server cap: 30 s)
_POLL_MIN_S = 0.02  # a reader with nothing to read polls again after this, doubling ...
_POLL_MAX_S = 0.5  # ... up to this


# --------------------------------------------------------------------------------- errors


class ClientError(Exception):
    """Base of every error this client raises; ``reason`` says what went wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TransportError(ClientError):
    """No HTTP answer: the connection was refused or reset, the name did not resolve, or the
    request timed out (``Client(timeout=...)``). The original httpx error is ``__cause__``."""


class Timeout(ClientError):
    """Nothing arrived in time: ``receive``/``read_next`` with ``timeout_millis``, or a
    ``wait_for_compaction`` past its ``timeout`` (as Pulsar's ``pulsar.Timeout``)."""


class AlreadyClosed(ClientError):
    """A client, producer, consumer, reader or table view was used after ``close()``."""


class ServerError(ClientError):
    """The server answered with an error status; ``reason`` is its JSON ``"reason"``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status

    def __str__(self) -> str:
        return f"{self.reason} (HTTP {self.status})"


class BadRequest(ServerError):
    """400 or 422: a malformed name, message id, body or query."""


class AuthenticationError(ServerError):
    """401: no token was sent, or the server did not accept it (malformed, wrongly signed, expired)."""


class AuthorizationError(ServerError):
    """403: the token's role may not do this (its reason names the role and the action)."""


class NotFound(ServerError):
    """404: no such tenant, namespace, topic, subscription or consumer."""


class Conflict(ServerError):
    """409: the thing exists already, or a compaction of the topic is running."""


class ConsumerBusy(Conflict):
    """409 on attaching a consumer: the (exclusive) subscription has an active consumer."""


class TooLarge(ServerError):
    """413: a message over ``maxMessageSize`` or a request over ``maxRequestBytes``."""


class Unavailable(ServerError):
    """503: the server is out of a resource for now (its seal backlog is full, or it ran out of
    file descriptors) and changed nothing; raised once the client's retries are used up."""


_ERRORS: dict[int, type[ServerError]] = {
    400: BadRequest,
    401: AuthenticationError,
    403: AuthorizationError,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: BadRequest,
    503: Unavailable,
}

_RETRY_FIRST_S = 0.05  # the first back-off after a 503, doubling ...
_RETRY_MAX_S = 2.0  # ... up to this, or the server's Retry-After if it asks for longer


# --------------------------------------------------------------------------- ids, messages

_MAX_ID = 2**63 - 1
_ID_STRUCT = struct.Struct(">Bqq")  # version, ledger id, entry id
assert _ID_STRUCT.size == 17
_ID_VERSION = 1


@dataclass(frozen=True, order=True, slots=True)
class MessageId:
    """A message's position ``(ledger_id, entry_id)``, ordered, written ``"L:E"``.

    ``MessageId.earliest`` and ``MessageId.latest`` are the sentinels Pulsar has; they order
    before and after every real id and are written ``"earliest"`` and ``"latest"``.
    ``serialize()`` gives bytes to store (a reader can be positioned by them later).
    """

    ledger_id: int
    entry_id: int

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

    def __str__(self) -> str:
        if self == MessageId.earliest:
            return "earliest"
        if self == MessageId.latest:
            return "latest"
        return f"{self.ledger_id}:{self.entry_id}"

    def __repr__(self) -> str:
        if self in (MessageId.earliest, MessageId.latest):
            return f"MessageId.{self}"
        return f"MessageId({self.ledger_id}, {self.entry_id})"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """``"L:E"``, ``"earliest"`` or ``"latest"``; ``ValueError`` for anything else."""
        if text == "earliest":
            return cls.earliest
        if text == "latest":
            return cls.latest
        ledger, sep, entry = text.partition(":")
        if not (sep and ledger.isdigit() and entry.isdigit() and ledger.isascii() and entry.isascii()):
            raise ValueError(
                f"not a message id: {text!r} (expected 'ledgerId:entryId', 'earliest', 'latest')"
            )
        return cls(int(ledger), int(entry))

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


_SET_ID = _setters(MessageId, ("ledger_id", "entry_id"))
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
    columns = (body["ledgerIds"], body["entryIds"], body["keys"], lengths, props, body["publishTimes"])
    if any(len(c) != n for c in (*columns, events, redeliveries) if isinstance(c, list)):
        raise ServerError(200, "the server sent a page whose columns differ in length")
    set_ledger, set_entry = _SET_ID
    s_id, s_key, s_payload, s_props, s_publish, s_event, s_redeliveries, s_topic = _SET_MESSAGE
    new = object.__new__
    out: list[Message] = []
    append = out.append
    at = 0
    for ledger, entry, key, size, p, publish, event, redelivered in zip(
        *columns, events, redeliveries, strict=True
    ):
        mid = new(MessageId)
        set_ledger(mid, ledger)
        set_entry(mid, entry)
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


@dataclass(frozen=True, slots=True)
class CompactionProgress:
    """How far a running compaction is: its ``phase`` (``phase-one``, ``phase-two``,
    ``commit``), the phase's share of the input read, and the round's ``percent``."""

    phase: str
    entries_read: int
    entries_total: int
    bytes_read: int
    bytes_total: int
    percent: float
    started_at: int  # epoch ms
    elapsed_ms: int

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> CompactionProgress:
        return cls(
            phase=body["phase"],
            entries_read=body["entriesRead"],
            entries_total=body["entriesTotal"],
            bytes_read=body["bytesRead"],
            bytes_total=body["bytesTotal"],
            percent=body["percent"],
            started_at=body["startedAt"],
            elapsed_ms=body["elapsedMs"],
        )


@dataclass(frozen=True, slots=True)
class CompactionStatus:
    """A topic's compaction status: ``NOT_RUN``, ``RUNNING``, ``SUCCESS`` or ``ERROR``; while
    it is ``RUNNING``, its ``progress``."""

    status: str
    last_error: str | None = None
    progress: CompactionProgress | None = None

    NOT_RUN: ClassVar[str] = "NOT_RUN"
    RUNNING: ClassVar[str] = "RUNNING"
    SUCCESS: ClassVar[str] = "SUCCESS"
    ERROR: ClassVar[str] = "ERROR"

    @property
    def running(self) -> bool:
        return self.status == self.RUNNING


#: ``on_progress(status, elapsed_seconds)`` of ``wait_for_compaction``, called after every poll.
ProgressCallback: TypeAlias = Callable[[CompactionStatus, float], None]
#: ``callback(key, value)`` of a table view; ``value`` is ``None`` when a tombstone removed the key.
TableListener: TypeAlias = Callable[[str, bytes | None], None]


# --------------------------------------------------------------------------------- names


def _q(part: str) -> str:
    # "/" in a part becomes %2F, which the server refuses (400) instead of routing elsewhere.
    return quote(part, safe="")


def _split(text: str, n: int, what: str, example: str) -> list[str]:
    if not isinstance(text, str):
        raise TypeError(f"a {what} name is a str, not {type(text).__name__}")
    parts = text.split("/")
    if len(parts) != n or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid {what} name {text!r}: expected {example}")
    return parts


@dataclass(frozen=True, slots=True)
class _Topic:
    tenant: str
    namespace: str
    name: str

    @classmethod
    def parse(cls, topic: str) -> _Topic:
        rest = topic
        if isinstance(topic, str) and "://" in topic:
            domain, _, rest = topic.partition("://")
            if domain != "persistent":
                raise ValueError(f"invalid topic name {topic!r}: only persistent:// topics exist")
        t, n, x = _split(rest, 3, "topic", "persistent://tenant/namespace/topic or tenant/namespace/topic")
        return cls(t, n, x)

    def __str__(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.name}"

    @property
    def _parts(self) -> str:
        return f"{_q(self.tenant)}/{_q(self.namespace)}/{_q(self.name)}"

    @property
    def admin(self) -> str:
        return f"/admin/v2/persistent/{self._parts}"

    @property
    def data(self) -> str:
        return f"/topics/persistent/{self._parts}"

    def subscription(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError("a subscription name is a non-empty str")
        return f"{self.admin}/subscription/{_q(name)}"


def _namespace(namespace: str) -> str:
    t, n = _split(namespace.removeprefix("persistent://"), 2, "namespace", "tenant/namespace")
    return f"{_q(t)}/{_q(n)}"


def _position(value: MessageIdLike) -> str:
    """An initial position of a new subscription: only earliest or latest."""
    pos = str(value)
    if pos not in ("earliest", "latest"):
        raise ValueError(f"initial position is 'earliest' or 'latest', not {pos!r}")
    return pos


def _seek_body(target: MessageIdLike | int) -> dict[str, Any]:
    if isinstance(target, bool):
        raise TypeError("seek to a MessageId, an 'L:E' string, or a publish time in ms (int)")
    if isinstance(target, int):
        return {"publishTime": target}
    return {"messageId": str(_as_id(target))}


# --------------------------------------------------------------------- effects and driving


@dataclass(frozen=True, slots=True)
class _Call:
    """An HTTP request to make; its result is the decoded JSON body (``None`` when empty)."""

    method: str
    path: str
    params: Mapping[str, str | int | bool] | None = None
    body: Any = None  # JSON; None sends no body
    wait: float = 0.0  # seconds the server may hold the request (a long poll), added to the timeout


@dataclass(frozen=True, slots=True)
class _Sleep:
    seconds: float


_Effect: TypeAlias = _Call | _Sleep
_Op: TypeAlias = Generator[_Effect, Any, T]


@contextlib.contextmanager
def _transport_errors(request: httpx.Request) -> Iterator[None]:
    """The one place httpx's exceptions become ``TransportError``."""
    try:
        yield
    except httpx.TimeoutException as e:
        raise TransportError(f"timed out: {request.method} {request.url}") from e
    except httpx.RequestError as e:
        raise TransportError(f"{type(e).__name__}: {e or 'failed'} ({request.method} {request.url})") from e


_MAX_REDIRECTS = 5
_TOPIC_PREFIXES = ("/admin/v2/persistent/", "/topics/persistent/", "/lookup/v2/topic/persistent/")


def _topic_key(path: str) -> str | None:
    """The topic a request path is about ("t/n/topic", as encoded), or None."""
    for prefix in _TOPIC_PREFIXES:
        if path.startswith(prefix):
            parts = path[len(prefix) :].split("/", 3)
            if len(parts) >= 3 and all(parts[:3]):
                return "/".join(parts[:3])
    return None


def _never_sent(error: TransportError) -> bool:
    """Whether the request could not even be sent (no connection): safe to send elsewhere."""
    return isinstance(error.__cause__, httpx.ConnectError | httpx.ConnectTimeout)


def _decode(response: httpx.Response) -> Any:
    """The one place a response becomes a result (its JSON, ``None`` when empty) or an error."""
    status = response.status_code
    if 200 <= status < 300:
        if status == 204 or not response.content:
            return None
        try:
            # orjson: a page of messages decodes several times faster than with json.
            return orjson.loads(response.content)
        except ValueError:
            raise ServerError(status, f"the server sent invalid JSON ({response.request.url})") from None
    reason: str | None = None
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("reason"), str):
            reason = body["reason"]
    except ValueError:
        pass
    if reason is None:
        reason = response.text.strip()[:500] or response.reason_phrase or f"HTTP {status}"
    raise _ERRORS.get(status, ServerError)(status, reason)


class AuthenticationToken:
    """A token to send with every request (``Authorization: Bearer``), as pulsar-client-python's.

    ``token`` is the token itself or a function returning it: the function is called once at
    first and again when the server answers 401 (the request is then retried once), so that a
    token that is renewed elsewhere (a file rewritten by an agent) is picked up.
    """

    def __init__(self, token: str | Callable[[], str]) -> None:
        if not callable(token) and not (isinstance(token, str) and token.strip()):
            raise ValueError("a token is a non-empty string or a function that returns one")
        self._supplier: Callable[[], str] | None = token if callable(token) else None
        self._token: str | None = None if callable(token) else token.strip()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "AuthenticationToken(<hidden>)"  # a token is a password: never in logs or reprs

    @property
    def renewable(self) -> bool:
        return self._supplier is not None

    def header(self) -> str:
        token = self._token
        if token is None:
            with self._lock:
                if self._token is None:
                    self._token = self._read()
                token = self._token
        return f"Bearer {token}"

    def renew(self) -> None:
        """Read the token again (after a 401)."""
        if self._supplier is not None:
            with self._lock:
                self._token = self._read()

    def _read(self) -> str:
        assert self._supplier is not None
        token = self._supplier()
        if not isinstance(token, str) or not token.strip():
            raise ClientError("the authentication token function returned no token")
        return token.strip()


def _tls_verify(trust_certs_file_path: str | None, allow_insecure: bool) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for pulsar-client-python's TLS options."""
    if allow_insecure:
        return False
    if trust_certs_file_path is not None:
        return ssl.create_default_context(cafile=trust_certs_file_path)
    return True


class _BaseClient:
    """What the sync and async clients share: configuration and request building."""

    def __init__(
        self,
        service_url: str,
        timeout: float,
        authentication: AuthenticationToken | None = None,
        retry_unavailable_s: float = 30.0,
    ) -> None:
        urls = [u.strip().rstrip("/") for u in str(service_url).split(",") if u.strip()]
        if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"the service URL is http:// or https://, not {service_url!r}")
        url = urls[0]
        if timeout <= 0:
            raise ValueError("timeout is a positive number of seconds")
        if authentication is not None and not isinstance(authentication, AuthenticationToken):
            raise TypeError("authentication is an AuthenticationToken")
        if retry_unavailable_s < 0:
            raise ValueError("retry_unavailable_s is 0 (never retry a 503) or more seconds")
        self.service_url = url
        self.service_urls = urls
        self._service_index = 0
        # Where each topic's requests go (its owner, learnt from a redirect), by "t/n/topic".
        self._owners: dict[str, str] = {}
        self.timeout = float(timeout)
        self._authentication = authentication
        self.retry_unavailable_s = float(retry_unavailable_s)
        self._closed = False
        # Consumers and table views hold server or thread state that close() releases.
        self._children: weakref.WeakSet[Any] = weakref.WeakSet()

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("the client is closed")

    def _build(self, http: httpx.Client | httpx.AsyncClient, call: _Call) -> httpx.Request:
        """The one place a request is built: to the topic's owner when one is known, else to
        the service URL (the token goes with it either way)."""
        has_body = call.body is not None
        headers = {"Content-Type": "application/json"} if has_body else {}
        if self._authentication is not None:
            headers["Authorization"] = self._authentication.header()
        key = _topic_key(call.path)
        base = self._owners.get(key) if key is not None else None
        if base is None:
            base = self.service_urls[self._service_index]
        return http.build_request(
            call.method,
            call.path if base == self.service_url else base + call.path,
            params=dict(call.params) if call.params else None,
            # orjson: a batch of a thousand messages encodes several times faster than with json.
            content=orjson.dumps(call.body) if has_body else None,
            headers=headers or None,
            timeout=httpx.Timeout(self.timeout + call.wait),
        )

    def _renew_after(self, response: httpx.Response) -> bool:
        """Whether to send a request again: a 401 with a token that can be read anew."""
        if response.status_code != 401 or self._authentication is None or not self._authentication.renewable:
            return False
        self._authentication.renew()
        return True

    def _follow(self, response: httpx.Response, call: _Call, hops: int) -> bool:
        """Whether to send the request again after a redirect to the topic's owner (and
        remember the owner); a 503 forgets the owner, so that the retry looks the topic up."""
        key = _topic_key(call.path)
        if response.status_code == 503 and key is not None:
            self._owners.pop(key, None)
            return False
        if response.status_code not in (307, 308):
            return False
        location = response.headers.get("location", "")
        target = httpx.URL(location)
        if key is None or not target.scheme or not target.host or hops >= _MAX_REDIRECTS:
            return False
        self._owners[key] = f"{target.scheme}://{target.netloc.decode('ascii')}"
        return True

    def _unreachable(self, call: _Call, attempt: int, started: float) -> float | None:
        """Seconds to wait before trying elsewhere after an instance could not be reached (the
        request never left), or None to raise: the topic's remembered owner is forgotten, or
        the next service URL is tried."""
        key = _topic_key(call.path)
        if key is not None and self._owners.pop(key, None) is not None:
            pass
        elif len(self.service_urls) > 1:
            self._service_index = (self._service_index + 1) % len(self.service_urls)
        else:
            return None
        delay = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2**attempt) * (1 + random.random() / 4)
        if time.monotonic() + delay - started > self.retry_unavailable_s:
            return None
        return delay

    def _retry_delay(self, response: httpx.Response, attempt: int, started: float) -> float | None:
        """Seconds to wait before sending a request again that was answered ``response``, or
        None to take the answer. Only a 503 is retried: the server changed nothing for it."""
        if response.status_code != 503:
            return None
        delay = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2**attempt)
        with contextlib.suppress(ValueError):
            delay = max(delay, float(response.headers.get("Retry-After", 0)))
        delay *= 1 + random.random() / 4  # jitter: clients refused together do not return together
        if time.monotonic() + delay - started > self.retry_unavailable_s:
            return None
        return delay

    @staticmethod
    def _headers() -> dict[str, str]:
        return {"User-Agent": "compactor-client/0.1", "Accept": "application/json"}


# ---------------------------------------------------------------------- shared operations

_C = TypeVar("_C", bound=_BaseClient)


class _Child(Generic[_C]):
    def __init__(self, client: _C, topic: _Topic) -> None:
        self._client = client
        self._topic = topic
        self._closed = False

    def topic(self) -> str:
        """The full topic name, ``persistent://tenant/namespace/topic``."""
        return str(self._topic)

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed(f"{type(self).__name__} of {self._topic} is closed")
        self._client._check_open()


class _ProducerBase(_Child[_C]):
    def _op_open(self) -> _Op[None]:
        # As Pulsar without auto-creation: a producer of an unknown topic fails now (NotFound).
        # The compaction status is a look-up the produce permission allows (a read is not).
        yield _Call("GET", f"{self._topic.admin}/compaction")

    def _op_send_many(self, messages: Iterable[MessageLike]) -> _Op[list[MessageId]]:
        self._check_open()
        ids: list[MessageId] = []
        for batch in _batches(messages):
            body = yield _Call("POST", self._topic.data, body={"messages": batch})
            ids.extend(MessageId.parse(i) for i in body["messageIds"])
        return ids

    def _op_send(
        self,
        value: bytes | str | None,
        key: str | None,
        properties: Mapping[str, str] | None,
        event_timestamp: int | None,
    ) -> _Op[MessageId]:
        ids = yield from self._op_send_many([OutgoingMessage(value, key, properties, event_timestamp)])
        return ids[0]


class ConsumerType:
    """Pulsar's subscription types (``pulsar.ConsumerType``); the values are the REST API's
    ``subscriptionType``. ``subscribe(..., subscription_type=...)`` takes either."""

    Exclusive = "Exclusive"
    Failover = "Failover"
    Shared = "Shared"
    KeyShared = "Key_Shared"


_SUBSCRIPTION_TYPES = ("Exclusive", "Failover", "Shared", "Key_Shared")


@dataclass(frozen=True)
class DeadLetterPolicy:
    """Pulsar's ``ConsumerDeadLetterPolicy``: a message redelivered ``max_redeliver_count``
    times is, at its next redelivery, written to ``dead_letter_topic`` (default
    ``{topic}-{subscription}-DLQ``, in the topic's namespace) and acknowledged here. The
    server does it; Shared and Key_Shared subscriptions only."""

    max_redeliver_count: int
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        if self.max_redeliver_count < 1:
            raise ValueError("max_redeliver_count is at least 1")


class _AckGroup:
    """Acknowledgements made and not sent yet (Pulsar's acknowledgment grouping): the greatest
    cumulative one, and the individual ones beyond it."""

    __slots__ = ("cumulative", "individual", "since")

    def __init__(self) -> None:
        self.cumulative: MessageId | None = None
        self.individual: dict[MessageId, None] = {}  # an ordered set
        self.since = 0.0  # when the oldest of them was made (monotonic)

    def __bool__(self) -> bool:
        return self.cumulative is not None or bool(self.individual)

    def add(self, ids: list[MessageId], cumulative: bool) -> None:
        if not self:
            self.since = time.monotonic()
        if cumulative:
            top = max(ids)
            if self.cumulative is None or top > self.cumulative:
                self.cumulative = top
        else:
            self.individual.update(dict.fromkeys(ids))

    def due(self, group_s: float) -> bool:
        return bool(self) and (
            time.monotonic() - self.since >= group_s or len(self.individual) >= MAX_ACK_GROUP
        )

    def take(self) -> tuple[MessageId | None, list[MessageId]]:
        """Empty the group; what it held, individual acks a cumulative one covers left out."""
        upto, individual = self.cumulative, self.individual
        self.cumulative, self.individual = None, {}
        return upto, [i for i in individual if upto is None or i > upto]


class _ConsumerBase(_Child[_C]):
    def __init__(
        self,
        client: _C,
        topic: _Topic,
        subscription: str,
        *,
        read_compacted: bool,
        initial_position: MessageIdLike,
        ack_timeout_ms: int,
        consumer_name: str | None,
        receiver_queue_size: int,
        ack_group_time_ms: int,
        subscription_type: str = "Exclusive",
        priority_level: int = 0,
        negative_ack_redelivery_delay_ms: int = 60_000,
        dead_letter_policy: DeadLetterPolicy | None = None,
    ) -> None:
        super().__init__(client, topic)
        if subscription_type not in _SUBSCRIPTION_TYPES:
            raise ValueError(f"subscription_type is one of {', '.join(_SUBSCRIPTION_TYPES)}")
        if negative_ack_redelivery_delay_ms < 0:
            raise ValueError("negative_ack_redelivery_delay_ms is 0 or more")
        if subscription == COMPACTION_SUBSCRIPTION:
            raise ValueError(f"{COMPACTION_SUBSCRIPTION!r} is the compactor's cursor, not a subscription")
        if receiver_queue_size < 1:
            raise ValueError("receiver_queue_size is at least 1")
        if ack_group_time_ms < 0:
            raise ValueError("ack_group_time_ms is 0 (send each acknowledgement) or more")
        self._subscription = subscription
        self._sub_path = topic.subscription(subscription)  # the subscription (admin)
        self._consumers = f"{topic.data}/subscription/{_q(subscription)}/consumers"  # its consumers
        self._read_compacted = read_compacted
        self._initial_position = _position(initial_position)
        self._ack_timeout_ms = int(ack_timeout_ms)
        self._consumer_name = consumer_name
        self._receiver_queue_size = receiver_queue_size
        self._consumer_id: str | None = None
        # The receiver queue: messages the server delivered that receive() has not returned yet.
        self._queue: deque[Message] = deque()
        self._ack_group_s = ack_group_time_ms / 1000
        self._acks = _AckGroup()
        self._subscription_type = subscription_type
        self._priority_level = priority_level
        self._nack_delay_ms = int(negative_ack_redelivery_delay_ms)
        self._dead_letter_policy = dead_letter_policy

    def subscription_name(self) -> str:
        return self._subscription

    def consumer_name(self) -> str | None:
        return self._consumer_name

    @property
    def consumer_id(self) -> str | None:
        """The server's id of this consumer (it changes if the consumer had to attach again)."""
        return self._consumer_id

    @property
    def read_compacted(self) -> bool:
        """Whether this consumer reads the compacted view (this consumer's choice, as in
        Pulsar: another consumer of the same subscription may read the whole log)."""
        return self._read_compacted

    @property
    def subscription_type(self) -> str:
        return self._subscription_type

    def _op_open(self) -> _Op[None]:
        # 409: it exists; attach to it as it is, as Pulsar's subscribe does.
        with contextlib.suppress(Conflict):
            yield _Call("PUT", self._sub_path, {"initialPosition": self._initial_position})
        yield from self._op_attach()

    def _op_attach(self) -> _Op[None]:
        body: dict[str, Any] = {"ackTimeoutMs": self._ack_timeout_ms, "readCompacted": self._read_compacted}
        if self._consumer_name is not None:
            body["consumerName"] = self._consumer_name
        if self._subscription_type != "Exclusive":
            body["subscriptionType"] = self._subscription_type
            body["priorityLevel"] = self._priority_level
            body["negativeAckRedeliveryDelayMs"] = self._nack_delay_ms
        elif self._nack_delay_ms != 60_000:
            body["negativeAckRedeliveryDelayMs"] = self._nack_delay_ms
        if self._dead_letter_policy is not None:
            policy = self._dead_letter_policy
            body["deadLetterPolicy"] = {"maxRedeliverCount": policy.max_redeliver_count}
            if policy.dead_letter_topic is not None:
                body["deadLetterPolicy"]["deadLetterTopic"] = policy.dead_letter_topic
        try:
            reply = yield _Call("POST", self._consumers, body=body)
        except Conflict as e:
            raise ConsumerBusy(e.status, e.reason) from None
        self._consumer_id = str(reply["consumerId"])
        self._queue.clear()  # what the previous consumer held is redelivered to this one

    def _consumer_call(self, action: str, body: Any, wait: float) -> _Call:
        return _Call(
            "POST", f"{self._consumers}/{_q(self._consumer_id or '')}/{action}", body=body, wait=wait
        )

    def _op_call(self, action: str, body: Any, wait: float = 0.0) -> _Op[Any]:
        self._check_open()
        try:
            return (yield self._consumer_call(action, body, wait))
        except NotFound:
            # The server forgets a consumer that made no call for 30 s (or when it restarts):
            # attach again, once, as a Pulsar client reconnects. If the subscription or the
            # topic is gone, the attach raises NotFound itself.
            log.info(
                "consumer %s of %s/%s is gone; attaching again",
                self._consumer_id,
                self._topic,
                self._subscription,
            )
            yield from self._op_attach()
        return (yield self._consumer_call(action, body, wait))

    def _op_fetch(self, max_messages: int, wait_ms: int) -> _Op[list[Message]]:
        body = yield from self._op_call(
            "receive",
            {"maxMessages": max_messages, "timeoutMs": wait_ms, "format": "columns"},
            wait=wait_ms / 1000,
        )
        return _page(str(self._topic), body)

    def _op_receive(self, timeout_millis: int | None, max_messages: int | None) -> _Op[list[Message]]:
        """Up to ``max_messages`` (``None``: one, from a full receiver queue); waits until at
        least one arrives or the timeout passes (``None``: forever)."""
        self._check_open()
        if max_messages is not None and max_messages < 1:
            raise ValueError("max_messages is at least 1")
        if self._acks.due(self._ack_group_s):
            yield from self._op_flush_acks()
        want = max_messages or 1
        out = [self._queue.popleft() for _ in range(min(want, len(self._queue)))]
        if len(out) == want:
            return out
        deadline = None if timeout_millis is None else time.monotonic() + max(0, timeout_millis) / 1000
        while True:
            if out or deadline is None:
                wait_ms = 0 if out else _LONG_POLL_MS
            else:
                wait_ms = max(0, min(_LONG_POLL_MS, int((deadline - time.monotonic()) * 1000)))
            if self._ack_timeout_ms:
                # The server's long poll wakes for new messages, not when an ack deadline
                # passes: poll at least that often so a redelivery is not held back.
                wait_ms = min(wait_ms, max(self._ack_timeout_ms, 50))
            if self._acks:
                # Held acknowledgements are not kept back while we wait: look without
                # waiting first, and send them if the wait is real.
                wait_ms = 0
            n = want - len(out) if max_messages is not None else self._receiver_queue_size
            got = yield from self._op_fetch(n, wait_ms)
            if max_messages is None:
                self._queue.extend(got[1:])
                got = got[:1]
            out.extend(got)
            if not out and self._acks:
                yield from self._op_flush_acks()  # the wait is real: send what is held first
            if out or (deadline is not None and time.monotonic() >= deadline):
                return out

    def _op_ack(self, ids: Iterable[MessageIdLike | Message], cumulative: bool) -> _Op[None]:
        self._check_open()
        if cumulative and self._subscription_type in ("Shared", "Key_Shared"):
            raise ValueError("Cannot use cumulative acks on a non-exclusive/non-failover subscription")
        wanted = [_as_id(i) for i in ids]
        if not wanted:
            return
        if not self._ack_group_s:
            wire = [str(i) for i in wanted]
            yield from self._op_call("ack", {"messageIds": wire, "cumulative": cumulative})
            return
        self._acks.add(wanted, cumulative)
        if self._acks.due(self._ack_group_s):
            yield from self._op_flush_acks()

    def _op_flush_acks(self) -> _Op[None]:
        """Send the held acknowledgements. One the server refuses (it does not know the
        message as delivered: a wrong id, or the server restarted) is dropped with a warning,
        and the others still count: its message comes again, as at-least-once allows. On any
        other error they stay held."""
        upto, individual = self._acks.take()
        for cumulative, ids in ((True, [upto] if upto is not None else []), (False, individual)):
            try:
                if ids:
                    yield from self._op_send_acks(ids, cumulative)
            except BaseException:
                self._acks.add(ids, cumulative)
                if cumulative and individual:
                    self._acks.add(individual, False)
                raise

    def _op_send_acks(self, ids: list[MessageId], cumulative: bool) -> _Op[None]:
        body = {"messageIds": [str(i) for i in ids], "cumulative": cumulative}
        try:
            yield from self._op_call("ack", body)
        except BadRequest as e:
            if len(ids) == 1:
                log.warning("%s/%s: acknowledgement dropped: %s", self._topic, self._subscription, e)
                return
            for one in ids:  # the server refuses a request whole: find the ids it takes
                yield from self._op_send_acks([one], cumulative)

    def _op_negative_ack(self, ids: Iterable[MessageIdLike | Message]) -> _Op[None]:
        self._check_open()
        wire = [str(_as_id(i)) for i in ids]
        if not wire:
            return
        # The server holds them for the delay, then delivers them again (Shared, Key_Shared:
        # these messages; Exclusive, Failover: every unacknowledged one, as Pulsar's client).
        yield from self._op_call("negativeAcks", {"messageIds": wire})

    def _op_redeliver(self) -> _Op[None]:
        self._check_open()
        yield from self._op_flush_acks()
        self._queue.clear()  # they are delivered again, in order, from the server
        yield from self._op_call("redeliver", {})

    def _op_seek(self, target: MessageIdLike | int) -> _Op[None]:
        body = _seek_body(target)
        self._check_open()
        yield from self._op_flush_acks()
        self._queue.clear()
        yield from self._op_call("seek", body)
        self._queue.clear()

    def _op_close(self) -> _Op[None]:
        if self._closed:
            return
        if self._acks and self._consumer_id is not None and not self._client._closed:
            with contextlib.suppress(NotFound):  # the subscription is gone: nothing to ack
                yield from self._op_flush_acks()
        self._closed = True
        self._queue.clear()
        if self._consumer_id is not None and not self._client._closed:
            with contextlib.suppress(NotFound):
                yield _Call("DELETE", f"{self._consumers}/{_q(self._consumer_id)}")

    def _op_unsubscribe(self) -> _Op[None]:
        self._check_open()
        yield from self._op_close()
        yield _Call("DELETE", self._sub_path)


class _ReaderBase(_Child[_C]):
    def __init__(
        self,
        client: _C,
        topic: _Topic,
        start: MessageIdLike,
        *,
        read_compacted: bool,
        inclusive: bool,
        receiver_queue_size: int,
    ) -> None:
        super().__init__(client, topic)
        if receiver_queue_size < 1:
            raise ValueError("receiver_queue_size is at least 1")
        self._read_compacted = read_compacted
        self._inclusive = inclusive
        self._page = receiver_queue_size
        self._queue: deque[Message] = deque()
        self._reset(_as_id(start))

    @property
    def read_compacted(self) -> bool:
        return self._read_compacted

    def _reset(self, start: MessageId) -> None:
        self._queue.clear()
        self._next = str(start)  # where the next page starts (inclusive), as the server wants it
        # An exclusive start (Pulsar's default) skips the start id itself.
        special = start in (MessageId.earliest, MessageId.latest)
        self._after: MessageId | None = None if self._inclusive or special else start

    def _op_fetch(self) -> _Op[list[Message]]:
        body = yield _Call(
            "GET",
            f"{self._topic.data}/messages",
            {
                "startMessageId": self._next,
                "maxMessages": self._page,
                "readCompacted": self._read_compacted,
                "format": "columns",
            },
        )
        if body.get("nextMessageId"):
            self._next = body["nextMessageId"]
        messages = _page(str(self._topic), body)
        if self._after is not None:
            after = self._after
            messages = [m for m in messages if m.id > after]
            if self._next not in ("earliest", "latest") and MessageId.parse(self._next) > after:
                self._after = None
        return messages

    def _op_fill(self) -> _Op[bool]:
        """Fetch until a message is queued or the topic has nothing more now; True if queued."""
        while not self._queue:
            before = self._next
            self._queue.extend((yield from self._op_fetch()))
            if not self._queue and self._next == before:
                break
        return bool(self._queue)

    def _op_read_next(self, timeout_millis: int | None) -> _Op[Message]:
        self._check_open()
        deadline = None if timeout_millis is None else time.monotonic() + max(0, timeout_millis) / 1000
        delay = _POLL_MIN_S
        while not (yield from self._op_fill()):
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Timeout(f"no message on {self._topic} within {timeout_millis} ms")
                yield _Sleep(min(delay, remaining))
            else:
                yield _Sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        return self._queue.popleft()

    def _op_has_message_available(self) -> _Op[bool]:
        self._check_open()
        return (yield from self._op_fill())

    def _op_seek(self, message_id: MessageIdLike) -> _Op[None]:
        start = _as_id(message_id)
        self._check_open()
        self._reset(start)
        yield from self._op_fill()  # resolves "latest" now, as at creation


_R = TypeVar("_R", bound=_ReaderBase[Any])


class _TableViewBase(Generic[_R]):
    """The key -> latest value map and its listeners; sync and async differ in refreshing."""

    def __init__(self, reader: _R, poll_interval: float) -> None:
        if poll_interval <= 0:
            raise ValueError("poll_interval is a positive number of seconds")
        self._reader = reader
        self.poll_interval = poll_interval
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._listeners: list[TableListener] = []
        self.last_error: ClientError | None = None

    def topic(self) -> str:
        return self._reader.topic()

    def _op_refresh(self) -> _Op[int]:
        changes = 0
        while (yield from self._reader._op_fill()):
            batch = list(self._reader._queue)
            self._reader._queue.clear()
            changes += self._apply(batch)
        return changes

    def _apply(self, messages: Iterable[Message]) -> int:
        updates: list[tuple[str, bytes | None]] = []
        with self._lock:
            for m in messages:
                if m.partition_key is None:
                    continue  # a keyless message has no place in a table
                if not m.payload:  # null or empty: a delete, as compaction reads it
                    self._data.pop(m.partition_key, None)
                    updates.append((m.partition_key, None))
                else:
                    self._data[m.partition_key] = m.payload
                    updates.append((m.partition_key, m.payload))
            listeners = list(self._listeners)
        for key, value in updates:
            for listener in listeners:
                self._call(listener, key, value)
        return len(updates)

    @staticmethod
    def _call(listener: TableListener, key: str, value: bytes | None) -> None:
        try:
            listener(key, value)
        except Exception:  # a listener's bug must not stop the table from following the topic
            log.exception("table view listener %r failed on key %r", listener, key)

    # Mapping-like reads: snapshots, safe while the table follows the topic in the background.

    def get(self, key: str, default: bytes | None = None) -> bytes | None:
        with self._lock:
            return self._data.get(key, default)

    def __getitem__(self, key: str) -> bytes:
        with self._lock:
            return self._data[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._data)

    def values(self) -> list[bytes]:
        with self._lock:
            return list(self._data.values())

    def items(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self._data.items())

    def to_dict(self) -> dict[str, bytes]:
        """A copy of the table as it is now."""
        with self._lock:
            return dict(self._data)

    def for_each(self, callback: Callable[[str, bytes], None]) -> None:
        """Call ``callback(key, value)`` for every entry now in the table."""
        for key, value in self.items():
            callback(key, value)

    def listen(self, callback: TableListener) -> None:
        """Call ``callback(key, value)`` for every update from now on (``value`` is ``None`` when
        a tombstone removed the key), from the thread or task that refreshes the table."""
        with self._lock:
            self._listeners.append(callback)

    def for_each_and_listen(self, callback: TableListener) -> None:
        """``for_each`` then ``listen``, as Pulsar's ``forEachAndListen``."""
        with self._lock:
            current = list(self._data.items())
            self._listeners.append(callback)
        for key, value in current:
            self._call(callback, key, value)


class _TopicsBase(Generic[_C]):
    """Every topic admin verb, once: the request and the parsing of its answer."""

    def __init__(self, client: _C) -> None:
        self._client = client

    def _op_create(self, topic: str) -> _Op[None]:
        yield _Call("PUT", _Topic.parse(topic).admin)

    def _op_delete(self, topic: str) -> _Op[None]:
        yield _Call("DELETE", _Topic.parse(topic).admin)

    def _op_list(self, namespace: str) -> _Op[list[str]]:
        body = yield _Call("GET", f"/admin/v2/persistent/{_namespace(namespace)}")
        return [str(t) for t in body]

    def _op_get(self, topic: str, what: str) -> _Op[dict[str, Any]]:
        return dict((yield _Call("GET", f"{_Topic.parse(topic).admin}/{what}")))

    def _op_lookup(self, topic: str) -> _Op[str]:
        t = _Topic.parse(topic)
        body = yield _Call("GET", f"/lookup/v2/topic/persistent/{t._parts}")
        url = str(body["httpUrl"]).rstrip("/")
        self._client._owners[t._parts] = url
        return url

    def _op_compact(self, topic: str) -> _Op[None]:
        yield _Call("PUT", f"{_Topic.parse(topic).admin}/compaction")

    def _op_compaction_status(self, topic: str) -> _Op[CompactionStatus]:
        body = yield _Call("GET", f"{_Topic.parse(topic).admin}/compaction")
        progress = body.get("progress")
        return CompactionStatus(
            status=body["status"],
            last_error=body.get("lastError"),
            progress=CompactionProgress.from_json(progress) if progress else None,
        )

    def _op_wait_for_compaction(
        self, topic: str, timeout: float | None, poll_interval: float, on_progress: ProgressCallback | None
    ) -> _Op[CompactionStatus]:
        started = time.monotonic()
        while True:
            status = yield from self._op_compaction_status(topic)
            elapsed = time.monotonic() - started
            if on_progress is not None:
                on_progress(status, elapsed)
            if not status.running:
                return status
            if timeout is not None and elapsed >= timeout:
                raise Timeout(f"the compaction of {topic} is still running after {timeout:g} s")
            pause = poll_interval if timeout is None else max(0.0, min(poll_interval, timeout - elapsed))
            yield _Sleep(pause)

    def _op_scrub(self, topic: str) -> _Op[dict[str, Any]]:
        return dict((yield _Call("POST", f"{_Topic.parse(topic).admin}/scrub")))

    def _op_scrub_runs(self, topic: str, limit: int) -> _Op[list[dict[str, Any]]]:
        body = yield _Call("GET", f"{_Topic.parse(topic).admin}/scrubRuns", {"limit": limit})
        return [dict(r) for r in body]

    def _op_skip_damaged(self, topic: str, ledger_id: int) -> _Op[dict[str, Any]]:
        return dict(
            (yield _Call("POST", f"{_Topic.parse(topic).admin}/ledgers/{int(ledger_id)}/skip-damaged"))
        )

    def _op_subscriptions(self, topic: str) -> _Op[list[str]]:
        return [str(s) for s in (yield _Call("GET", f"{_Topic.parse(topic).admin}/subscriptions"))]

    def _op_create_subscription(
        self, topic: str, subscription: str, initial_position: MessageIdLike
    ) -> _Op[None]:
        params: dict[str, str | int | bool] = {"initialPosition": _position(initial_position)}
        yield _Call("PUT", _Topic.parse(topic).subscription(subscription), params)

    def _op_delete_subscription(self, topic: str, subscription: str) -> _Op[None]:
        yield _Call("DELETE", _Topic.parse(topic).subscription(subscription))

    def _op_reset_cursor(self, topic: str, subscription: str, target: MessageIdLike | int) -> _Op[None]:
        path = f"{_Topic.parse(topic).subscription(subscription)}/resetcursor"
        body = _seek_body(target)
        if "publishTime" in body:
            yield _Call("POST", f"{path}/{body['publishTime']}")
        else:
            yield _Call("POST", path, body=body)

    def _op_threshold(self, topic: str, method: str, value: int | None = None) -> _Op[int | None]:
        return (yield from _op_threshold(f"{_Topic.parse(topic).admin}/compactionThreshold", method, value))

    def _op_permissions(self, topic: str) -> _Op[dict[str, list[str]]]:
        return dict((yield _Call("GET", f"{_Topic.parse(topic).admin}/permissions")))

    def _op_grant(self, topic: str, role: str, actions: Iterable[str]) -> _Op[None]:
        yield _Call("POST", f"{_Topic.parse(topic).admin}/permissions/{_q(role)}", body=_actions(actions))

    def _op_revoke(self, topic: str, role: str) -> _Op[None]:
        yield _Call("DELETE", f"{_Topic.parse(topic).admin}/permissions/{_q(role)}")


class _NamespacesBase(Generic[_C]):
    def __init__(self, client: _C) -> None:
        self._client = client

    def _op_threshold(self, namespace: str, method: str, value: int | None = None) -> _Op[int | None]:
        path = f"/admin/v2/namespaces/{_namespace(namespace)}/compactionThreshold"
        return (yield from _op_threshold(path, method, value))

    def _op_create(self, namespace: str) -> _Op[None]:
        yield _Call("PUT", f"/admin/v2/namespaces/{_namespace(namespace)}")

    def _op_delete(self, namespace: str) -> _Op[None]:
        yield _Call("DELETE", f"/admin/v2/namespaces/{_namespace(namespace)}")

    def _op_list(self, tenant: str) -> _Op[list[str]]:
        return [str(n) for n in (yield _Call("GET", f"/admin/v2/namespaces/{_q(tenant)}"))]

    def _op_permissions(self, namespace: str) -> _Op[dict[str, list[str]]]:
        return dict((yield _Call("GET", f"/admin/v2/namespaces/{_namespace(namespace)}/permissions")))

    def _op_grant(self, namespace: str, role: str, actions: Iterable[str]) -> _Op[None]:
        path = f"/admin/v2/namespaces/{_namespace(namespace)}/permissions/{_q(role)}"
        yield _Call("POST", path, body=_actions(actions))

    def _op_revoke(self, namespace: str, role: str) -> _Op[None]:
        yield _Call("DELETE", f"/admin/v2/namespaces/{_namespace(namespace)}/permissions/{_q(role)}")


class _TenantsBase(Generic[_C]):
    def __init__(self, client: _C) -> None:
        self._client = client

    def _op_list(self) -> _Op[list[str]]:
        return [str(t) for t in (yield _Call("GET", "/admin/v2/tenants"))]

    def _op_get(self, tenant: str) -> _Op[dict[str, list[str]]]:
        return dict((yield _Call("GET", f"/admin/v2/tenants/{_q(tenant)}")))

    def _op_put(
        self, method: str, tenant: str, admin_roles: Iterable[str], allowed_clusters: Iterable[str]
    ) -> _Op[None]:
        body = {"adminRoles": list(admin_roles), "allowedClusters": list(allowed_clusters)}
        yield _Call(method, f"/admin/v2/tenants/{_q(tenant)}", body=body)

    def _op_delete(self, tenant: str) -> _Op[None]:
        yield _Call("DELETE", f"/admin/v2/tenants/{_q(tenant)}")


def _actions(actions: Iterable[str]) -> list[str]:
    if isinstance(actions, str):
        raise TypeError('actions are a list, such as ["produce", "consume"]')
    return list(actions)


def _op_threshold(path: str, method: str, value: int | None) -> _Op[int | None]:
    """GET (a bare JSON number, or null when not set at this level), POST, DELETE."""
    if method == "POST" and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError("a compaction threshold is an int number of bytes")
    body = yield _Call(method, path, body=value)
    return None if body is None else int(body)


# -------------------------------------------------------------------------------- sync


class Client(_BaseClient):
    """A client of one compactor service, as ``pulsar.Client``.

    ``timeout`` (seconds) bounds every HTTP request; long polls get their wait on top. A 503
    is retried with back-off for up to ``retry_unavailable_s`` seconds (0: raise ``Unavailable``).
    ``transport`` is passed to ``httpx.Client`` (``httpx.MockTransport``, a WSGI app, ...).
    Closing the client closes the consumers and table views it made. A client may be shared
    by threads; a consumer or a reader is meant for one thread at a time.
    """

    def __init__(
        self,
        service_url: str = DEFAULT_URL,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        authentication: AuthenticationToken | None = None,
        tls_trust_certs_file_path: str | None = None,
        tls_allow_insecure_connection: bool = False,
        retry_unavailable_s: float = 30.0,
    ) -> None:
        super().__init__(service_url, timeout, authentication, retry_unavailable_s)
        self._http = httpx.Client(
            base_url=self.service_url,
            timeout=self.timeout,
            transport=transport,
            headers=self._headers(),
            verify=_tls_verify(tls_trust_certs_file_path, tls_allow_insecure_connection),
        )
        self._admin: Admin | None = None

    def _perform(self, effect: _Effect) -> Any:
        if isinstance(effect, _Sleep):
            time.sleep(effect.seconds)
            return None
        request = self._build(self._http, effect)
        started = time.monotonic()
        renewed = False
        hops = failures = 0
        for attempt in itertools.count():
            try:
                with _transport_errors(request):
                    response = self._http.send(request)
            except TransportError as e:
                wait = self._unreachable(effect, failures, started) if _never_sent(e) else None
                if wait is None:
                    raise
                failures += 1
                time.sleep(wait)
                request = self._build(self._http, effect)
                continue
            if not renewed and self._renew_after(response):
                renewed = True  # a token read anew, once
                response.close()
                request = self._build(self._http, effect)
                continue
            if self._follow(response, effect, hops):
                hops += 1
                response.close()
                request = self._build(self._http, effect)
                continue
            delay = self._retry_delay(response, attempt, started)
            if delay is None:
                break
            response.close()
            time.sleep(delay)
            request = self._build(self._http, effect)
        return _decode(response)

    def _run(self, op: _Op[T]) -> T:
        """Drive an operation: perform each effect it yields, send it the result or throw in
        the error, until it returns."""
        self._check_open()
        try:
            effect = next(op)
            while True:
                try:
                    result = self._perform(effect)
                except ClientError as e:
                    effect = op.throw(e)
                else:
                    effect = op.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    @property
    def admin(self) -> Admin:
        """Topic and namespace administration (``pulsar-admin``'s verbs)."""
        if self._admin is None:
            self._admin = Admin(self)
        return self._admin

    def create_producer(self, topic: str) -> Producer:
        """A producer of an existing topic (``NotFound`` if there is none)."""
        self._check_open()
        producer = Producer(self, _Topic.parse(topic))
        self._run(producer._op_open())
        return producer

    def subscribe(
        self,
        topic: str,
        subscription_name: str,
        *,
        read_compacted: bool = False,
        initial_position: MessageIdLike = "latest",
        ack_timeout_ms: int = 0,
        consumer_name: str | None = None,
        receiver_queue_size: int = 100,
        ack_group_time_ms: int = 100,
        subscription_type: str = ConsumerType.Exclusive,
        priority_level: int = 0,
        negative_ack_redelivery_delay_ms: int = 60_000,
        dead_letter_policy: DeadLetterPolicy | None = None,
    ) -> Consumer:
        """Create the subscription if it does not exist (at ``initial_position``), then attach
        this consumer to it. With ``read_compacted`` the consumer reads the compacted topic up
        to the horizon and the log after it; without, every message of the log. It is the
        consumer's choice, as in Pulsar: the subscription holds only the position and the
        acknowledgements, shared by consumers of either kind.

        ``subscription_type`` is Pulsar's (``ConsumerType.Exclusive``, the default, ``Failover``,
        ``Shared``, ``KeyShared``, or the names ``"Key_Shared"`` etc.); the first consumer fixes
        the subscription's type. ``ConsumerBusy`` for a second Exclusive consumer, or one of
        another type than the consumers attached. Failover: the active consumer is the first by
        ``priority_level`` (lower first), then ``consumer_name``. ``read_compacted`` only on
        Exclusive and Failover (``BadRequest`` otherwise, as Pulsar), and cumulative acks only
        there (``ValueError``). ``ack_timeout_ms`` > 0 has the server redeliver messages left
        unacknowledged that long. ``negative_acknowledge`` has a message delivered again after
        ``negative_ack_redelivery_delay_ms`` (Pulsar's default, 60 s); ``dead_letter_policy``
        (Shared, Key_Shared) moves a message redelivered too often to a dead letter topic.

        Acknowledgements are grouped, as Pulsar's ``acknowledgmentGroupTime``: an acknowledge
        call returns at once, and what was acknowledged is sent at the next call of the
        consumer once ``ack_group_time_ms`` has passed since the oldest (or when
        ``MAX_ACK_GROUP`` individual ones are held), before a receive waits on the server,
        and by ``redeliver_unacknowledged_messages``, ``seek`` and ``close``. A consumer that
        stops without ``close`` may have its last acknowledged messages delivered again.
        ``ack_group_time_ms=0`` sends each acknowledgement and returns once the server has it.
        """
        self._check_open()
        consumer = Consumer(
            self,
            _Topic.parse(topic),
            subscription_name,
            read_compacted=read_compacted,
            initial_position=initial_position,
            ack_timeout_ms=ack_timeout_ms,
            consumer_name=consumer_name,
            receiver_queue_size=receiver_queue_size,
            ack_group_time_ms=ack_group_time_ms,
            subscription_type=subscription_type,
            priority_level=priority_level,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            dead_letter_policy=dead_letter_policy,
        )
        self._run(consumer._op_open())
        self._children.add(consumer)
        return consumer

    def create_reader(
        self,
        topic: str,
        start_message_id: MessageIdLike,
        *,
        read_compacted: bool = False,
        start_message_id_inclusive: bool = False,
        receiver_queue_size: int = 1000,
    ) -> Reader:
        """A reader of ``topic`` from ``start_message_id`` (``MessageId.earliest``, ``.latest``,
        an id, or its ``"L:E"`` text); no subscription, nothing kept on the server.

        As in Pulsar, the start id itself is skipped unless ``start_message_id_inclusive``
        (so a reader made from the last id you processed resumes after it). ``latest`` means
        the messages published after the reader is created. ``receiver_queue_size`` is the page
        size of the reads.
        """
        self._check_open()
        reader = Reader(
            self,
            _Topic.parse(topic),
            start_message_id,
            read_compacted=read_compacted,
            inclusive=start_message_id_inclusive,
            receiver_queue_size=receiver_queue_size,
        )
        self._run(reader._op_fill())
        return reader

    def create_table_view(
        self, topic: str, *, poll_interval: float = 0.5, receiver_queue_size: int = 1000
    ) -> TableView:
        """A key -> latest value map of ``topic``, loaded now through a compacted read from the
        earliest message. ``refresh()`` applies newer messages; ``start()`` has a background
        thread do it every ``poll_interval`` seconds until ``close()``."""
        self._check_open()
        reader = Reader(
            self,
            _Topic.parse(topic),
            MessageId.earliest,
            read_compacted=True,
            inclusive=True,
            receiver_queue_size=receiver_queue_size,
        )
        view = TableView(self, reader, poll_interval)
        view.refresh()
        self._children.add(view)
        return view

    def close(self) -> None:
        """Close the consumers and table views made by this client, then its connections."""
        if self._closed:
            return
        for child in list(self._children):
            try:
                child.close()
            except ClientError as e:
                log.warning("closing %r: %s", child, e)
        self._closed = True
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Producer(_ProducerBase[Client]):
    """Sends messages to one topic; made by ``Client.create_producer``."""

    def send(
        self,
        value: bytes | str | None,
        *,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_timestamp: int | None = None,
    ) -> MessageId:
        """Store one message and return its id. ``value=None`` is a tombstone for ``key``;
        a ``str`` is sent as UTF-8."""
        return self._client._run(self._op_send(value, key, properties, event_timestamp))

    def send_many(self, messages: Iterable[MessageLike]) -> list[MessageId]:
        """Store many messages, in requests of up to ``MAX_BATCH_MESSAGES``; ids in order.

        Each item is an ``OutgoingMessage``, ``bytes``/``str`` (no key), a ``(key, value)``
        pair, or a mapping of ``OutgoingMessage``'s fields. Each request is all-or-nothing;
        if one fails, the requests before it are stored.
        """
        return self._client._run(self._op_send_many(messages))

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer(_ConsumerBase[Client]):
    """A consumer attached to a durable subscription; made by ``Client.subscribe``.

    Messages come in order; each is redelivered until acknowledged (after
    ``redeliver_unacknowledged_messages``, the ack timeout, or this consumer closing).
    """

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits for one up to ``timeout_millis`` (``None``: for ever) and
        raises ``Timeout`` if none came."""
        if self._queue and not self._closed:
            return self._queue.popleft()
        got = self._client._run(self._op_receive(timeout_millis, None))
        if not got:
            raise Timeout(f"no message on {self._topic} for {self._subscription} within {timeout_millis} ms")
        return got[0]

    def batch_receive(self, max_messages: int = 100, timeout_millis: int = 0) -> list[Message]:
        """Up to ``max_messages``: those already here, or else the first to arrive within
        ``timeout_millis`` (0: only what is there now). An empty list when none came."""
        return self._client._run(self._op_receive(timeout_millis, max_messages))

    def acknowledge(self, message: Message | MessageIdLike) -> None:
        """Acknowledge one message: it will not be delivered to this subscription again.
        Sent grouped with others unless the consumer was made with ``ack_group_time_ms=0``
        (see ``Client.subscribe``)."""
        self._client._run(self._op_ack([message], cumulative=False))

    def acknowledge_many(self, messages: Iterable[Message | MessageIdLike]) -> None:
        """Acknowledge several messages at once (not in Pulsar's API)."""
        self._client._run(self._op_ack(messages, cumulative=False))

    def acknowledge_cumulative(self, message: Message | MessageIdLike) -> None:
        """Acknowledge this message and every message before it (Exclusive and Failover)."""
        self._client._run(self._op_ack([message], cumulative=True))

    def negative_acknowledge(self, message: Message | MessageIdLike) -> None:
        """This message could not be processed: have it delivered again after the consumer's
        ``negative_ack_redelivery_delay_ms`` (on Exclusive and Failover subscriptions, as in
        Pulsar, every unacknowledged message is then delivered again, in order)."""
        self._client._run(self._op_negative_ack([message]))

    def negative_acknowledge_many(self, messages: Iterable[Message | MessageIdLike]) -> None:
        """Negatively acknowledge several messages in one request (not in Pulsar's API)."""
        self._client._run(self._op_negative_ack(messages))

    def redeliver_unacknowledged_messages(self) -> None:
        """Have every delivered, unacknowledged message delivered again (and drop the local
        receiver queue, whose messages are among them)."""
        self._client._run(self._op_redeliver())

    def seek(self, target: MessageIdLike | int) -> None:
        """Reset the subscription to a message id (``MessageId.earliest``/``latest`` too) or,
        given an ``int``, to the first message published at or after that time in ms."""
        self._client._run(self._op_seek(target))

    def unsubscribe(self) -> None:
        """Close this consumer and delete its subscription."""
        self._client._run(self._op_unsubscribe())

    def close(self) -> None:
        """Detach from the subscription; its unacknowledged messages will be redelivered."""
        if not self._closed:
            self._client._run(self._op_close())

    def __iter__(self) -> Iterator[Message]:
        """Receive for ever: ``for msg in consumer: ...; consumer.acknowledge(msg)``."""
        while True:
            yield self.receive()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Reader(_ReaderBase[Client]):
    """Reads a topic from a position without a subscription; made by ``Client.create_reader``.

    Iterating yields the messages available now and stops at the end of the topic.
    """

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits (polling) up to ``timeout_millis`` (``None``: for ever) and
        raises ``Timeout`` if none came."""
        if self._queue and not self._closed:
            return self._queue.popleft()
        return self._client._run(self._op_read_next(timeout_millis))

    def has_message_available(self) -> bool:
        """Whether ``read_next`` would return at once."""
        return bool(self._queue) or self._client._run(self._op_has_message_available())

    def seek(self, message_id: MessageIdLike) -> None:
        """Read from ``message_id`` next (exclusive unless the reader was made inclusive)."""
        self._client._run(self._op_seek(message_id))

    def close(self) -> None:
        self._closed = True
        self._queue.clear()

    def __iter__(self) -> Iterator[Message]:
        while self.has_message_available():
            yield self._queue.popleft()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TableView(_TableViewBase[Reader]):
    """A live key -> latest value map over a topic, as Pulsar's ``TableView``; made by
    ``Client.create_table_view``. Keyless messages are ignored; a tombstone removes its key."""

    def __init__(self, client: Client, reader: Reader, poll_interval: float) -> None:
        super().__init__(reader, poll_interval)
        self._client = client
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> int:
        """Apply every message published since the last refresh; returns how many changed the
        table (tombstones included)."""
        with self._refresh_lock:
            return self._client._run(self._op_refresh())

    def start(self) -> TableView:
        """Follow the topic in a background thread, refreshing every ``poll_interval`` s; errors
        are logged and kept in ``last_error``, and the thread goes on."""
        if self._thread is None:
            self._reader._check_open()
            self._thread = threading.Thread(
                target=self._follow, name=f"table-view {self.topic()}", daemon=True
            )
            self._thread.start()
        return self

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.refresh()
                self.last_error = None
            except AlreadyClosed:
                return
            except ClientError as e:
                self.last_error = e
                log.warning("table view of %s: %s", self.topic(), e)

    def close(self) -> None:
        """Stop following the topic."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._client.timeout + 1)
            self._thread = None
        self._reader.close()

    def __enter__(self) -> TableView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TopicsAdmin(_TopicsBase[Client]):
    """``client.admin.topics``: pulsar-admin's topic verbs."""

    def create(self, topic: str) -> None:
        """Create a topic; ``Conflict`` if it exists."""
        self._client._run(self._op_create(topic))

    def delete(self, topic: str) -> None:
        """Delete a topic and all its data; ``Conflict`` while it is being compacted."""
        self._client._run(self._op_delete(topic))

    def list(self, namespace: str) -> list[str]:
        """The full names of the topics in ``"tenant/namespace"``."""
        return self._client._run(self._op_list(namespace))

    def lookup(self, topic: str) -> str:
        """The URL of the instance that serves the topic (Pulsar's lookup); later requests
        for the topic go there."""
        return self._client._run(self._op_lookup(topic))

    def stats(self, topic: str) -> dict[str, Any]:
        """Counters and, per subscription, backlog and consumers: the server's JSON."""
        return self._client._run(self._op_get(topic, "stats"))

    def internal_stats(self, topic: str) -> dict[str, Any]:
        """Ledgers, cursors, the compacted ledger and the horizon: the server's JSON."""
        return self._client._run(self._op_get(topic, "internalStats"))

    def compact(self, topic: str) -> None:
        """Start a compaction in the background; ``Conflict`` if one is running."""
        self._client._run(self._op_compact(topic))

    def compaction_status(self, topic: str) -> CompactionStatus:
        """The status of the topic's last compaction."""
        return self._client._run(self._op_compaction_status(topic))

    def scrub(self, topic: str) -> dict[str, Any]:
        """Verify every file of the topic against its recorded checksum now; the report
        (``status`` CLEAN, DAMAGED or ERROR, ``findings`` one line per damaged file)."""
        return self._client._run(self._op_scrub(topic))

    def scrub_runs(self, topic: str, limit: int = 100) -> builtins.list[dict[str, Any]]:
        """The topic's scrubs, newest first."""
        return self._client._run(self._op_scrub_runs(topic, limit))

    def skip_damaged(self, topic: str, ledger_id: int) -> dict[str, Any]:
        """Accept losing a damaged ledger's unreadable entries, so that reads and compaction go
        on without them; ``Conflict`` unless the ledger is known damaged."""
        return self._client._run(self._op_skip_damaged(topic, ledger_id))

    def wait_for_compaction(
        self,
        topic: str,
        *,
        timeout: float | None = 300.0,
        poll_interval: float = 0.25,
        on_progress: ProgressCallback | None = None,
    ) -> CompactionStatus:
        """Poll the status until it is not RUNNING and return it (look at ``status`` for
        ``ERROR``); ``Timeout`` after ``timeout`` seconds. ``on_progress(status, elapsed)`` is
        called after every poll."""
        return self._client._run(self._op_wait_for_compaction(topic, timeout, poll_interval, on_progress))

    def get_compaction_threshold(self, topic: str) -> int | None:
        """The topic's own threshold in bytes; ``None`` when it takes its namespace's."""
        return self._client._run(self._op_threshold(topic, "GET"))

    def set_compaction_threshold(self, topic: str, threshold: int) -> None:
        """Compact automatically once the compaction cursor's backlog passes ``threshold``
        bytes (0: never)."""
        self._client._run(self._op_threshold(topic, "POST", threshold))

    def remove_compaction_threshold(self, topic: str) -> None:
        """Fall back to the namespace's threshold (then the service's)."""
        self._client._run(self._op_threshold(topic, "DELETE"))

    def subscriptions(self, topic: str) -> builtins.list[str]:  # (``list`` is a method here)
        """The names of the topic's subscriptions."""
        return self._client._run(self._op_subscriptions(topic))

    def create_subscription(
        self,
        topic: str,
        subscription: str,
        *,
        initial_position: MessageIdLike = "latest",
    ) -> None:
        """Create a durable subscription at ``earliest`` or ``latest``; ``Conflict`` if it exists.
        As in Pulsar it has no ``read_compacted``: each consumer chooses when it subscribes."""
        self._client._run(self._op_create_subscription(topic, subscription, initial_position))

    def delete_subscription(self, topic: str, subscription: str) -> None:
        self._client._run(self._op_delete_subscription(topic, subscription))

    def reset_cursor(self, topic: str, subscription: str, target: MessageIdLike | int) -> None:
        """Move a subscription to a message id or (an ``int``) to a publish time in ms."""
        self._client._run(self._op_reset_cursor(topic, subscription, target))

    def permissions(self, topic: str) -> dict[str, builtins.list[str]]:
        """role -> actions granted on the topic, its own and its namespace's."""
        return self._client._run(self._op_permissions(topic))

    def grant_permission(self, topic: str, role: str, actions: Iterable[str]) -> None:
        """Set the role's actions (``"produce"``, ``"consume"``) on the topic."""
        self._client._run(self._op_grant(topic, role, actions))

    def revoke_permission(self, topic: str, role: str) -> None:
        self._client._run(self._op_revoke(topic, role))


class NamespacesAdmin(_NamespacesBase[Client]):
    """``client.admin.namespaces``: policies of a ``"tenant/namespace"``."""

    def get_compaction_threshold(self, namespace: str) -> int | None:
        """The namespace's threshold in bytes; ``None`` when it takes the service's."""
        return self._client._run(self._op_threshold(namespace, "GET"))

    def set_compaction_threshold(self, namespace: str, threshold: int) -> None:
        self._client._run(self._op_threshold(namespace, "POST", threshold))

    def remove_compaction_threshold(self, namespace: str) -> None:
        self._client._run(self._op_threshold(namespace, "DELETE"))

    def create(self, namespace: str) -> None:
        """Create ``"tenant/namespace"``; ``NotFound`` without the tenant, ``Conflict`` if it exists."""
        self._client._run(self._op_create(namespace))

    def delete(self, namespace: str) -> None:
        """``Conflict`` while it has topics."""
        self._client._run(self._op_delete(namespace))

    def list(self, tenant: str) -> builtins.list[str]:
        """The tenant's namespaces as ``"tenant/namespace"``."""
        return self._client._run(self._op_list(tenant))

    def permissions(self, namespace: str) -> dict[str, builtins.list[str]]:
        """role -> actions granted on the namespace."""
        return self._client._run(self._op_permissions(namespace))

    def grant_permission(self, namespace: str, role: str, actions: Iterable[str]) -> None:
        """Set the role's actions (``"produce"``, ``"consume"``) on every topic of the namespace."""
        self._client._run(self._op_grant(namespace, role, actions))

    def revoke_permission(self, namespace: str, role: str) -> None:
        self._client._run(self._op_revoke(namespace, role))


class TenantsAdmin(_TenantsBase[Client]):
    """``client.admin.tenants``: pulsar-admin's tenant verbs (a superuser's)."""

    def list(self) -> builtins.list[str]:
        return self._client._run(self._op_list())

    def get(self, tenant: str) -> dict[str, builtins.list[str]]:
        """``{"adminRoles": [...], "allowedClusters": [...]}``."""
        return self._client._run(self._op_get(tenant))

    def create(
        self, tenant: str, admin_roles: Iterable[str] = (), allowed_clusters: Iterable[str] = ()
    ) -> None:
        self._client._run(self._op_put("PUT", tenant, admin_roles, allowed_clusters))

    def update(
        self, tenant: str, admin_roles: Iterable[str] = (), allowed_clusters: Iterable[str] = ()
    ) -> None:
        self._client._run(self._op_put("POST", tenant, admin_roles, allowed_clusters))

    def delete(self, tenant: str) -> None:
        """``Conflict`` while it has namespaces."""
        self._client._run(self._op_delete(tenant))


class Admin:
    """``client.admin``: ``tenants``, ``namespaces`` and ``topics``, as ``pulsar-admin``."""

    def __init__(self, client: Client) -> None:
        self.tenants = TenantsAdmin(client)
        self.topics = TopicsAdmin(client)
        self.namespaces = NamespacesAdmin(client)


# -------------------------------------------------------------------------------- async


class AsyncClient(_BaseClient):
    """``Client`` with ``async def``: ``async with AsyncClient(url) as client: ...``."""

    def __init__(
        self,
        service_url: str = DEFAULT_URL,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        authentication: AuthenticationToken | None = None,
        tls_trust_certs_file_path: str | None = None,
        tls_allow_insecure_connection: bool = False,
        retry_unavailable_s: float = 30.0,
    ) -> None:
        super().__init__(service_url, timeout, authentication, retry_unavailable_s)
        self._http = httpx.AsyncClient(
            base_url=self.service_url,
            timeout=self.timeout,
            transport=transport,
            headers=self._headers(),
            verify=_tls_verify(tls_trust_certs_file_path, tls_allow_insecure_connection),
        )
        self._admin: AsyncAdmin | None = None

    async def _perform(self, effect: _Effect) -> Any:
        if isinstance(effect, _Sleep):
            await asyncio.sleep(effect.seconds)
            return None
        request = self._build(self._http, effect)
        started = time.monotonic()
        renewed = False
        hops = failures = 0
        for attempt in itertools.count():
            try:
                with _transport_errors(request):
                    response = await self._http.send(request)
            except TransportError as e:
                wait = self._unreachable(effect, failures, started) if _never_sent(e) else None
                if wait is None:
                    raise
                failures += 1
                await asyncio.sleep(wait)
                request = self._build(self._http, effect)
                continue
            if not renewed and self._renew_after(response):
                renewed = True  # a token read anew, once
                await response.aclose()
                request = self._build(self._http, effect)
                continue
            if self._follow(response, effect, hops):
                hops += 1
                await response.aclose()
                request = self._build(self._http, effect)
                continue
            delay = self._retry_delay(response, attempt, started)
            if delay is None:
                break
            await response.aclose()
            await asyncio.sleep(delay)
            request = self._build(self._http, effect)
        return _decode(response)

    async def _run(self, op: _Op[T]) -> T:
        """``Client._run``, awaiting the effects."""
        self._check_open()
        try:
            effect = next(op)
            while True:
                try:
                    result = await self._perform(effect)
                except ClientError as e:
                    effect = op.throw(e)
                else:
                    effect = op.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    @property
    def admin(self) -> AsyncAdmin:
        if self._admin is None:
            self._admin = AsyncAdmin(self)
        return self._admin

    async def create_producer(self, topic: str) -> AsyncProducer:
        """See ``Client.create_producer``."""
        self._check_open()
        producer = AsyncProducer(self, _Topic.parse(topic))
        await self._run(producer._op_open())
        return producer

    async def subscribe(
        self,
        topic: str,
        subscription_name: str,
        *,
        read_compacted: bool = False,
        initial_position: MessageIdLike = "latest",
        ack_timeout_ms: int = 0,
        consumer_name: str | None = None,
        receiver_queue_size: int = 100,
        ack_group_time_ms: int = 100,
        subscription_type: str = ConsumerType.Exclusive,
        priority_level: int = 0,
        negative_ack_redelivery_delay_ms: int = 60_000,
        dead_letter_policy: DeadLetterPolicy | None = None,
    ) -> AsyncConsumer:
        """See ``Client.subscribe``."""
        self._check_open()
        consumer = AsyncConsumer(
            self,
            _Topic.parse(topic),
            subscription_name,
            read_compacted=read_compacted,
            initial_position=initial_position,
            ack_timeout_ms=ack_timeout_ms,
            consumer_name=consumer_name,
            receiver_queue_size=receiver_queue_size,
            ack_group_time_ms=ack_group_time_ms,
            subscription_type=subscription_type,
            priority_level=priority_level,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            dead_letter_policy=dead_letter_policy,
        )
        await self._run(consumer._op_open())
        self._children.add(consumer)
        return consumer

    async def create_reader(
        self,
        topic: str,
        start_message_id: MessageIdLike,
        *,
        read_compacted: bool = False,
        start_message_id_inclusive: bool = False,
        receiver_queue_size: int = 1000,
    ) -> AsyncReader:
        """See ``Client.create_reader``."""
        self._check_open()
        reader = AsyncReader(
            self,
            _Topic.parse(topic),
            start_message_id,
            read_compacted=read_compacted,
            inclusive=start_message_id_inclusive,
            receiver_queue_size=receiver_queue_size,
        )
        await self._run(reader._op_fill())
        return reader

    async def create_table_view(
        self, topic: str, *, poll_interval: float = 0.5, receiver_queue_size: int = 1000
    ) -> AsyncTableView:
        """See ``Client.create_table_view``; ``start()`` follows the topic in an asyncio task."""
        self._check_open()
        reader = AsyncReader(
            self,
            _Topic.parse(topic),
            MessageId.earliest,
            read_compacted=True,
            inclusive=True,
            receiver_queue_size=receiver_queue_size,
        )
        view = AsyncTableView(self, reader, poll_interval)
        await view.refresh()
        self._children.add(view)
        return view

    async def close(self) -> None:
        """Close the consumers and table views made by this client, then its connections."""
        if self._closed:
            return
        for child in list(self._children):
            try:
                await child.close()
            except ClientError as e:
                log.warning("closing %r: %s", child, e)
        self._closed = True
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class AsyncProducer(_ProducerBase[AsyncClient]):
    """See ``Producer``."""

    async def send(
        self,
        value: bytes | str | None,
        *,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_timestamp: int | None = None,
    ) -> MessageId:
        return await self._client._run(self._op_send(value, key, properties, event_timestamp))

    async def send_many(self, messages: Iterable[MessageLike]) -> list[MessageId]:
        return await self._client._run(self._op_send_many(messages))

    async def close(self) -> None:
        self._closed = True


class AsyncConsumer(_ConsumerBase[AsyncClient]):
    """See ``Consumer``."""

    async def receive(self, timeout_millis: int | None = None) -> Message:
        if self._queue and not self._closed:
            return self._queue.popleft()
        got = await self._client._run(self._op_receive(timeout_millis, None))
        if not got:
            raise Timeout(f"no message on {self._topic} for {self._subscription} within {timeout_millis} ms")
        return got[0]

    async def batch_receive(self, max_messages: int = 100, timeout_millis: int = 0) -> list[Message]:
        return await self._client._run(self._op_receive(timeout_millis, max_messages))

    async def acknowledge(self, message: Message | MessageIdLike) -> None:
        await self._client._run(self._op_ack([message], cumulative=False))

    async def acknowledge_many(self, messages: Iterable[Message | MessageIdLike]) -> None:
        await self._client._run(self._op_ack(messages, cumulative=False))

    async def acknowledge_cumulative(self, message: Message | MessageIdLike) -> None:
        await self._client._run(self._op_ack([message], cumulative=True))

    async def negative_acknowledge(self, message: Message | MessageIdLike) -> None:
        await self._client._run(self._op_negative_ack([message]))

    async def negative_acknowledge_many(self, messages: Iterable[Message | MessageIdLike]) -> None:
        await self._client._run(self._op_negative_ack(messages))

    async def redeliver_unacknowledged_messages(self) -> None:
        await self._client._run(self._op_redeliver())

    async def seek(self, target: MessageIdLike | int) -> None:
        await self._client._run(self._op_seek(target))

    async def unsubscribe(self) -> None:
        await self._client._run(self._op_unsubscribe())

    async def close(self) -> None:
        if not self._closed:
            await self._client._run(self._op_close())

    async def __aiter__(self) -> AsyncIterator[Message]:
        while True:
            yield await self.receive()


class AsyncReader(_ReaderBase[AsyncClient]):
    """See ``Reader``; ``async for msg in reader`` stops at the end of the topic."""

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        if self._queue and not self._closed:
            return self._queue.popleft()
        return await self._client._run(self._op_read_next(timeout_millis))

    async def has_message_available(self) -> bool:
        return bool(self._queue) or await self._client._run(self._op_has_message_available())

    async def seek(self, message_id: MessageIdLike) -> None:
        await self._client._run(self._op_seek(message_id))

    async def close(self) -> None:
        self._closed = True
        self._queue.clear()

    async def __aiter__(self) -> AsyncIterator[Message]:
        while await self.has_message_available():
            yield self._queue.popleft()


class AsyncTableView(_TableViewBase[AsyncReader]):
    """See ``TableView``; ``start()`` follows the topic in an asyncio task of the running loop."""

    def __init__(self, client: AsyncClient, reader: AsyncReader, poll_interval: float) -> None:
        super().__init__(reader, poll_interval)
        self._client = client
        self._refresh_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> int:
        async with self._refresh_lock:
            return await self._client._run(self._op_refresh())

    def start(self) -> AsyncTableView:
        if self._task is None:
            self._reader._check_open()
            self._task = asyncio.get_running_loop().create_task(
                self._follow(), name=f"table-view {self.topic()}"
            )
        return self

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.refresh()
                self.last_error = None
            except AlreadyClosed:
                return
            except ClientError as e:
                self.last_error = e
                log.warning("table view of %s: %s", self.topic(), e)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._reader.close()


class AsyncTopicsAdmin(_TopicsBase[AsyncClient]):
    """See ``TopicsAdmin``."""

    async def create(self, topic: str) -> None:
        await self._client._run(self._op_create(topic))

    async def delete(self, topic: str) -> None:
        await self._client._run(self._op_delete(topic))

    async def list(self, namespace: str) -> list[str]:
        return await self._client._run(self._op_list(namespace))

    async def lookup(self, topic: str) -> str:
        return await self._client._run(self._op_lookup(topic))

    async def stats(self, topic: str) -> dict[str, Any]:
        return await self._client._run(self._op_get(topic, "stats"))

    async def internal_stats(self, topic: str) -> dict[str, Any]:
        return await self._client._run(self._op_get(topic, "internalStats"))

    async def compact(self, topic: str) -> None:
        await self._client._run(self._op_compact(topic))

    async def compaction_status(self, topic: str) -> CompactionStatus:
        return await self._client._run(self._op_compaction_status(topic))

    async def scrub(self, topic: str) -> dict[str, Any]:
        return await self._client._run(self._op_scrub(topic))

    async def scrub_runs(self, topic: str, limit: int = 100) -> builtins.list[dict[str, Any]]:
        return await self._client._run(self._op_scrub_runs(topic, limit))

    async def skip_damaged(self, topic: str, ledger_id: int) -> dict[str, Any]:
        return await self._client._run(self._op_skip_damaged(topic, ledger_id))

    async def wait_for_compaction(
        self,
        topic: str,
        *,
        timeout: float | None = 300.0,
        poll_interval: float = 0.25,
        on_progress: ProgressCallback | None = None,
    ) -> CompactionStatus:
        return await self._client._run(
            self._op_wait_for_compaction(topic, timeout, poll_interval, on_progress)
        )

    async def get_compaction_threshold(self, topic: str) -> int | None:
        return await self._client._run(self._op_threshold(topic, "GET"))

    async def set_compaction_threshold(self, topic: str, threshold: int) -> None:
        await self._client._run(self._op_threshold(topic, "POST", threshold))

    async def remove_compaction_threshold(self, topic: str) -> None:
        await self._client._run(self._op_threshold(topic, "DELETE"))

    async def subscriptions(self, topic: str) -> builtins.list[str]:
        return await self._client._run(self._op_subscriptions(topic))

    async def create_subscription(
        self,
        topic: str,
        subscription: str,
        *,
        initial_position: MessageIdLike = "latest",
    ) -> None:
        await self._client._run(self._op_create_subscription(topic, subscription, initial_position))

    async def delete_subscription(self, topic: str, subscription: str) -> None:
        await self._client._run(self._op_delete_subscription(topic, subscription))

    async def reset_cursor(self, topic: str, subscription: str, target: MessageIdLike | int) -> None:
        await self._client._run(self._op_reset_cursor(topic, subscription, target))

    async def permissions(self, topic: str) -> dict[str, builtins.list[str]]:
        return await self._client._run(self._op_permissions(topic))

    async def grant_permission(self, topic: str, role: str, actions: Iterable[str]) -> None:
        await self._client._run(self._op_grant(topic, role, actions))

    async def revoke_permission(self, topic: str, role: str) -> None:
        await self._client._run(self._op_revoke(topic, role))


class AsyncNamespacesAdmin(_NamespacesBase[AsyncClient]):
    """See ``NamespacesAdmin``."""

    async def get_compaction_threshold(self, namespace: str) -> int | None:
        return await self._client._run(self._op_threshold(namespace, "GET"))

    async def set_compaction_threshold(self, namespace: str, threshold: int) -> None:
        await self._client._run(self._op_threshold(namespace, "POST", threshold))

    async def remove_compaction_threshold(self, namespace: str) -> None:
        await self._client._run(self._op_threshold(namespace, "DELETE"))

    async def create(self, namespace: str) -> None:
        await self._client._run(self._op_create(namespace))

    async def delete(self, namespace: str) -> None:
        await self._client._run(self._op_delete(namespace))

    async def list(self, tenant: str) -> builtins.list[str]:
        return await self._client._run(self._op_list(tenant))

    async def permissions(self, namespace: str) -> dict[str, builtins.list[str]]:
        return await self._client._run(self._op_permissions(namespace))

    async def grant_permission(self, namespace: str, role: str, actions: Iterable[str]) -> None:
        await self._client._run(self._op_grant(namespace, role, actions))

    async def revoke_permission(self, namespace: str, role: str) -> None:
        await self._client._run(self._op_revoke(namespace, role))


class AsyncTenantsAdmin(_TenantsBase[AsyncClient]):
    """See ``TenantsAdmin``."""

    async def list(self) -> builtins.list[str]:
        return await self._client._run(self._op_list())

    async def get(self, tenant: str) -> dict[str, builtins.list[str]]:
        return await self._client._run(self._op_get(tenant))

    async def create(
        self, tenant: str, admin_roles: Iterable[str] = (), allowed_clusters: Iterable[str] = ()
    ) -> None:
        await self._client._run(self._op_put("PUT", tenant, admin_roles, allowed_clusters))

    async def update(
        self, tenant: str, admin_roles: Iterable[str] = (), allowed_clusters: Iterable[str] = ()
    ) -> None:
        await self._client._run(self._op_put("POST", tenant, admin_roles, allowed_clusters))

    async def delete(self, tenant: str) -> None:
        await self._client._run(self._op_delete(tenant))


class AsyncAdmin:
    """``AsyncClient.admin``: ``tenants``, ``namespaces`` and ``topics`` with ``async def``."""

    def __init__(self, client: AsyncClient) -> None:
        self.tenants = AsyncTenantsAdmin(client)
        self.topics = AsyncTopicsAdmin(client)
        self.namespaces = AsyncNamespacesAdmin(client)
