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
body; a ``ClientError`` is thrown in instead). [`Client`][api.client.Client] drives an operation
with ``httpx.Client`` and ``time.sleep``, [`AsyncClient`][api.client.AsyncClient] with
``httpx.AsyncClient`` and ``asyncio.sleep``: that is the only difference between the two sides.
Requests are built in one place (``_BaseClient._build``), responses become results or errors in
one place (``_decode``), and httpx's exceptions are translated in one place
(``_transport_errors``).

The modules, one per concern (import from the package; the modules are its layout, not its API)::

    errors       the exception tree above
    message      MessageId, Message, OutgoingMessage, the page decoder
    auth         AuthenticationToken, TLS options
    _core        names and paths, the effects, the request/response boundary, _BaseClient,
                 and what the others are given of a runner (_SyncRunner, _AsyncRunner)
    producer     the producer's operations; Producer, AsyncProducer
    consumer     the consumer's operations and acknowledgement grouping; Consumer, AsyncConsumer
    reader       the reader's operations; Reader, AsyncReader
    table_view   the key -> latest value map; TableView, AsyncTableView
    admin        Admin, AsyncAdmin; topic verbs (TopicsAdmin, AsyncTopicsAdmin), CompactionStatus, TableStatus
    tenancy      the tenant and namespace verbs (TenantsAdmin, NamespacesAdmin, and async)
    sync         the sync runner: Client
    aio          the async runner: AsyncClient
"""

from __future__ import annotations

from api.client._core import COMPACTION_SUBSCRIPTION, DEFAULT_URL
from api.client.admin import (
    Admin,
    AsyncAdmin,
    AsyncTopicsAdmin,
    CompactionProgress,
    CompactionStatus,
    ProgressCallback,
    TableStatus,
    TopicsAdmin,
)
from api.client.aio import AsyncClient
from api.client.auth import AuthenticationToken
from api.client.consumer import MAX_ACK_GROUP, AsyncConsumer, Consumer, ConsumerType, DeadLetterPolicy
from api.client.errors import (
    AlreadyClosed,
    AuthenticationError,
    AuthorizationError,
    BadRequest,
    ClientError,
    Conflict,
    ConsumerBusy,
    NotFound,
    ServerError,
    Timeout,
    TooLarge,
    TransportError,
    Unavailable,
)
from api.client.message import (
    MAX_BATCH_BYTES,
    MAX_BATCH_MESSAGES,
    Message,
    MessageId,
    MessageIdLike,
    MessageLike,
    OutgoingMessage,
)
from api.client.multi_topic import AsyncMultiTopicConsumer, MultiTopicConsumer, TopicSpec
from api.client.producer import AsyncProducer, Producer
from api.client.reader import AsyncReader, Reader
from api.client.routing import HashingScheme, MessageRouter, PartitionsRoutingMode
from api.client.sync import Client
from api.client.table_view import AsyncTableView, TableListener, TableView
from api.client.tenancy import AsyncNamespacesAdmin, AsyncTenantsAdmin, NamespacesAdmin, TenantsAdmin

__all__ = [
    # clients
    "Client",
    "AsyncClient",
    "AuthenticationToken",
    "DEFAULT_URL",
    # producing, consuming, reading
    "Producer",
    "AsyncProducer",
    "Consumer",
    "AsyncConsumer",
    "ConsumerType",
    "DeadLetterPolicy",
    "MultiTopicConsumer",
    "AsyncMultiTopicConsumer",
    "TopicSpec",
    "PartitionsRoutingMode",
    "HashingScheme",
    "MessageRouter",
    "Reader",
    "AsyncReader",
    "TableView",
    "AsyncTableView",
    "TableListener",
    "MAX_BATCH_MESSAGES",
    "MAX_BATCH_BYTES",
    "MAX_ACK_GROUP",
    "COMPACTION_SUBSCRIPTION",
    # messages and ids
    "Message",
    "MessageId",
    "MessageIdLike",
    "MessageLike",
    "OutgoingMessage",
    # admin
    "Admin",
    "AsyncAdmin",
    "TopicsAdmin",
    "AsyncTopicsAdmin",
    "NamespacesAdmin",
    "AsyncNamespacesAdmin",
    "TenantsAdmin",
    "AsyncTenantsAdmin",
    "CompactionStatus",
    "TableStatus",
    "CompactionProgress",
    "ProgressCallback",
    # errors
    "ClientError",
    "TransportError",
    "Timeout",
    "AlreadyClosed",
    "ServerError",
    "BadRequest",
    "AuthenticationError",
    "AuthorizationError",
    "NotFound",
    "Conflict",
    "ConsumerBusy",
    "TooLarge",
    "Unavailable",
]
