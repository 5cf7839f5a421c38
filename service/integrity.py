"""Damage as the service reports it: which ledger a damaged file belongs to, and the one-line
messages an operator reads in ``lastError``, in read errors and in scrub findings.

A compaction's Spark tasks raise ``ledger.checksums.IntegrityError``, whose one-line text
(``"<path>: <check> failed: <detail>"``) reaches the driver inside a Python traceback; Spark's
own Parquet reader says ``CRC checksum verification failed`` with the file's URI. Both are
turned back into a :class:`Finding` here, so that a round ends with a line naming the topic,
the ledger and the check instead of a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ledger.checksums import (
    DECODE,
    FILE_CHECKSUM,
    FOOTER,
    MANIFEST,
    MISSING,
    PAGE_CHECKSUM,
    PAGE_DECODE,
    READ_BACK,
    ROW_IDS,
    IntegrityError,
    is_page_checksum_failure,
)
from ledger.storage import StoragePath
from service.names import TopicName

ORIGINAL, COMPACTED = "original", "compacted"

_CHECKS = "|".join(
    re.escape(c)
    for c in (
        PAGE_CHECKSUM,
        PAGE_DECODE,
        FOOTER,
        ROW_IDS,
        FILE_CHECKSUM,
        MANIFEST,
        MISSING,
        READ_BACK,
        DECODE,
    )
)
_LINE = re.compile(rf"(/[^\s:]+): ({_CHECKS}) failed: ([^\n]*)")
_URI = re.compile(r"file:(/[^\s,;'\"]+)")
_SEALED = re.compile(r"^(\d{20})\.(parquet|salvage)$")
_COMPACTED_DIR = re.compile(r"^compacted-(\d{20})(\.tmp)?$")


@dataclass(frozen=True)
class Finding:
    """Damage in one file: the ledger it belongs to (``kind`` original or compacted), the file,
    the check that failed and what was found."""

    kind: str
    ledger_id: int
    path: Path | StoragePath
    check: str
    detail: str

    def line(self, topic: TopicName | str) -> str:
        what = "compacted ledger" if self.kind == COMPACTED else "ledger"
        name = f" ({self.path.name})" if self.kind == COMPACTED else ""
        return f"{what} {self.ledger_id} of {topic} is damaged{name}: {self.check} failed: {self.detail}"

    def error(self) -> IntegrityError:
        return IntegrityError(self.path, self.check, self.detail)


def ledger_of(path: Path | StoragePath) -> tuple[str, int] | None:
    """(kind, ledger id) of a file under a topic's directory, or None."""
    m = _SEALED.match(path.name)
    if m:
        return ORIGINAL, int(m.group(1))
    for part in (path.parent.name, path.name):
        m = _COMPACTED_DIR.match(part)
        if m:
            return COMPACTED, int(m.group(1))
    return None


def finding_of(error: IntegrityError) -> Finding | None:
    found = ledger_of(error.path)
    if found is None:
        return None
    return Finding(found[0], found[1], error.path, error.check, error.detail)


def find_damage(text: str) -> Finding | None:
    """The first damaged file an error's text (a Spark traceback, say) names, or None."""
    m = _LINE.search(text)
    if m:
        return finding_of(IntegrityError(m.group(1), m.group(2), m.group(3)))
    if is_page_checksum_failure(text):
        for uri in _URI.finditer(text):
            found = finding_of(
                IntegrityError(uri.group(1), PAGE_CHECKSUM, "CRC checksum verification failed")
            )
            if found is not None:
                return found
    return None


def compacted_damage_line(topic: TopicName | str, error: IntegrityError, ledger_id: int | None) -> str:
    """The line naming damage in compacted ledger ``ledger_id`` (None: the one the file's
    directory names). A layered ledger's manifest names files in older ledgers' directories
    (``ledger.layers``): such a file is named with its directory, since it is the ledger the
    manifest belongs to that is dropped and rebuilt."""
    found = ledger_of(error.path)
    if ledger_id is None:
        if found is None:
            return f"{error.path}: {error.check} failed: {error.detail}"
        ledger_id = found[1]
    own = found is not None and found == (COMPACTED, ledger_id)
    name = error.path.name if own else f"{error.path.parent.name}/{error.path.name}"
    what = f"{error.check} failed: {error.detail}"
    return f"compacted ledger {ledger_id} of {topic} is damaged ({name}): {what}"


def names_file(files: Iterable[Path | StoragePath], path: Path | StoragePath) -> bool:
    """Whether ``path`` is one of ``files`` (a view's), compared by directory and file name: a
    path found in a Spark error is absolute, a view's may be relative to the working directory."""
    key = (path.parent.name, path.name)
    return any((f.parent.name, f.name) == key for f in files)


def skip_damaged_path(topic: TopicName, ledger_id: int) -> str:
    path = f"/admin/v2/persistent/{topic.tenant}/{topic.namespace}/{topic.topic}"
    return f"POST {path}/ledgers/{ledger_id}/skip-damaged"
