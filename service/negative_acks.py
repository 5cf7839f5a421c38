"""Negative acknowledgements: messages a consumer could not process, delivered again once the
consumer's ``negativeAckRedeliveryDelayMs`` has passed (Pulsar's ``NegativeAcksTracker``).

Pulsar tracks them in the client and then asks the broker to redeliver; here the service keeps
them, so a client that stops after a negative acknowledgement loses nothing either. As in
Pulsar, a Shared or Key_Shared subscription redelivers exactly the messages negatively
acknowledged; an Exclusive or Failover one redelivers every unacknowledged message (order is
the point of those types), see ``service.subscriptions``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

Key = tuple[int, int]

#: Pulsar's default ``negativeAckRedeliveryDelay``: one minute.
DEFAULT_DELAY_MS = 60_000


class NegativeAcks:
    """Negatively acknowledged positions of one subscription, each with the consumer that
    held it and when it is due. Called with the subscription's lock held."""

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due: list[tuple[float, Key, str]] = []  # a heap by deadline

    def __bool__(self) -> bool:
        return bool(self._due)

    def __len__(self) -> int:
        return len(self._due)

    def add(self, positions: Iterable[Key], consumer_id: str, deadline: float) -> None:
        for pos in positions:
            heapq.heappush(self._due, (deadline, pos, consumer_id))

    def next_deadline(self) -> float | None:
        return self._due[0][0] if self._due else None

    def pop_due(self, now: float) -> list[tuple[Key, str]]:
        """The positions whose delay has passed, with the consumer that nacked each."""
        out = []
        due = self._due
        while due and due[0][0] <= now:
            _, pos, consumer_id = heapq.heappop(due)
            out.append((pos, consumer_id))
        return out

    def clear(self) -> None:
        self._due.clear()
