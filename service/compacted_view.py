"""The compacted view of a topic: its compacted ledger and the horizon it covers.

A view is replaced, never changed, when a compaction commits. Readers lease the view they
read from, so the files of a replaced compacted ledger are deleted only once no read of it
is in flight.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ledger.compacted_store import CompactedLedger
from ledger.entry import Position

log = logging.getLogger(__name__)


class RetiredView(Exception):
    """The view was replaced before the lease was taken: read the topic's current view."""


class CompactedView:
    """Compacted ledger ``ledger_id`` holding the latest record of every key up to ``horizon``."""

    def __init__(
        self, *, horizon: Position, ledger_id: int, directory: Path, checksum: str | None = None
    ) -> None:
        self.horizon = horizon
        self.ledger_id = ledger_id
        self.directory = directory
        # The manifest's CRC32C as the metadata records it (None: written before checksums).
        self.checksum = checksum
        self.ledger = CompactedLedger(directory, checksum=checksum)
        self._leases = 0
        self._retired = False
        self._lock = threading.Lock()

    @contextmanager
    def lease(self) -> Iterator[CompactedView]:
        """Hold the files for the duration of a read. Raises ``RetiredView`` if the view is
        already replaced (its files may be gone): the caller takes the topic's new view."""
        with self._lock:
            if self._retired:
                raise RetiredView(self.ledger_id)
            self._leases += 1
        try:
            yield self
        finally:
            with self._lock:
                self._leases -= 1
                delete = self._retired and self._leases == 0
            if delete:
                self._delete()

    def retire(self) -> None:
        """Called once a newer view is committed: delete the files when the last reader leaves."""
        with self._lock:
            self._retired = True
            delete = self._leases == 0
        if delete:
            self._delete()

    def _delete(self) -> None:
        log.info("deleting replaced compacted ledger %s", self.ledger_id)
        shutil.rmtree(self.directory, ignore_errors=True)
