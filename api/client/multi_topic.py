"""Consumers of several topics behind one, as Pulsar's client subscribes to a partitioned topic
(every partition), to a list of topics, or to a pattern of topic names in one namespace (its
multi-topic and pattern consumers).

A key is always in one partition (producers route it there), and each topic's messages come in
order, so a key's messages come in order. ``receive`` takes from the topics in turn: first what
their receiver queues hold, then a look at each without waiting, and only then a wait on one
topic at a time, in slices of ``_WAIT_SLICE_MS``, so that a message in any topic is seen within
a slice. An acknowledgement goes to the topic its message came from: the message's ``topic``,
or for a bare id, the topic it was received from (ledger ids are never shared between topics).

The consumer looks again every ``update_interval_s`` (a minute, as Pulsar's client): partitions
added to a partitioned topic, and topics of the namespace newly matching a pattern, are
consumed from their earliest message, so that nothing produced to them before the consumer
looked is missed; a pattern consumer lets go of topics that no longer exist.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from api.client._core import (
    _C,
    _AsyncRunner,
    _Call,
    _Child,
    _namespace,
    _Op,
    _op_partitions,
    _Sleep,
    _SyncRunner,
    _Topic,
    partition_topic,
)
from api.client.consumer import AsyncConsumer, Consumer, _AsyncVerbs, _ConsumerBase, _Verbs
from api.client.errors import NotFound
from api.client.message import Message, MessageId, MessageIdLike, _as_id

# How long a receive waits on one topic before it looks at the others again.
_WAIT_SLICE_MS = 100

_P = TypeVar("_P", bound=_ConsumerBase[Any])
_M = TypeVar("_M", bound="_MultiTopicBase[Any, Any]")

#: What ``subscribe`` takes: a topic (partitioned or not), a list of them, or a compiled
#: pattern of topic names in one namespace (``re.compile("persistent://t/n/orders-.*")``).
TopicSpec = str | Sequence[str] | re.Pattern[str]

_LITERAL = re.compile(r"[\w.-]+")


@dataclass(frozen=True)
class Topics:
    """The topics a subscribe names: ``given`` (each partitioned or not), or every topic of
    ``given[0]``'s namespace whose name, without ``persistent://``, ``pattern`` matches whole
    (as Pulsar's client matches a pattern: a partitioned topic by its own name, not its
    partitions')."""

    given: tuple[_Topic, ...]
    pattern: re.Pattern[str] | None = None
    label: str = ""

    @classmethod
    def parse(cls, spec: TopicSpec) -> Topics:
        if isinstance(spec, re.Pattern):
            text = spec.pattern.removeprefix("persistent://")
            parts = text.split("/", 2)
            if len(parts) != 3 or not all(_LITERAL.fullmatch(p) for p in parts[:2]):
                raise ValueError(
                    f"a topic pattern names its tenant and namespace plainly, as "
                    f"persistent://tenant/namespace/<regex>, not {spec.pattern!r}"
                )
            where = _Topic(parts[0], parts[1], parts[2])
            return cls((where,), re.compile(text, spec.flags), spec.pattern)
        if isinstance(spec, str):
            topic = _Topic.parse(spec)
            return cls((topic,), label=str(topic))
        topics = tuple(_Topic.parse(t) for t in spec)
        if not topics:
            raise ValueError("subscribe names at least one topic")
        return cls(topics, label=",".join(str(t) for t in topics))

    def _op_resolve(self) -> _Op[list[_Topic]]:
        """The topics to consume now: each partition of a partitioned topic, each match."""
        if self.pattern is not None:
            where = self.given[0]
            namespace = _namespace(f"{where.tenant}/{where.namespace}")
            names = yield _Call("GET", f"/admin/v2/persistent/{namespace}")
            # As Pulsar's client: the listed partitions folded into their partitioned topic's
            # name, which the pattern is matched against, and that topic's partitions consumed.
            bases = sorted({str(n).split("-partition-", 1)[0] for n in names})
            matched = [t for t in bases if self.pattern.fullmatch(t.removeprefix("persistent://"))]
            given: Sequence[_Topic] = [_Topic.parse(t) for t in matched]
        else:
            given = self.given
        out: list[_Topic] = []
        for t in given:
            n = yield from _op_partitions(t)
            out.extend([partition_topic(t, i) for i in range(n)] if n else [t])
        return out

    def one_plain(self, now: Sequence[_Topic]) -> bool:
        """Whether ``now`` (the resolved topics) is the one plain topic named: a consumer of
        it alone, not one of several behind one."""
        return self.pattern is None and list(self.given) == list(now) and len(now) == 1


def consumer_for(
    topics: Topics,
    now: Sequence[_Topic],
    subscription: str,
    options: dict[str, Any],
    *,
    one: Callable[..., _P],
    several: Callable[..., _M],
    partitions_update_interval_s: float,
    pattern_auto_discovery_period: float,
) -> _P | _M:
    """The consumer ``subscribe`` returns for ``topics`` (resolved to ``now``), not opened yet:
    ``one(topic, subscription, **options)`` of its one plain topic, else ``several`` over one
    such consumer per topic, which consumes the topics it finds later from their earliest
    message."""
    if topics.one_plain(now):
        return one(now[0], subscription, **options)
    later = {**options, "initial_position": "earliest"}
    return several(
        topics,
        [one(t, subscription, **options) for t in now],
        subscription=subscription,
        consumer_name=options.get("consumer_name"),
        make=lambda t: one(t, subscription, **later),
        update_interval_s=pattern_auto_discovery_period if topics.pattern else partitions_update_interval_s,
    )


class _MultiTopicBase(_Child[_C], Generic[_C, _P]):
    def __init__(
        self,
        client: _C,
        topics: Topics,
        parts: Sequence[_P],
        *,
        subscription: str,
        consumer_name: str | None = None,
        make: Callable[[_Topic], _P] | None = None,
        update_interval_s: float = 60.0,
    ) -> None:
        """``make(topic)``: the consumer of a topic found later (looked for every
        ``update_interval_s`` seconds, as Pulsar's client looks every minute)."""
        super().__init__(client, topics.given[0])
        self._topics = topics
        self._subscription = subscription
        self._consumer_name = consumer_name
        self._parts = list(parts)
        self._by_topic = {p.topic(): p for p in self._parts}
        self._by_ledger: dict[int, _P] = {}  # learned from the messages received
        self._next = 0  # the topic a receive looks at first
        self._make = make
        self._update_interval_s = update_interval_s
        self._looked = time.monotonic()

    def topic(self) -> str:
        """The topic, topics (comma-separated) or pattern subscribed to."""
        return self._topics.label

    def topics(self) -> list[str]:
        """The topics consumed now (each partition of a partitioned topic)."""
        return [p.topic() for p in self._parts]

    def _op_follow(self) -> _Op[None]:
        """Subscribe to the topics found since the last look, if it is time to look; a pattern
        consumer drops the topics gone."""
        if self._make is None or time.monotonic() - self._looked < self._update_interval_s:
            return
        self._looked = time.monotonic()
        now = yield from self._topics._op_resolve()
        names = {str(t) for t in now}
        for t in now:
            if str(t) not in self._by_topic:
                part = self._make(t)
                yield from part._op_open()
                self._parts.append(part)
                self._by_topic[part.topic()] = part
        if self._topics.pattern is not None:
            for part in [p for p in self._parts if p.topic() not in names]:
                self._drop(part)

    def _drop(self, part: _P) -> None:
        """Let go of a topic that is gone (a pattern consumer's)."""
        self._parts.remove(part)
        del self._by_topic[part.topic()]
        self._by_ledger = {k: v for k, v in self._by_ledger.items() if v is not part}
        part._closed = True  # nothing left to detach from
        self._next = self._next % len(self._parts) if self._parts else 0

    def _op_from(self, part: _P, wait_ms: int, max_messages: int | None) -> _Op[list[Message] | None]:
        """What ``part`` receives within ``wait_ms``; None when its topic is gone and this
        consumer follows a pattern (the topic is let go of: it no longer matches anything)."""
        try:
            return (yield from part._op_receive(wait_ms, max_messages))
        except NotFound:
            if self._topics.pattern is None:
                raise
            self._drop(part)
            return None

    def subscription_name(self) -> str:
        return self._subscription

    def consumer_name(self) -> str | None:
        return self._consumer_name

    def _op_open(self) -> _Op[None]:
        opened: list[_P] = []
        try:
            for p in self._parts:
                yield from p._op_open()
                opened.append(p)
        except BaseException:
            for p in opened:  # all or none: detach the topics already attached
                yield from p._op_close()
            raise

    def _learn(self, got: list[Message], part: _P) -> list[Message]:
        for m in got:
            self._by_ledger[m.id.ledger_id] = part
        return got

    def _take_queued(self, want: int) -> list[Message]:
        """Up to ``want`` messages from the topics' receiver queues, topic by topic
        from the one after the last served."""
        out: list[Message] = []
        n = len(self._parts)
        for k in range(n):
            p = self._parts[(self._next + k) % n]
            while p._queue and len(out) < want:
                m = p._queue.popleft()
                self._by_ledger[m.id.ledger_id] = p
                out.append(m)
            if len(out) >= want:
                self._next = (self._next + k + 1) % n
                break
        return out

    def _op_receive(self, timeout_millis: int | None, max_messages: int | None) -> _Op[list[Message]]:
        self._check_open()
        if max_messages is not None and max_messages < 1:
            raise ValueError("max_messages is at least 1")
        want = max_messages or 1
        deadline = None if timeout_millis is None else time.monotonic() + max(0, timeout_millis) / 1000
        while True:
            yield from self._op_follow()
            n = len(self._parts)
            out = self._take_queued(want)
            if out:
                return out
            if not n:  # a pattern that matches no topic yet
                remaining_s = None if deadline is None else deadline - time.monotonic()
                if remaining_s is not None and remaining_s <= 0:
                    return []
                slice_s = _WAIT_SLICE_MS / 1000
                yield _Sleep(slice_s if remaining_s is None else min(slice_s, remaining_s))
                continue
            # A look at every topic without waiting (each fills its receiver queue).
            gone = False
            for part in [self._parts[(self._next + k) % n] for k in range(n)]:
                got = yield from self._op_from(part, 0, max_messages)
                if got is None:
                    gone = True
                    break
                if got:
                    self._next = (self._parts.index(part) + 1) % n
                    return self._learn(got, part)
            if gone:
                continue
            remaining_ms = None if deadline is None else int((deadline - time.monotonic()) * 1000)
            if remaining_ms is not None and remaining_ms <= 0:
                return []
            # Nothing anywhere: wait on one topic for a slice, the next one next time.
            p = self._parts[self._next]
            self._next = (self._next + 1) % n
            wait = _WAIT_SLICE_MS if remaining_ms is None else min(_WAIT_SLICE_MS, remaining_ms)
            got = yield from self._op_from(p, wait, max_messages)
            if got:
                return self._learn(got, p)

    def _queued(self) -> Message | None:
        return None  # the receive's operation takes from the topics' queues in turn

    def _no_message(self, timeout_millis: int | None) -> str:
        return f"no message on {self.topic()} within {timeout_millis} ms"

    def _part_of(self, item: MessageIdLike | Message) -> _P:
        if isinstance(item, Message) and item.topic in self._by_topic:
            return self._by_topic[item.topic]
        part = self._by_ledger.get(_as_id(item).ledger_id)
        if part is None:
            raise ValueError(f"{item!r} was not received by this consumer: its topic is unknown")
        return part

    def _by_part(self, items: Iterable[MessageIdLike | Message]) -> dict[int, list[MessageIdLike | Message]]:
        groups: dict[int, list[MessageIdLike | Message]] = {}
        for item in items:
            groups.setdefault(self._parts.index(self._part_of(item)), []).append(item)
        return groups

    def _op_ack(self, items: Iterable[MessageIdLike | Message], cumulative: bool) -> _Op[None]:
        self._check_open()
        for i, group in self._by_part(items).items():
            yield from self._parts[i]._op_ack(group, cumulative)

    def _op_negative_ack(self, items: Iterable[MessageIdLike | Message]) -> _Op[None]:
        self._check_open()
        for i, group in self._by_part(items).items():
            yield from self._parts[i]._op_negative_ack(group)

    def _op_redeliver(self) -> _Op[None]:
        self._check_open()
        for p in self._parts:
            yield from p._op_redeliver()

    def _op_seek(self, target: MessageIdLike | int) -> _Op[None]:
        """A publish time, ``earliest`` or ``latest``: every topic; an id: its topic."""
        self._check_open()
        if isinstance(target, int) or _as_id(target) in (MessageId.earliest, MessageId.latest):
            for p in self._parts:
                yield from p._op_seek(target)
            return
        yield from self._part_of(target)._op_seek(target)

    def _op_close(self) -> _Op[None]:
        if self._closed:
            return
        self._closed = True
        for p in self._parts:
            yield from p._op_close()

    def _op_unsubscribe(self) -> _Op[None]:
        self._check_open()
        for p in self._parts:
            yield from p._op_unsubscribe()
        self._closed = True


class MultiTopicConsumer(_MultiTopicBase[_SyncRunner, Consumer], _Verbs):
    """A consumer of several topics behind one, with ``Consumer``'s methods; made by
    ``Client.subscribe`` for a partitioned topic (every partition), a list of topics, or a
    pattern. A message's ``topic`` names the topic (the partition) it came from."""


class AsyncMultiTopicConsumer(_MultiTopicBase[_AsyncRunner, AsyncConsumer], _AsyncVerbs):
    """See ``MultiTopicConsumer``."""
