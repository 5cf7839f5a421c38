"""Pulsar's producer deduplication: the highest sequence id stored for each producer name of
a topic, so that a producer that sends again after a reconnect (or a crash of its own) does not
store twice what was already stored.

The state is what the topic stores, and nothing else: every message a Pulsar producer sent
carries its producer name and sequence id (``ledger.schema``), so an owner builds the state
from its ledgers the first time a deduplicating producer connects, and keeps it up to date
with what it writes. A new owner of the topic, after a crash or a move, builds it again from
the same ledgers: every acknowledged message is there. (Pulsar keeps snapshots of it in a
cursor and replays the log after the last one; the ledgers' own columns make that unneeded.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pyarrow.compute as pc
import pyarrow.parquet as pq

from ledger.checksums import READ_OPTIONS
from ledger.entry import Position
from ledger.paths import sealed_path
from ledger.schema import PRODUCER_NAME, SEQUENCE_ID
from service.managed_ledger import ManagedLedger

# Entries read at a time from a ledger that is not sealed yet.
_PAGE = 10_000


class ProducerSequences:
    """The highest sequence id stored for each producer name of one topic. Thread-safe."""

    def __init__(self, highest: dict[str, int] | None = None) -> None:
        self._highest = dict(highest or {})
        self._lock = threading.Lock()

    def last(self, producer: str) -> int:
        """The highest sequence id stored from ``producer`` (-1: none, as Pulsar answers)."""
        with self._lock:
            return self._highest.get(producer, -1)

    def stored(self, producer: str, sequence_ids: Iterable[int]) -> None:
        """Note sequence ids of ``producer`` that are now stored."""
        top = max(sequence_ids, default=-1)
        with self._lock:
            if top > self._highest.get(producer, -1):
                self._highest[producer] = top


def load(ledger: ManagedLedger) -> ProducerSequences:
    """The state of a topic, from every ledger it holds: a sealed ledger's two columns, or an
    open (or not yet sealed) ledger's entries. Ledgers written before producers were kept have
    no such column and count for nothing."""
    highest: dict[str, int] = {}

    def note(producer: str | None, sequence_id: int | None) -> None:
        if producer is not None and sequence_id is not None and sequence_id > highest.get(producer, -1):
            highest[producer] = sequence_id

    for info in ledger.ledgers():
        path = sealed_path(ledger.store, info.ledger_id, info.sealed_epoch)
        if info.state == "CLOSED" and path.exists():
            with path.open() as source, pq.ParquetFile(source, **READ_OPTIONS) as f:  # type: ignore[arg-type]
                if SEQUENCE_ID not in f.schema_arrow.names:
                    continue
                table = f.read(columns=[PRODUCER_NAME, SEQUENCE_ID])
            table = table.filter(pc.is_valid(table.column(PRODUCER_NAME)))
            if table.num_rows:
                grouped = table.group_by(PRODUCER_NAME).aggregate([(SEQUENCE_ID, "max")])
                for producer, top in zip(
                    grouped.column(PRODUCER_NAME).to_pylist(),
                    grouped.column(f"{SEQUENCE_ID}_max").to_pylist(),
                    strict=True,
                ):
                    note(producer, top)
            continue
        at = Position(info.ledger_id, 0)
        while True:
            entries, nxt = ledger.read(at, _PAGE)
            entries = [e for e in entries if e.ledger_id == info.ledger_id]
            if not entries:
                break
            for e in entries:
                note(e.producer_name, e.sequence_id)
            at = nxt
    return ProducerSequences(highest)
