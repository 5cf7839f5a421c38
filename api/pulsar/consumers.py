"""A durable subscription's consumer on the wire (``WireConsumer``): it receives through
``SubscriptionService.receive``, so the subscription's position, acknowledgements and dispatcher
are the ones REST consumers share. Ack timeouts and negative-ack delays are the client's (it
sends REDELIVER with the ids when due), so the service's own are off for these consumers."""

from __future__ import annotations

import asyncio
import contextlib

from api.pulsar.connection import PulsarConnection
from api.pulsar.delivery import POLL_S, Page, WireSubscriber
from ledger.entry import Position
from service.errors import ServiceError
from service.names import TopicName
from service.subscription_stats import subscription_backlog

# How often a waiting consumer of a subscription others share looks for messages given back
# to it (a negative ack, a consumer gone), which no append announces.
_SHARED_POLL_S = 0.05


class WireConsumer(WireSubscriber):
    """A consumer of a durable subscription, attached as REST consumers are."""

    def __init__(
        self,
        conn: PulsarConnection,
        consumer_id: int,
        topic: TopicName,
        subscription: str,
        service_id: str,
        read_compacted: bool,
        shared: bool = False,
    ) -> None:
        super().__init__(conn, consumer_id, topic, subscription, read_compacted)
        self.service_id = service_id
        self.read_ahead = not shared
        self._detached: asyncio.Future[None] | None = None
        # Exclusive: only appends and its own redeliveries bring it messages.
        self._poll_s = _SHARED_POLL_S if shared else POLL_S

    async def _fetch(self, limit: int) -> Page:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + POLL_S
        async with self._thread_wait() as on_thread:
            while True:
                # Before the read: an append after it ends a wait on the loop.
                seen = None if on_thread else self._last_position()
                delivered = await self.conn.call(
                    self.conn.ctx.subscriptions.receive,
                    self.topic,
                    self.subscription,
                    self.service_id,
                    max_messages=limit,
                    timeout_ms=int(POLL_S * 1000) if on_thread else 0,
                    whole=True,
                )
                remaining = deadline - loop.time()
                if delivered.entries or self.closed or remaining <= 0 or seen is None:
                    return Page(delivered.entries, delivered.redelivery_counts, delivered.given_back)
                await self._wait(seen, min(remaining, self._poll_s))

    def _consumed_all(self) -> bool:
        """Whether the subscription has no backlog left (Pulsar tells a consumer it reached the
        end of a terminated topic only then)."""
        try:
            state = self.conn.ctx.subscriptions.get(self.topic, self.subscription)
        except ServiceError:
            return False
        return subscription_backlog(state)[0] == 0 and not state.unacked()

    async def _idle(self) -> None:
        # No permits for a while (the application is not receiving): stay attached.
        await self.conn.call(
            self.conn.ctx.subscriptions.touch, self.topic, self.subscription, self.service_id
        )

    def close(self) -> None:
        """Detach from the subscription: what was delivered and not acknowledged goes to the
        subscription's other consumers, or to the next one."""
        if self.closed:
            return
        super().close()
        subs = self.conn.ctx.subscriptions
        topic, sub, sid = self.topic, self.subscription, self.service_id

        def detach() -> None:
            with contextlib.suppress(ServiceError):  # already gone with its subscription or topic
                subs.detach(topic, sub, sid)

        self._detached = asyncio.get_running_loop().run_in_executor(None, detach)

    async def wait_closed(self) -> None:
        if self._detached is not None:
            await self._detached

    async def ack(
        self, ids: list[Position], *, cumulative: bool, batches: list[tuple[Position, int]]
    ) -> None:
        subs = self.conn.ctx.subscriptions
        await self.conn.call(
            subs.ack,
            self.topic,
            self.subscription,
            self.service_id,
            ids,
            cumulative=cumulative,
            batches=batches,
        )
        self.nudge()  # a consumer at its bound of unacknowledged messages may receive again

    async def redeliver(self, ids: list[Position]) -> None:
        subs = self.conn.ctx.subscriptions
        if ids:
            await self.conn.call(subs.negative_ack, self.topic, self.subscription, self.service_id, ids)
        else:
            await self.conn.call(subs.redeliver, self.topic, self.subscription, self.service_id)
        self.nudge()

    async def seek(self, *, message_id: str | None, publish_time: int | None) -> None:
        await self.conn.call(
            self.conn.ctx.subscriptions.seek,
            self.topic,
            self.subscription,
            message_id=message_id,
            publish_time=publish_time,
            consumer_id=self.service_id,
        )

    async def mark_delete(self) -> Position:
        return await self.conn.call(self.conn.ctx.subscriptions.mark_delete, self.topic, self.subscription)
