"""One client connection of Pulsar's binary protocol: a thin state machine over the service.

Frames are cut by ``framing``; commands run in arrival order in one task per connection (a
client's acks, flows and closes must not overtake each other), and each handler answers with
the response type the client waits for (the C++ client drops a connection on a reply it does
not expect). Slow work (writing to a ledger, waiting for messages) runs in the per-producer and
per-consumer tasks of ``produce`` and ``delivery``, so one slow subscribe never holds the sends
of another producer sharing the connection.

The connection dispatches through the table it is given (``commands.HANDLERS``): the command
families' modules import this one, and this one none of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio.to_thread

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.access import ProducerAccess
from api.pulsar.bounded import BoundedDict
from api.pulsar.errors import ProtocolClose, ProtocolError, server_error
from api.pulsar.framing import (
    FRAME_PADDING,
    Frame,
    FrameDecoder,
    FrameError,
    command,
    encode,
)
from api.tls import peer_certificate
from service.authentication import NO_METHOD, Credentials
from service.authorization import Authorizer, Rule
from service.auto_topics import topic_for_use
from service.backlog_quotas import BacklogQuotaStore
from service.errors import Forbidden, ServiceError
from service.names import TopicName
from service.non_persistent import NonPersistentTopics
from service.partitions import PartitionedTopics
from service.policies import PolicyStore
from service.publishers import ClientInfo, address_of, bounded_metadata
from service.schemas import SchemaRegistry

if TYPE_CHECKING:
    from service.authentication import Authentication
    from service.settings import Settings
    from service.subscription_service import SubscriptionService
    from service.tenants import TenantService
    from service.topics import Broker

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVER_VERSION = "topic-compactor 0.1.0"
# The newest protocol version whose behaviour this service gives (a client asking for more is
# answered with this one, and keeps to it).
PROTOCOL_VERSION = 21
# Frames waiting for the command task before the connection stops reading from its socket.
_MAX_QUEUED = 1024
_RESUME_AT = 64
# Pulsar's -1 request id (an error not tied to a request) as the uint64 the wire carries.
NO_REQUEST = 2**64 - 1


@dataclass
class BrokerContext:
    """What every connection shares: the service's verbs and settings, and the listener's
    own URL (a lookup's answer)."""

    settings: Settings
    broker: Broker
    subscriptions: SubscriptionService
    tenants: TenantService
    authorizer: Authorizer | None
    # The provider chain (None: authentication off).
    authentication: Authentication | None
    policies: PolicyStore
    schemas: SchemaRegistry
    partitioned: PartitionedTopics
    service_url: str
    connections: set[PulsarConnection]
    # Readers closed by their seek, by (topic, subscription): where they resume when the client
    # subscribes again (Pulsar keeps the non-durable cursor across that reconnection).
    reader_positions: BoundedDict = field(default_factory=lambda: BoundedDict(10_000))
    access: ProducerAccess = field(default_factory=lambda: ProducerAccess())
    # The non-persistent topics served now (REST's stats read the same ones).
    non_persistent: NonPersistentTopics = field(default_factory=NonPersistentTopics)
    # Backlog quotas, checked as a producer connects (None: never).
    quotas: BacklogQuotaStore | None = None
    # Consumers waiting for messages on a worker thread now (see ``delivery.WireSubscriber``);
    # touched on the event loop only.
    thread_waits: int = 0

    @property
    def max_thread_waits(self) -> int:
        """How many consumers may wait on a worker thread at once: a quarter of the pool."""
        return max(1, self.settings.worker_threads // 4)


class PulsarConnection(asyncio.Protocol):
    """The protocol object asyncio drives for one accepted socket."""

    def __init__(self, ctx: BrokerContext, handlers: Mapping[int, Handler]) -> None:
        self.ctx = ctx
        # The command table (``commands.HANDLERS``, which gathers the command families' own):
        # given, so that this module imports none of them.
        self.handlers = handlers
        self.decoder = FrameDecoder(ctx.settings.max_message_size + FRAME_PADDING)
        self.transport: asyncio.Transport | None = None
        self.connected = False
        self.closed = False
        self.role: str | None = None
        self.protocol_version = 0
        # What the client called itself in CONNECT (``Pulsar-Go-v0.19.0``, ``Pulsar-CPP-v3.7``...).
        self.client_version = ""
        # By the client's ids: ``produce.WireProducer``s and ``delivery.WireSubscriber``s (the
        # connection only closes them when it is lost; their modules type what they take out).
        self.producers: dict[int, Any] = {}
        # Producer ids the broker closed (CLOSE_PRODUCER: fenced, a terminated topic, a backlog
        # quota): their client may have had sends in flight, which are dropped, not taken as a
        # protocol error that would close every producer and consumer of the connection (Pulsar's
        # recentlyClosedProducers). Forgotten when the id is asked for again.
        self.closed_producers: BoundedDict = BoundedDict(10_000)
        self.consumers: dict[int, Any] = {}
        # Consumers closed whose detaching from their subscription is not done yet, by id: a
        # SUBSCRIBE that reuses the id waits for it (``consume.subscribe``).
        self.closing_consumers: dict[int, asyncio.Future[None]] = {}
        self._queue: asyncio.Queue[Frame] = asyncio.Queue()
        self._paused = False
        self._task: asyncio.Task[None] | None = None
        self.peer = "?"
        self.address = ""  # the peer as Pulsar's stats write it: "/ip:port"
        # CONNECT's client_version (stats show it for the connection's producers and consumers).
        self.client_version = ""
        # The client certificate of a TLS connection, verified in its handshake (``api.tls``);
        # None on plain TCP or without one. The TLS authentication provider reads it.
        self.peer_certificate: dict[str, Any] | None = None
        self.tls = False  # whether the client came over TLS (pulsar+ssl://)
        self._out: list[bytes] = []
        self._flushing = False

    # ------------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.address = address_of(peer[0], peer[1]) if peer else ""
        self.tls = transport.get_extra_info("sslcontext") is not None
        self.peer_certificate = peer_certificate(transport)
        self.ctx.connections.add(self)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            frames = self.decoder.feed(data)
        except FrameError as e:  # a wrong checksum too: Pulsar closes on a bad frame
            self.close(f"{e}")
            return
        for frame in frames:
            self._queue.put_nowait(frame)
        if self._queue.qsize() >= _MAX_QUEUED and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.ctx.connections.discard(self)
        if self._task is not None:
            self._task.cancel()
        for producer in list(self.producers.values()):
            producer.close()
        for consumer in list(self.consumers.values()):
            consumer.close()
        self.producers.clear()
        self.consumers.clear()

    # ------------------------------------------------------------------ sending

    def write(self, data: bytes) -> None:
        """Queue a frame; the frames written in one turn of the event loop go out in one
        socket write (a write each costs a system call per receipt or message)."""
        if self.closed or self.transport is None:
            return
        self._out.append(data)
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self._out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def send(self, kind: int, **fields: object) -> None:
        self.write(encode(command(kind, **fields)))

    def error(self, request_id: int, code: int, message: str) -> None:
        self.send(pb.BaseCommand.ERROR, request_id=request_id, error=code, message=message)

    def close(self, reason: str) -> None:
        if not self.closed:
            log.info("closing Pulsar connection from %s: %s", self.peer, reason)
        self.closed = True
        if self.transport is not None:
            self._flush()  # the replies before the close still go out (an ERROR says why)
            self.transport.close()

    async def drained(self) -> None:
        """Wait while the socket's write buffer is over its high mark (a slow consumer)."""
        transport = self.transport
        while (
            transport is not None and not self.closed and transport.get_write_buffer_size() > 4 * 1024 * 1024
        ):
            await asyncio.sleep(0.005)

    # ------------------------------------------------------------------ commands

    async def _run(self) -> None:
        try:
            while True:
                frame = await self._queue.get()
                if self._paused and self._queue.qsize() <= _RESUME_AT and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                try:
                    await self._dispatch(frame)
                except ProtocolClose as e:
                    self.close(str(e))
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("Pulsar connection from %s failed", self.peer)
            self.close("internal error")

    async def _dispatch(self, frame: Frame) -> None:
        cmd = frame.command
        kind = cmd.type
        if not self.connected:
            if kind != pb.BaseCommand.CONNECT:
                raise ProtocolClose(f"{pb.BaseCommand.Type.Name(kind)} before CONNECT")
            self._connect(cmd.connect)
            return
        handler = self.handlers.get(kind)
        if handler is None:
            name = pb.BaseCommand.Type.Name(kind) if kind in pb.BaseCommand.Type.values() else str(kind)
            raise ProtocolClose(f"unsupported command {name}")
        await handler(self, frame)

    def _connect(self, connect: pb.CommandConnect) -> None:
        chain = self.ctx.authentication
        if chain is not None:
            # As Pulsar's ServerCnx: the method the client names (none without one) picks the
            # provider; one no provider serves gets the anonymous role, or is refused.
            credentials = Credentials(
                method=connect.auth_method_name or NO_METHOD,
                data=connect.auth_data.decode("utf-8", "replace") if connect.HasField("auth_data") else "",
                peer_certificate=self.peer_certificate,
            )
            try:
                self.role = chain.role(credentials)
            except ServiceError as e:
                self.error(NO_REQUEST, pb.AuthenticationError, f"Unable to authenticate: {e}")
                raise ProtocolClose(f"authentication failed: {e}") from None
        self.protocol_version = min(connect.protocol_version, PROTOCOL_VERSION)
        self.client_version = connect.client_version[:256]
        self.connected = True
        self.send(
            pb.BaseCommand.CONNECTED,
            server_version=SERVER_VERSION,
            protocol_version=self.protocol_version,
            max_message_size=self.ctx.settings.max_message_size,
        )

    # ------------------------------------------------------------------ helpers for handlers

    def client_info(self, metadata: Any = ()) -> ClientInfo:
        """What stats say of a producer or consumer of this connection attached now, with the
        ``metadata`` key/value pairs its PRODUCER or SUBSCRIBE gave."""
        return ClientInfo(
            address=self.address, client_version=self.client_version, metadata=bounded_metadata(metadata)
        )

    def topic_name(self, text: str) -> TopicName:
        """A ``persistent://t/n/x`` name (or Pulsar's short forms ``x`` and ``t/n/x``); a
        ``non-persistent://`` name is the business of ``api.pulsar.non_persistent``."""
        if "://" not in text:
            text = f"persistent://public/default/{text}" if "/" not in text else f"persistent://{text}"
        if not text.startswith("persistent://"):
            raise ProtocolError(pb.NotAllowedError, f"only persistent topics are served, not {text!r}")
        try:
            return TopicName.parse(text)
        except (ValueError, ServiceError) as e:
            raise ProtocolError(pb.InvalidTopicName, f"invalid topic name {text!r}: {e}") from None

    async def use_topic(self, text: str, rule: Rule, *, create: bool) -> TopicName:
        """The topic a PRODUCER or SUBSCRIBE names, once the role may ``rule`` it; created when
        it does not exist, ``create`` allows and the service allows auto-creation."""
        name = self.topic_name(text)
        self.authorize(rule, name)
        ctx = self.ctx
        await self.call(
            topic_for_use,
            broker=ctx.broker,
            tenants=ctx.tenants,
            partitioned=ctx.partitioned,
            name=name,
            create=create and ctx.settings.allow_auto_topic_creation,
        )
        return name

    def authorize(self, rule: Rule, name: TopicName) -> None:
        authorizer = self.ctx.authorizer
        if authorizer is None or self.role is None:
            return
        try:
            authorizer.check(
                role=self.role, rule=rule, tenant=name.tenant, namespace=name.namespace, topic=name.topic
            )
        except Forbidden:
            # As Pulsar's broker answers: a topic of a namespace that does not exist is not found,
            # whoever asks (asked only on a refusal: the common path reads no table).
            self.ctx.tenants.require_namespace(tenant=name.tenant, namespace=name.namespace)
            raise

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking service verb on a worker thread (the REST routes' pool)."""
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def request(
        self,
        request_id: int,
        work: Callable[[], Awaitable[None]],
        *,
        not_found: int = pb.TopicNotFound,
        conflict: int = pb.ConsumerBusy,
    ) -> None:
        """Run ``work``; a service error becomes an ERROR reply to ``request_id``."""
        try:
            await work()
        except (ServiceError, ProtocolError) as e:
            self.error(request_id, server_error(e, not_found=not_found, conflict=conflict), str(e))


Handler = Callable[[PulsarConnection, Frame], Awaitable[None]]


async def _ping(conn: PulsarConnection, frame: Frame) -> None:
    conn.send(pb.BaseCommand.PONG)


async def _pong(conn: PulsarConnection, frame: Frame) -> None:
    return None


#: The commands the connection answers itself, its keepalive (CONNECT comes before any table).
HANDLERS: dict[int, Handler] = {pb.BaseCommand.PING: _ping, pb.BaseCommand.PONG: _pong}
