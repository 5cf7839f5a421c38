"""Where a topic's files are -- its write-ahead files under the data directory, its sealed and
compacted ledgers in the ledger storage -- and removing them: a deleted topic's, and those a
crash left behind.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ledger import paths
from ledger.local_copies import LocalCopies
from ledger.storage import Storage, StoragePath, as_storage_path
from service.names import TopicName

log = logging.getLogger(__name__)


def topic_root(data_dir: Path, name: TopicName) -> Path:
    """The topic's directory on the local disk: its write-ahead files."""
    return paths.topic_dir(data_dir, name.tenant, name.namespace, name.topic)


def topic_store(storage: Storage, name: TopicName) -> StoragePath:
    """The topic's directory in the ledger storage: its sealed and compacted ledgers (the
    same directory as :func:`topic_root` when that storage is the local data directory)."""
    return storage.at(f"ledgers/{name.tenant}/{name.namespace}/{name.topic}")


def remove_topic_files(data_dir: Path, storage: Storage, copies: LocalCopies | None, name: TopicName) -> None:
    """Every file of a topic, on the local disk and in the ledger storage."""
    root, store = topic_root(data_dir, name), topic_store(storage, name)
    shutil.rmtree(root, ignore_errors=True)
    if store.local != root:
        store.delete_tree()
    if copies is not None:
        copies.drop_tree(store)


def remove_orphan_dirs(data_dir: Path, storage: Storage, existing: set[TopicName]) -> None:
    """A topic deleted in the metadata store whose files a crash left behind (on the local
    disk and in the ledger storage)."""
    base = as_storage_path(data_dir / "ledgers")
    stored = storage.at("ledgers")
    bases = [base] if base.local == stored.local else [base, stored]
    for ledgers in bases:
        for tenant in ledgers.dirs():
            for namespace in tenant.dirs():
                for topic in namespace.dirs():
                    if TopicName(tenant.name, namespace.name, topic.name) not in existing:
                        log.warning("removing files of deleted topic %s", topic)
                        topic.delete_tree()
