"""The sync runner: ``Client`` drives every operation with ``httpx.Client`` and ``time.sleep``."""

from __future__ import annotations

import functools
import itertools
import logging
import time
from types import TracebackType
from typing import Any

import httpx

from api.client._core import (
    DEFAULT_URL,
    T,
    _BaseClient,
    _decode,
    _Effect,
    _never_sent,
    _Op,
    _Sleep,
    _Topic,
    _transport_errors,
)
from api.client.admin import Admin
from api.client.auth import AuthenticationToken, _tls_verify
from api.client.consumer import Consumer, ConsumerType, DeadLetterPolicy
from api.client.errors import ClientError, TransportError
from api.client.message import MessageId, MessageIdLike
from api.client.multi_topic import MultiTopicConsumer, Topics, TopicSpec, consumer_for
from api.client.producer import Producer
from api.client.reader import Reader
from api.client.routing import HashingScheme, MessageRouter, PartitionsRoutingMode, Router
from api.client.table_view import TableView

log = logging.getLogger(__name__)


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

    def create_producer(
        self,
        topic: str,
        *,
        message_routing_mode: str = PartitionsRoutingMode.RoundRobinDistribution,
        hashing_scheme: str = HashingScheme.BoostHash,
        message_router: MessageRouter | None = None,
        partitions_update_interval_s: float = 60.0,
    ) -> Producer:
        """A producer of an existing topic (``NotFound`` if there is none).

        On a partitioned topic, each message goes to a partition as Pulsar's client sends it
        (``api.client.routing``): by the ``hashing_scheme`` hash of its key, and a keyless one
        by ``message_routing_mode``; ``CustomPartition`` asks ``message_router(message,
        partitions)`` for every message. A producer that routes itself looks for partitions
        added to the topic every ``partitions_update_interval_s`` seconds, as Pulsar's does.
        """
        self._check_open()
        router = Router(message_routing_mode, hashing_scheme, message_router)
        producer = Producer(self, _Topic.parse(topic), router, partitions_update_interval_s)
        self._run(producer._op_open())
        return producer

    def subscribe(
        self,
        topic: TopicSpec,
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
        partitions_update_interval_s: float = 60.0,
        pattern_auto_discovery_period: float = 60.0,
    ) -> Consumer | MultiTopicConsumer:
        """Create the subscription if it does not exist (at ``initial_position``), then attach
        this consumer to it. With ``read_compacted`` the consumer reads the compacted topic up
        to the horizon and the log after it; without, every message of the log. It is the
        consumer's choice, as in Pulsar: the subscription holds only the position and the
        acknowledgements, shared by consumers of either kind.

        ``subscription_type`` is Pulsar's (``ConsumerType.Exclusive``, the default, ``Failover``,
        ``Shared``, ``KeyShared``, or the names ``"Key_Shared"`` etc.); the first consumer fixes
        the subscription's type. ``ConsumerBusy`` for a second Exclusive consumer, or one of
        another type than the consumers attached. ``priority_level``, lower first: a Shared
        subscription gives messages to the highest level whose consumers are receiving; Failover's
        active consumer is one of the highest level (by ``consumer_name``, as Pulsar chooses it:
        see docs/messages-and-subscriptions.md). ``read_compacted`` only on
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

        ``topic`` may also be a list of topics, or a compiled pattern of topic names in one
        namespace (``re.compile("persistent://public/default/orders-.*")``). On a partitioned
        topic, a list or a pattern it returns a ``MultiTopicConsumer``, one consumer per topic
        (per partition) behind one (``api.client.multi_topic``), which looks for partitions
        added every ``partitions_update_interval_s`` seconds (and a pattern's new matches every
        ``pattern_auto_discovery_period``) and consumes those from their earliest message.
        """
        self._check_open()
        topics = Topics.parse(topic)
        options: dict[str, Any] = dict(
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
        now = self._run(topics._op_resolve())
        consumer = consumer_for(
            topics,
            now,
            subscription_name,
            options,
            one=functools.partial(Consumer, self),
            several=functools.partial(MultiTopicConsumer, self),
            partitions_update_interval_s=partitions_update_interval_s,
            pattern_auto_discovery_period=pattern_auto_discovery_period,
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
        parsed = _Topic.parse(topic)
        topics = self._run(Topics((parsed,))._op_resolve())  # every partition of a partitioned one
        readers = [
            Reader(
                self,
                t,
                MessageId.earliest,
                read_compacted=True,
                inclusive=True,
                receiver_queue_size=receiver_queue_size,
            )
            for t in topics
        ]
        view = TableView(self, readers, poll_interval, str(parsed))
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
