"""Local copies of objects an instance's compaction rounds read: the sealed ledgers it
uploaded, and the older compacted layers' key indexes and deletion vectors its delta rounds
downloaded to verify.

What it is for: on object storage an instance writes each sealed ledger to its own disk first
(the staging file it uploads). Keeping that file after the upload, instead of deleting it,
lets the instance's compaction rounds -- Spark in local mode, on this machine -- read the
ledger from the disk instead of fetching it back from the bucket; right after a produce that
is every ledger a round reads. Kafka keeps its newest segments on the broker's disk for the
same reason while tiered storage holds them too (``local.retention.bytes``).

Invariants:

* a copy is the object: an object's key is written once (a sealed ledger's names its owner's
  epoch; a ledger sealed again by the same owner is the same rows and replaces its copy), and
  a copy is taken only of a file that was uploaded whole and read back equal to its records;
* copies weigh at most ``max_bytes`` in all; the least recently used leave first, but never
  one a round holds (:meth:`LocalCopies.lease`), so a round never finds its file gone;
* copies are disposable: a start-up removes what a process no longer running left, and a copy lost
  loses nothing (the object is the ledger). A round that meets a damaged copy drops it and
  the next round reads the object.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections import Counter, OrderedDict
from pathlib import Path

from ledger.storage import StoragePath, open_storage

log = logging.getLogger(__name__)


class LocalCopies:
    """The copies kept in one local directory (one per service), by object."""

    def __init__(self, base: Path, max_bytes: int) -> None:
        """Copies in a directory of this process's own under ``base`` (instances may share a
        data directory); what a process no longer running left there is removed."""
        base = base.absolute()
        self.directory = base / str(os.getpid())
        self.max_bytes = max_bytes
        # What an earlier run left is not trusted (it may have crashed mid-copy): removed.
        with contextlib.suppress(OSError):
            for left in base.iterdir():
                if left == self.directory or not (left.name.isdigit() and _running(int(left.name))):
                    shutil.rmtree(left, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._root = open_storage(str(self.directory)).at("")
        self._sizes: OrderedDict[str, int] = OrderedDict()  # by object name, least recent first
        self._leases: Counter[str] = Counter()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def keep(self, path: StoragePath, staged: Path) -> bool:
        """Take ``staged`` (a file just uploaded whole as ``path``) as ``path``'s copy; False if
        it is not kept (too big, or the move failed), and then the caller removes it."""
        try:
            size = staged.stat().st_size
            if path.local is not None or size > self.max_bytes:
                return False
            name = path.fs_path
            target = self._file(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(staged, target)
            except OSError:  # another filesystem: copied, then the staged file goes
                part = target.with_name(target.name + ".copying")
                shutil.copyfile(staged, part)
                os.replace(part, target)
                os.unlink(staged)
        except OSError as e:
            log.warning("not keeping a local copy of %s: %s", path, e)
            return False
        with self._lock:
            self._bytes -= self._sizes.pop(name, 0)
            self._sizes[name] = size
            self._bytes += size
            self._evict_locked()
        return True

    def keep_bytes(self, path: StoragePath, data: bytes) -> bool:
        """Take ``data`` (an object's whole bytes, just read and verified) as ``path``'s copy;
        False if it is not kept."""
        if path.local is not None or len(data) > self.max_bytes:
            return False
        target = self._file(path.fs_path)
        part = target.with_name(f"{target.name}.{threading.get_ident()}.copying")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            part.write_bytes(data)
        except OSError as e:
            log.warning("not keeping a local copy of %s: %s", path, e)
            with contextlib.suppress(OSError):
                part.unlink()
            return False
        return self.keep(path, part)

    def lease(self, path: StoragePath) -> StoragePath | None:
        """``path``'s copy as a local file (None if there is none), held until :meth:`release`."""
        name = path.fs_path
        with self._lock:
            if name not in self._sizes:
                return None
            self._sizes.move_to_end(name)
            self._leases[name] += 1
        return self._root / name

    def release(self, copy: StoragePath) -> None:
        """Let a leased copy go (it may leave now if the copies are over their bound)."""
        name = copy.key
        with self._lock:
            self._leases[name] -= 1
            if self._leases[name] <= 0:
                del self._leases[name]
            self._evict_locked()

    def holds(self, path: Path | StoragePath) -> bool:
        """Whether ``path`` (a local file, as an error names it) is one of the copies."""
        local = path.local if isinstance(path, StoragePath) else path
        return local is not None and Path(local).absolute().is_relative_to(self.directory)

    def drop(self, path: Path | StoragePath) -> None:
        """Forget a copy (given as the object or as the local file): a damaged one, or one
        whose object was deleted. A round holding it keeps its open file."""
        if isinstance(path, StoragePath) and path.local is None:
            name = path.fs_path
        else:
            local = path.local if isinstance(path, StoragePath) else path
            name = str(Path(str(local)).absolute().relative_to(self.directory))
        with self._lock:
            self._bytes -= self._sizes.pop(name, 0)
            self._unlink(name)

    def drop_tree(self, directory: StoragePath) -> None:
        """Forget the copies of every object under ``directory`` (a deleted topic's)."""
        prefix = directory.fs_path.rstrip("/") + "/"
        with self._lock:
            for name in [name for name in self._sizes if name.startswith(prefix)]:
                self._bytes -= self._sizes.pop(name)
                self._unlink(name)

    def _evict_locked(self) -> None:
        # Files go under the lock: a copy kept again under the same name meanwhile must not
        # lose its new file to the eviction of the old one.
        for name in list(self._sizes):
            if self._bytes <= self.max_bytes:
                break
            if self._leases.get(name):
                continue
            self._bytes -= self._sizes.pop(name)
            self._unlink(name)

    def _file(self, name: str) -> Path:
        return self.directory / name

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self._file(name).unlink()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
