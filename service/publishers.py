"""Who is attached to a topic, as its stats show them: each producer (Pulsar's ``publishers``)
and the client facts of each producer and consumer -- the client's version, its address, when it
attached and the metadata it gave (``PublisherStats`` and ``ConsumerStats`` in Pulsar's admin).

The binary protocol registers its producers here (a REST produce request is not a producer with
a session, as in Pulsar's own REST produce, and is not listed); consumers carry their
``ClientInfo`` in their ``ConsumerInfo`` (``service.subscriptions``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from service.names import TopicName

# How much of a client's metadata stats keep (Pulsar keeps all): more is cut, never refused.
MAX_METADATA_ENTRIES = 64
MAX_METADATA_TEXT = 1024


def now_iso() -> str:
    """The time now as Pulsar writes ``connectedSince`` (``Instant.toString()``: UTC, ``Z``)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def address_of(host: str | None, port: int | None) -> str:
    """A peer's address as Pulsar writes it (``InetSocketAddress.toString()``: ``/ip:port``)."""
    if not host:
        return ""
    return f"/{host}:{port}" if port is not None else f"/{host}"


def bounded_metadata(pairs: Any) -> dict[str, str]:
    """A client's ``metadata`` (key/value pairs), bounded: a stats answer stays small whatever a
    client sends."""
    out: dict[str, str] = {}
    for kv in pairs:
        if len(out) >= MAX_METADATA_ENTRIES:
            break
        out[str(kv.key)[:MAX_METADATA_TEXT]] = str(kv.value)[:MAX_METADATA_TEXT]
    return out


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """What a producer's or consumer's stats say of its client."""

    address: str = ""
    client_version: str = ""
    connected_since: str = field(default_factory=now_iso)
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Publisher:
    """A producer attached to a topic."""

    producer_id: int
    name: str
    access_mode: str  # Pulsar's ProducerAccessMode name: Shared, Exclusive, ...
    client: ClientInfo


class Publishers:
    """The producers attached to each topic of this instance, in attach order. Thread-safe
    (the listener writes it on the event loop, stats read it on worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._topics: dict[TopicName, dict[int, Publisher]] = {}

    def add(self, topic: TopicName, token: object, publisher: Publisher) -> None:
        """``token`` is the producer object the entry belongs to (removed by it)."""
        with self._lock:
            self._topics.setdefault(topic, {})[id(token)] = publisher

    def remove(self, topic: TopicName, token: object) -> None:
        with self._lock:
            found = self._topics.get(topic)
            if found is not None:
                found.pop(id(token), None)
                if not found:
                    del self._topics[topic]

    def of(self, topic: TopicName) -> list[Publisher]:
        with self._lock:
            return list(self._topics.get(topic, {}).values())
