"""The unit a ledger stores, and the position that names it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

_ID_RE = re.compile(r"^(\d{1,19}):(\d{1,19})(?::(\d{1,9}))?$")
MAX_ID = 2**63 - 1


class Position(NamedTuple):
    """A message id ``(ledger_id, entry_id)``, ordered lexicographically, written ``"L:E"``.

    A tuple, so that the comparisons and hashing on every delivery and ack run in C.
    """

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    def next(self) -> Position:
        """The position just after this one in the same ledger."""
        return Position(self.ledger_id, self.entry_id + 1)

    @classmethod
    def parse(cls, text: str) -> Position:
        """Parse ``"L:E"``, or a batch member's ``"L:E:B"`` (:func:`message_id`); raises
        ``ValueError`` for anything else."""
        m = _ID_RE.match(text)
        if m is None:
            raise ValueError(
                f"not a message id: {text!r} (expected 'ledgerId:entryId' or 'ledgerId:entryId:batchIndex')"
            )
        ledger_id, entry_id = int(m.group(1)), int(m.group(2)) + int(m.group(3) or 0)
        if ledger_id > MAX_ID or entry_id > MAX_ID:
            raise ValueError(f"message id out of range: {text!r}")
        return cls(ledger_id, entry_id)


@dataclass(slots=True)
class Record:
    """What a producer sends: the message before the ledger gives it an id.

    A keyed record whose value is null or empty is a tombstone: compaction deletes the key
    (:func:`is_delete`, Pulsar's rule). Treated as a value; only the broker writes to one, its
    ``publish_time`` as it stores it (not frozen: a frozen dataclass of ten fields costs twice
    as much to build, and every produced message is one).
    """

    key: str | None
    value: bytes | None
    properties: dict[str, str] = field(default_factory=dict)
    publish_time: int = 0
    event_time: int | None = None
    # Set on the members of a Pulsar batch (see :func:`message_id`); None on a message sent alone.
    batch_index: int | None = None
    batch_size: int | None = None
    # The Pulsar producer that sent it and the sequence id it gave it (None over REST).
    producer_name: str | None = None
    sequence_id: int | None = None
    # Pulsar's delayed delivery: not delivered to a Shared subscription before this (ms).
    deliver_at_time: int | None = None
    # Pulsar's ordering key: what Key_Shared orders and routes by, where a message has one
    # (the key still decides compaction).
    ordering_key: bytes | None = None
    # The version of the topic's schema the producer wrote with (``service.schemas``), as the
    # producer sent it: opaque bytes.
    schema_version: bytes | None = None

    @property
    def is_tombstone(self) -> bool:
        return is_delete(self.key, self.value)


@dataclass(slots=True)
class StoredBatch:
    """A Pulsar batch as its producer sent it, stored as one write-ahead record that covers
    ``count`` consecutive entries (member ``i`` of the batch at entry ``E`` is entry ``E + i``,
    see :func:`message_id`). Its members are decoded only where rows are needed (sealing, a
    read of entries): the produce path's work for a batch does not grow with its members.

    ``metadata`` and ``payload`` are the bytes the producer sent (the payload compressed as
    ``compression`` says, Pulsar's ``CompressionType`` numbers); the other fields are the
    batch-level values of that metadata which its members inherit. ``size`` is the sum of the
    members' :func:`record_size`, counted when the batch was checked. Only the broker writes
    ``publish_time``, as it stores the batch.
    """

    metadata: bytes
    payload: bytes
    count: int
    size: int
    compression: int = 0
    uncompressed_size: int = 0
    producer_name: str = ""
    sequence_id: int = 0
    deliver_at_time: int | None = None
    ordering_key: bytes | None = None
    schema_version: bytes | None = None
    publish_time: int = 0


#: What a ledger takes in one append: a message (a REST produce, a Pulsar message sent alone)
#: or a whole Pulsar batch.
Appended = Record | StoredBatch


def entry_count(item: Record | StoredBatch) -> int:
    """Entries ``item`` takes in a ledger."""
    return item.count if type(item) is StoredBatch else 1


class Entry(NamedTuple):
    """A record stored in a ledger under its message id.

    A tuple (immutable, built in C): a consumer's page makes thousands of entries, and a
    frozen dataclass costs three times as much to construct.
    """

    ledger_id: int
    entry_id: int
    key: str | None
    value: bytes | None
    properties: dict[str, str]
    publish_time: int
    event_time: int | None
    batch_index: int | None = None
    batch_size: int | None = None
    producer_name: str | None = None
    sequence_id: int | None = None
    deliver_at_time: int | None = None
    ordering_key: bytes | None = None
    schema_version: bytes | None = None

    @property
    def position(self) -> Position:
        return Position(self.ledger_id, self.entry_id)

    @property
    def message_id(self) -> str:
        """The id clients see (:func:`message_id`)."""
        return message_id(self.ledger_id, self.entry_id, self.batch_index)

    @property
    def is_tombstone(self) -> bool:
        return is_delete(self.key, self.value)

    def size(self) -> int:
        """Payload bytes, as counted for backlog and ledger size limits."""
        return record_size(self.key, self.value, self.properties)


class BatchEntry(NamedTuple):
    """A whole stored batch at its place in a ledger: entries ``entry_id .. entry_id +
    batch.count - 1`` of ``ledger_id``, which a consumer of the log receives as one message.

    Read from the write-ahead log, ``batch`` is the batch as its producer sent it; read from a
    sealed ledger, it is rebuilt from the members' rows (``batch.metadata`` is then empty: the
    protocol writes the batch's metadata from its fields, and the payload is uncompressed).
    """

    ledger_id: int
    entry_id: int
    batch: StoredBatch

    @property
    def position(self) -> Position:
        return Position(self.ledger_id, self.entry_id)


#: What a read of whole batches gives: single messages (and members of batches that the read
#: does not hold whole) as entries, whole batches as one item each.
LedgerItem = Entry | BatchEntry


def item_entries(item: LedgerItem) -> int:
    """Entries ``item`` covers in its ledger: a whole batch's members, else one."""
    return item.batch.count if type(item) is BatchEntry else 1


def message_id(ledger_id: int, entry_id: int, batch_index: int | None) -> str:
    """The id a client sees for the message stored at ``(ledger_id, entry_id)``.

    The members of a Pulsar batch are stored as consecutive entries, member ``i`` of the batch
    that starts at entry ``E`` at ``E + i``, so that every position in the service stays a pair.
    Clients name them as Pulsar does, by the batch's entry and the member's index:
    ``"L:E:i"``. :meth:`Position.parse` maps that back to ``(L, E + i)``, so the order of ids
    is the order of positions either way.
    """
    if batch_index is None:
        return f"{ledger_id}:{entry_id}"
    return f"{ledger_id}:{entry_id - batch_index}:{batch_index}"


def is_delete(key: str | None, value: bytes | None) -> bool:
    """Pulsar's rule: a message deletes its key in compaction when its value is null, or empty
    and it has a key. A keyless message is never deduplicated: only a null value drops it
    (an empty keyless value is kept, where ``retainNullKey`` keeps keyless messages)."""
    return value is None or (key is not None and not value)


def record_size(key: str | None, value: bytes | None, properties: dict[str, str]) -> int:
    """Bytes a message carries: key, value and properties, UTF-8 encoded."""
    n = len(value) if value is not None else 0
    if key is not None:
        n += len(key.encode())
    for k, v in properties.items():
        n += len(k.encode()) + len(v.encode())
    return n


#: The property a message of a Pulsar producer with encryption on keeps its encryption context
#: in (``api.pulsar.encryption``): the key names, encrypted data keys, algorithm, parameter and
#: compression the consumers need to decrypt, which the broker never reads. On the first member
#: of an encrypted batch it also holds the batch's size, and its value is the whole encrypted
#: batch; the batch's other members hold it empty (their content is in the first member's).
ENCRYPTION_PROPERTY = "__pulsar.encryption"
