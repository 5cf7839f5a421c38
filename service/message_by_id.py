"""A stored message by its id, as Pulsar's admin API reads one (``getMessageById``): the entry
at ``(ledger, entry)`` of a topic's log, which is a message sent alone or a whole batch.

Ids name entries as clients see them (``ledger.entry.message_id``): a batch is the entry of its
first member, and the positions its later members take in this service's log are no entries of
their own (not found, as any id that names no entry).
"""

from __future__ import annotations

from ledger.entry import Entry, Position
from service.errors import NotAllowed, NotFound
from service.names import TopicName
from service.partitions import PartitionedTopics
from service.topics import Broker


def message_by_id(
    *, broker: Broker, partitioned: PartitionedTopics, name: TopicName, ledger_id: int, entry_id: int
) -> list[Entry]:
    """The message stored at ``(ledger_id, entry_id)`` of ``name``'s log: one entry for a message
    sent alone, every member of a batch in order for a batch. ``NotFound`` when the id names no
    entry (or the topic does not exist), ``NotAllowed`` for a partitioned topic's name (an id
    names a message of one of its partitions, as Pulsar answers)."""
    try:
        topic = broker.topic(name)
    except NotFound:
        if partitioned.get(name) is not None:
            raise NotAllowed(
                f"{name} is a partitioned topic: a message id names a message of one of its "
                f"partitions ({name.topic}-partition-<i>)"
            ) from None
        raise
    start = Position(ledger_id, entry_id)
    missing = NotFound(f"message id {ledger_id}:{entry_id} not found in {name}")
    found, _ = broker.read_at(topic, start, 1, False)
    if not found or found[0].position != start or (found[0].batch_index or 0) != 0:
        raise missing
    first = found[0]
    if first.batch_index is None or not first.batch_size or first.batch_size == 1:
        return [first]
    members = [first]
    pos = start.next()
    while len(members) < first.batch_size:
        more, _ = broker.read_at(topic, pos, first.batch_size - len(members), False)
        batch = [
            m for m in more if m.ledger_id == ledger_id and m.entry_id - (m.batch_index or 0) == entry_id
        ]
        if not batch:
            break  # members left out of the log (they are not, in a log): what there is
        members += batch
        pos = batch[-1].position.next()
        if len(batch) < len(more):
            break
    return [m for m in members if m.batch_index is not None]
