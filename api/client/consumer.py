"""Consumers of a durable subscription, with Pulsar's acknowledgement grouping: the operations
once, run by ``Consumer`` (sync) and ``AsyncConsumer``."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Self

from api.client._core import (
    _C,
    COMPACTION_SUBSCRIPTION,
    _AsyncRunner,
    _Call,
    _Child,
    _Op,
    _position,
    _q,
    _seek_body,
    _SyncRunner,
    _Topic,
)
from api.client.errors import BadRequest, Conflict, ConsumerBusy, NotFound, Timeout
from api.client.message import Message, MessageId, MessageIdLike, _as_id, _page

log = logging.getLogger(__name__)


#: Individual acknowledgements a consumer holds before it sends them regardless of the time
#: (Pulsar's ``maxAcknowledgmentGroupSize``).
MAX_ACK_GROUP = 1000
_LONG_POLL_MS = 10_000  # one receive long poll when waiting without a deadline (server cap: 30 s)


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

    def _queued(self) -> Message | None:
        """The next message of the receiver queue, if any (no operation to run)."""
        return self._queue.popleft() if self._queue and not self._closed else None

    def _no_message(self, timeout_millis: int | None) -> str:
        return f"no message on {self._topic} for {self._subscription} within {timeout_millis} ms"

    def _op_unsubscribe(self) -> _Op[None]:
        self._check_open()
        yield from self._op_close()
        yield _Call("DELETE", self._sub_path)


class _Ops:
    """What the verbs below run: the operations of the consumer class they join, which is
    listed before them among its bases (so these are never the ones called)."""

    _client: Any
    _closed: bool

    def _queued(self) -> Message | None:
        raise NotImplementedError

    def _no_message(self, timeout_millis: int | None) -> str:
        raise NotImplementedError

    def _op_receive(self, timeout_millis: int | None, max_messages: int | None) -> _Op[list[Message]]:
        raise NotImplementedError

    def _op_ack(self, items: Iterable[MessageIdLike | Message], cumulative: bool) -> _Op[None]:
        raise NotImplementedError

    def _op_negative_ack(self, items: Iterable[MessageIdLike | Message]) -> _Op[None]:
        raise NotImplementedError

    def _op_redeliver(self) -> _Op[None]:
        raise NotImplementedError

    def _op_seek(self, target: MessageIdLike | int) -> _Op[None]:
        raise NotImplementedError

    def _op_unsubscribe(self) -> _Op[None]:
        raise NotImplementedError

    def _op_close(self) -> _Op[None]:
        raise NotImplementedError


class _Verbs(_Ops):
    """A consumer's public verbs (sync), over the ``_op_*`` operations of the class they join:
    one consumer's (``Consumer``) or several behind one (``MultiTopicConsumer``)."""

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits for one up to ``timeout_millis`` (``None``: for ever) and
        raises ``Timeout`` if none came."""
        queued = self._queued()
        if queued is not None:
            return queued
        got = self._client._run(self._op_receive(timeout_millis, None))
        if not got:
            raise Timeout(self._no_message(timeout_millis))
        return got[0]  # type: ignore[no-any-return]

    def batch_receive(self, max_messages: int = 100, timeout_millis: int = 0) -> list[Message]:
        """Up to ``max_messages``: those already here, or else the first to arrive within
        ``timeout_millis`` (0: only what is there now). An empty list when none came."""
        return self._client._run(self._op_receive(timeout_millis, max_messages))  # type: ignore[no-any-return]

    def acknowledge(self, message: Message | MessageIdLike) -> None:
        """Acknowledge one message: it will not be delivered to this subscription again.
        Sent grouped with others unless the consumer was made with ``ack_group_time_ms=0``
        (see ``Client.subscribe``)."""
        self._client._run(self._op_ack([message], cumulative=False))

    def acknowledge_many(self, messages: Iterable[Message | MessageIdLike]) -> None:
        """Acknowledge several messages at once (not in Pulsar's API)."""
        self._client._run(self._op_ack(messages, cumulative=False))

    def acknowledge_cumulative(self, message: Message | MessageIdLike) -> None:
        """Acknowledge this message and every message before it in its topic (Exclusive and
        Failover)."""
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncVerbs(_Ops):
    """See ``_Verbs``: the same verbs, awaited."""

    async def receive(self, timeout_millis: int | None = None) -> Message:
        queued = self._queued()
        if queued is not None:
            return queued
        got = await self._client._run(self._op_receive(timeout_millis, None))
        if not got:
            raise Timeout(self._no_message(timeout_millis))
        return got[0]  # type: ignore[no-any-return]

    async def batch_receive(self, max_messages: int = 100, timeout_millis: int = 0) -> list[Message]:
        return await self._client._run(self._op_receive(timeout_millis, max_messages))  # type: ignore[no-any-return]

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


class Consumer(_ConsumerBase[_SyncRunner], _Verbs):
    """A consumer attached to a durable subscription; made by ``Client.subscribe``.

    Messages come in order; each is redelivered until acknowledged (after
    ``redeliver_unacknowledged_messages``, the ack timeout, or this consumer closing).
    """


class AsyncConsumer(_ConsumerBase[_AsyncRunner], _AsyncVerbs):
    """See ``Consumer``."""
