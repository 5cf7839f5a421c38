"""Pulsar's four subscription types, and a subscription's state as its dispatchers see it.

Below both ``service.subscriptions`` (the subscription and its cursor) and
``service.dispatchers`` (Shared and Key_Shared delivery), so that the dispatchers work on the
subscription they are given without importing the module that defines it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ledger.entry import Position

if TYPE_CHECKING:
    from service.managed_topic import ManagedTopic

EXCLUSIVE = "Exclusive"
FAILOVER = "Failover"
SHARED = "Shared"
KEY_SHARED = "Key_Shared"
SUBSCRIPTION_TYPES = (EXCLUSIVE, FAILOVER, SHARED, KEY_SHARED)

_Key = tuple[int, int]


class SubscriptionState(Protocol):
    """What a dispatcher reads and changes of its subscription (``service.subscriptions.
    Subscription``): the cursor's position, the acknowledgements, and the deliveries."""

    topic: ManagedTopic
    mark_delete: Position
    acked: set[Position]
    read_pos: Position
    # Delivered, not acknowledged: position -> times delivered before this delivery.
    pending: dict[_Key, int]
    # Delivered and then rewound, not yet consumed: position -> times delivered so far.
    redelivered: dict[_Key, int]
