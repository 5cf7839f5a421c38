"""The compacted view of a topic: its compacted ledger and the horizon it covers.

A view is replaced, never changed, when a compaction commits. Readers lease the view they
read from, so the files of a replaced compacted ledger are deleted only once no read of it
is in flight.

A compacted ledger is a manifest over layers (``ledger.layers``) and consecutive ledgers share
files: a delta round's manifest names the older layers' parts where an earlier round wrote
them. So a replaced view does not delete its directory: it gives its files back to the topic's
:class:`LayerFiles`, which deletes a file once no live view names it (the current one, or a
replaced one that a reader still leases).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ledger.compacted_store import MANIFEST_NAME, CompactedLedger
from ledger.entry import Position
from ledger.storage import StoragePath

log = logging.getLogger(__name__)


class RetiredView(Exception):
    """The view was replaced before the lease was taken: read the topic's current view."""


class LayerFiles:
    """Reference counts of the files of a topic's live compacted views.

    Invariant: a file is deleted only when the last view naming it lets it go, and a view lets
    its files go only once it is replaced and no reader leases it. A new view takes its
    references before the view it replaces lets go of its own, so files the two share stay.
    """

    def __init__(self) -> None:
        self._refs: Counter[StoragePath] = Counter()
        self._lock = threading.Lock()

    def acquire(self, files: Iterable[StoragePath]) -> None:
        with self._lock:
            self._refs.update(files)

    def release(self, files: Iterable[StoragePath]) -> None:
        """Drop one reference to each of ``files``; delete those no view names any more, and
        the directories that leaves empty."""
        gone: list[StoragePath] = []
        with self._lock:
            for f in files:
                self._refs[f] -= 1
                if self._refs[f] <= 0:
                    del self._refs[f]
                    gone.append(f)
            # Deleted under the lock: a view made meanwhile cannot count a file being removed.
            for f in gone:
                f.unlink()
            for d in {f.parent for f in gone}:
                d.rmdir()  # only if empty: another view's files may be in it

    def referenced(self) -> set[StoragePath]:
        with self._lock:
            return set(self._refs)


class CompactedView:
    """Compacted ledger ``ledger_id`` holding the latest record of every key up to ``horizon``."""

    def __init__(
        self,
        *,
        horizon: Position,
        ledger_id: int,
        directory: StoragePath,
        checksum: str | None = None,
        files: LayerFiles | None = None,
    ) -> None:
        self.horizon = horizon
        self.ledger_id = ledger_id
        self.directory = directory
        # The manifest's CRC32C as the metadata records it (None: written before checksums).
        self.checksum = checksum
        self.ledger = CompactedLedger(directory, checksum=checksum)
        root = directory.parent
        self.files = {root / name for name in self.ledger.manifest.files()} | {directory / MANIFEST_NAME}
        self._shared = files if files is not None else LayerFiles()
        self._shared.acquire(self.files)
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
        """Called once a newer view is committed (or when a view is dropped unused): its files
        go back when the last reader leaves, and are deleted if no other view names them."""
        with self._lock:
            if self._retired:
                return
            self._retired = True
            delete = self._leases == 0
        if delete:
            self._delete()

    def _delete(self) -> None:
        log.info("releasing the files of replaced compacted ledger %s", self.ledger_id)
        self.ledger.close()
        self._shared.release(self.files)
