"""The async runner: ``AsyncClient`` drives the same operations with ``httpx.AsyncClient`` and
``asyncio.sleep``."""

from __future__ import annotations

import asyncio
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
from api.client.admin import AsyncAdmin
from api.client.auth import AuthenticationToken, _tls_verify
from api.client.consumer import AsyncConsumer, ConsumerType, DeadLetterPolicy
from api.client.errors import ClientError, TransportError
from api.client.message import MessageId, MessageIdLike
from api.client.multi_topic import AsyncMultiTopicConsumer, Topics, TopicSpec, consumer_for
from api.client.producer import AsyncProducer
from api.client.reader import AsyncReader
from api.client.routing import HashingScheme, MessageRouter, PartitionsRoutingMode, Router
from api.client.table_view import AsyncTableView

log = logging.getLogger(__name__)


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

    async def create_producer(
        self,
        topic: str,
        *,
        message_routing_mode: str = PartitionsRoutingMode.RoundRobinDistribution,
        hashing_scheme: str = HashingScheme.BoostHash,
        message_router: MessageRouter | None = None,
        partitions_update_interval_s: float = 60.0,
    ) -> AsyncProducer:
        """See ``Client.create_producer``."""
        self._check_open()
        router = Router(message_routing_mode, hashing_scheme, message_router)
        producer = AsyncProducer(self, _Topic.parse(topic), router, partitions_update_interval_s)
        await self._run(producer._op_open())
        return producer

    async def subscribe(
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
    ) -> AsyncConsumer | AsyncMultiTopicConsumer:
        """See ``Client.subscribe``."""
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
        now = await self._run(topics._op_resolve())
        consumer = consumer_for(
            topics,
            now,
            subscription_name,
            options,
            one=functools.partial(AsyncConsumer, self),
            several=functools.partial(AsyncMultiTopicConsumer, self),
            partitions_update_interval_s=partitions_update_interval_s,
            pattern_auto_discovery_period=pattern_auto_discovery_period,
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
        parsed = _Topic.parse(topic)
        topics = await self._run(Topics((parsed,))._op_resolve())  # every partition of a partitioned one
        readers = [
            AsyncReader(
                self,
                t,
                MessageId.earliest,
                read_compacted=True,
                inclusive=True,
                receiver_queue_size=receiver_queue_size,
            )
            for t in topics
        ]
        view = AsyncTableView(self, readers, poll_interval, str(parsed))
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
