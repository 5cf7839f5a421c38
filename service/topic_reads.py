"""Reading one topic: from its log, or -- a reader of the compacted view -- from its compacted
ledger up to the horizon and then the log; where a read starts; the last message a reader sees.

A damaged compacted ledger met by a read goes to the handler the compaction service gives
(``Broker.on_compacted_damage``), which drops it and rebuilds it.
"""

from __future__ import annotations

from ledger.checksums import IntegrityError
from ledger.entry import Entry, LedgerItem, Position
from service.chunked import expand_compacted
from service.compacted_view import RetiredView
from service.errors import BeingRepaired, DamagedData, InvalidInput
from service.managed_topic import CompactedDamageHandler, ManagedTopic

EARLIEST = "earliest"
LATEST = "latest"


def resolve_start(topic: ManagedTopic, start: str) -> Position:
    """``earliest``, ``latest`` or ``"L:E"`` as a position of the topic's log."""
    if start == EARLIEST:
        # Not the oldest ledger's first entry: a compacted ledger may hold records from
        # ledgers that retention has since deleted, and reads move on past missing ids.
        return Position(0, 0)
    if start == LATEST:
        return topic.ledger.end_position()
    try:
        return Position.parse(start)
    except ValueError as e:
        raise InvalidInput(f"invalid startMessageId: {e}") from None


def read_at(
    topic: ManagedTopic,
    pos: Position,
    limit: int,
    read_compacted: bool,
    on_damage: CompactedDamageHandler | None,
) -> tuple[list[Entry], Position]:
    """Up to ``limit`` messages from ``pos`` inclusive, and where the next read starts.

    A damaged original ledger raises ``DamagedData`` (500); a damaged compacted ledger is
    dropped and rebuilt, and reads of the compacted view answer ``BeingRepaired`` (503)
    until the rebuild commits."""
    while True:
        view = topic.view if read_compacted else None
        repair = topic.repair
        if read_compacted and view is None and repair is not None and pos <= repair.horizon:
            raise BeingRepaired(
                f"compacted ledger {repair.ledger_id} of {topic.name} is damaged ({repair.finding}); "
                "it was dropped and is being rebuilt from the original ledgers",
                retry_after=5,
            )
        if view is None:
            return topic.ledger.read(pos, limit)
        if pos > view.horizon:
            # The compacted view's reader: chunked messages whole there too.
            after, following = topic.ledger.read(pos, limit)
            return expand_compacted(after), following
        try:
            with view.lease():
                out, nxt = view.ledger.read(pos, limit)
            # A chunked message kept whole goes out as the chunks its readers reassemble.
            out = expand_compacted(out)
        except RetiredView:
            continue  # a compaction committed meanwhile: read its ledger instead
        except IntegrityError as e:
            if on_damage is None:
                raise DamagedData(
                    f"compacted ledger {view.ledger_id} of {topic.name} is damaged: "
                    f"{e.path.name}: {e.check} failed: {e.detail}",
                    topic=str(topic.name),
                    ledger_id=view.ledger_id,
                    check=e.check,
                ) from e
            on_damage(topic, view, e)
            continue  # now 503 while it is rebuilt
        if nxt is not None:
            return out, nxt
        rest, nxt_pos = topic.ledger.read(view.horizon.next(), limit - len(out))
        return out + expand_compacted(rest), nxt_pos


def read_batches_at(
    topic: ManagedTopic,
    pos: Position,
    limit: int,
    read_compacted: bool,
    on_damage: CompactedDamageHandler | None,
) -> tuple[list[LedgerItem], Position]:
    """:func:`read_at`, with the log's stored batches whole where the read holds them
    (``ManagedLedger.read_batches``); the compacted view's messages come as entries."""
    view = topic.view if read_compacted else None
    if read_compacted and (topic.repair is not None or (view is not None and pos <= view.horizon)):
        return read_at(topic, pos, limit, read_compacted, on_damage)  # type: ignore[return-value]
    items, nxt = topic.ledger.read_batches(pos, limit)
    # After the horizon, the compacted view's reader gets chunked messages whole, as before it.
    return (expand_compacted(items) if view is not None else items), nxt


def last_message_id(topic: ManagedTopic, read_compacted: bool) -> Position | None:
    """The id of the topic's last message, None when it has none. Pulsar's rule for a
    reader of the compacted view: once compaction has reached the end of the log, the last
    message it can read is the compacted ledger's last (the log's tail may be deletes that
    compaction removed, and waiting for them would wait for ever)."""
    while True:
        last = topic.ledger.last_position()
        view = topic.view if read_compacted else None
        if view is None or (last is not None and last > view.horizon):
            return last
        try:
            with view.lease():
                return view.ledger.last_position
        except RetiredView:
            continue  # a compaction committed meanwhile: ask its ledger
