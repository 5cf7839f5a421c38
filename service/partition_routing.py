"""Which partition a keyless message goes to when the service routes it (REST produce to a
partitioned topic): in turn, as Pulsar's official client sends messages without a key. A keyed
message goes by the hash of its key, the function the app hands ``PartitionedTopics`` (the
client's own, ``api.client.routing.key_partition``: a key lands in the same partition whichever
client sent it).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

#: ``(key, partitions) -> partition``: where a keyed message goes.
KeyRouter = Callable[[str, int], int]


class RoundRobin:
    """The partitions of keyless messages, in turn (one counter per partitioned topic)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, itertools.count[int]] = {}

    def next(self, topic: str, partitions: int) -> int:
        with self._lock:
            counter = self._next.setdefault(topic, itertools.count())
            return next(counter) % partitions
