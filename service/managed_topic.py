"""A loaded topic: its managed ledger, its compacted view and the state of its compaction,
its subscriptions, its lease and its deduplication state -- what ``service.topics.Broker``
holds for each topic it serves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ledger.checksums import IntegrityError
from ledger.entry import Position
from service.compacted_view import CompactedView, LayerFiles
from service.counters import Tally
from service.deduplication import ProducerSequences
from service.managed_ledger import ManagedLedger
from service.names import TopicName
from service.ownership import Lease, forever


@dataclass(frozen=True)
class DroppedView:
    """A compacted ledger dropped for damage: which, up to where, and what was found."""

    ledger_id: int
    horizon: Position
    finding: str


# Called with the topic, the view and the damage when a read meets a damaged compacted ledger:
# the compaction service drops the view and starts a rebuild (service.compaction).
CompactedDamageHandler = Callable[["ManagedTopic", CompactedView, IntegrityError], None]


@dataclass
class ManagedTopic:
    """A loaded topic: its log and the state of its compaction."""

    name: TopicName
    topic_id: int
    ledger: ManagedLedger
    # Serialises compaction rounds and deletion of this topic.
    admin_lock: threading.Lock = field(default_factory=threading.Lock)
    view: CompactedView | None = None
    # The files of the compacted views alive now (the view, and replaced ones still leased).
    layer_files: LayerFiles = field(default_factory=LayerFiles)
    # Views a round replaced, retired once the round has let the topic go: deleting their
    # files (requests, on object storage) is no part of the round a client waits for.
    retiring: list[CompactedView] = field(default_factory=list)
    # Durable subscriptions by name (service.subscriptions.Subscription), loaded at start.
    subscriptions: dict[str, Any] = field(default_factory=dict)
    # Messages delivered to consumers and readers since the service started (pulsar_out_messages_total).
    messages_out: Tally = field(default_factory=Tally)
    # Set while a damaged compacted ledger, dropped, is rebuilt from the originals: reads of
    # the compacted view up to its horizon answer 503 until the rebuild commits.
    repair: DroppedView | None = None
    # This instance's hold on the topic: writes are acknowledged only while it is valid.
    lease: Lease = field(default_factory=forever)
    # Pulsar's deduplication state, built from the ledgers on first use (service.deduplication).
    sequences: ProducerSequences | None = None
    sequences_lock: threading.Lock = field(default_factory=threading.Lock)
    # Set while the topic is over a producer_* backlog quota (service.backlog_quota_checks):
    # makes the error each write is refused with until a check finds it under its quotas.
    quota_refusal: Callable[[], Exception] | None = None

    def compacted_view(self) -> CompactedView | None:
        return self.view
