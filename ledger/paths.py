"""Where ledger files live under the storage root.

Layout (``root`` is the configured data dir)::

    root/ledgers/{tenant}/{namespace}/{topic}/{ledger_id:020d}.wal        open ledger
    root/ledgers/{tenant}/{namespace}/{topic}/{ledger_id:020d}.e{epoch}.wal  open ledger of an owner's epoch
    root/ledgers/{tenant}/{namespace}/{topic}/{ledger_id:020d}.parquet    sealed ledger
    root/ledgers/{tenant}/{namespace}/{topic}/{ledger_id:020d}.e{epoch}.parquet  sealed by an owner's epoch
    root/wal/{writer}/{sequence:016d}.wal      write-ahead objects (COMPACTOR_WAL=object)
    root/ledgers/{tenant}/{namespace}/{topic}/compacted-{ledger_id:020d}/ compacted ledger (part files)
    root/tables/{tenant}/{namespace}/{name}/   a compacted topic's Iceberg table (metadata, delete files)

Zero-padded ids keep a directory listing in ledger order. Topic name parts are validated by
the service before they reach here (no separators, never ``.`` or ``..``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from ledger.storage import StoragePath

# A topic's directory on the local disk (its write-ahead files) or in the ledger storage
# (its sealed and compacted ledgers; the same directory when that storage is the local disk).
P = TypeVar("P", Path, StoragePath)


def topic_dir(root: Path, tenant: str, namespace: str, topic: str) -> Path:
    return Path(root) / "ledgers" / tenant / namespace / topic


def wal_path(topic_root: Path, ledger_id: int, epoch: int = 0) -> Path:
    """The write-ahead file of a ledger; one opened under an owner's epoch (several service
    instances) carries the epoch in its name, so each file has exactly one writer."""
    if epoch:
        return topic_root / f"{ledger_id:020d}.e{epoch}.wal"
    return topic_root / f"{ledger_id:020d}.wal"


def sealed_path(topic_root: P, ledger_id: int, epoch: int = 0) -> P:
    """The sealed file of a ledger, sealed by an owner of ``epoch``: a name of its own for every
    owner that may seal it (the one that opened it, one that took the topic over), so that an
    old owner's late upload never replaces the file the metadata publishes."""
    if epoch:
        return topic_root / f"{ledger_id:020d}.e{epoch}.parquet"
    return topic_root / f"{ledger_id:020d}.parquet"


def compacted_dir(topic_root: P, ledger_id: int) -> P:
    return topic_root / f"compacted-{ledger_id:020d}"


def salvage_path(topic_root: P, ledger_id: int) -> P:
    """The verified copy of a damaged sealed ledger's intact rows (``ledger.salvage``); not
    ``*.parquet``, so that recovery's sweep of stale sealed files leaves it alone."""
    return topic_root / f"{ledger_id:020d}.salvage"


def table_dir(storage_root: P, tenant: str, namespace: str, name: str) -> P:
    """The directory of a topic's Iceberg table (``ledger.iceberg_table``): its metadata files,
    manifests and position-delete files; its data files are the compacted ledgers' parts,
    where they are. ``name`` is the topic's local name, or the partitioned topic's (one table
    for all its partitions)."""
    return storage_root / "tables" / tenant / namespace / name
