"""What a managed ledger needs of the write-ahead log of its open ledger, whichever kind:
a local file (:class:`ledger.wal.WriteAheadLog`, ``COMPACTOR_WAL=local``) or frames
group-committed to object storage (:class:`ledger.object_wal.ObjectLog`, ``object``); and
what both report: :class:`Recovery` (what opening the log found) and
:class:`LedgerClosedError` (an append after the log was closed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ledger.entry import Appended, Entry, LedgerItem, StoredBatch


class LedgerClosedError(RuntimeError):
    """The write-ahead log was closed: the ledger takes no more entries."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :meth:`ledger.wal.WriteAheadLog.open` found and did.

    ``entries`` whole records were kept. If the file had a bad tail, ``truncated_bytes`` bytes
    from ``truncated_at`` to the old end were moved to ``quarantine_path`` (``reason`` says why
    the first one was rejected).
    """

    entries: int
    truncated_bytes: int = 0
    quarantine_path: Path | None = None
    truncated_at: int | None = None
    reason: str | None = None
    created: bool = False
    header_rewritten: bool = False


class OpenLog(Protocol):
    """The entries of one open ledger: appended, acknowledged once durable, read back.

    ``entries`` counts the readable (acknowledged) ones, ``written_entries`` every appended
    one; a token from :meth:`append` passed to :meth:`sync` waits until its entries are
    readable. After :meth:`close` every written entry is; :meth:`discard` then removes what
    holds them."""

    recovery: Recovery

    def append(self, records: Sequence[Appended], sizes: Sequence[int] | None = None) -> tuple[int, int]: ...

    def sync(self, token: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def discard(self) -> None: ...

    def read(self, start_entry: int, max_entries: int) -> list[Entry]: ...

    def read_batches(self, start_entry: int, max_entries: int) -> list[LedgerItem]: ...

    def read_all(self) -> list[Entry]: ...

    def read_appended(self) -> list[Appended]: ...

    def stored_batch(self, first_entry: int) -> StoredBatch | None: ...

    def first_entry_at_or_after(self, publish_time: int) -> int: ...

    @property
    def ledger_id(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    @property
    def entries(self) -> int: ...

    @property
    def written_entries(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def written_size_bytes(self) -> int: ...

    @property
    def file_bytes(self) -> int: ...

    @property
    def first_publish_time(self) -> int | None: ...

    @property
    def last_publish_time(self) -> int | None: ...
