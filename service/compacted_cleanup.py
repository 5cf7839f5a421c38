"""Removing compacted ledgers no one uses: at a topic's load, every compacted ledger but the
one its cursor names (and every file of that one its view does not name); after a scrub, the
directories of ledgers DELETED that no live view uses (what a failed round could not remove);
and a failed round's own ledger. At a load the rows are marked DELETED first and the files
removed then; a failed round's ledger loses its files first and its row then (what fails is
swept at the next scrub or start). A round that runs has its row BUILDING from before its
first write, so the scrub's sweep never takes its files."""

from __future__ import annotations

import logging
import re

from sqlalchemy import select

from ledger import files, paths
from ledger.storage import StoragePath
from service import models
from service.db import Database
from service.managed_topic import ManagedTopic

log = logging.getLogger(__name__)


# A compacted ledger's directory (with its temporary suffix while a round writes it locally).
_COMPACTED_DIR = re.compile(r"compacted-(\d+)(?:\.tmp)?")


def sweep_orphans(*, db: Database, topic: ManagedTopic) -> int:
    """Remove the compacted ledger directories no one uses any more (a scrub's last step):
    what a failed round wrote and could not remove because the object store had stopped
    answering. A directory goes only when its ledger's row is DELETED (or gone) and no live
    view (one still leased by a reader included) names a file in it: a round that runs has
    its row BUILDING from before its first write, so its files are never taken. Returns
    how many directories went."""
    # The files views use first, the rows then: a round that commits in between has its
    # row live, and names the older layers that the view it replaces still holds.
    used = {f.parent.name for f in topic.layer_files.referenced()}
    with db.session() as s:
        live = set(
            s.scalars(
                select(models.Ledger.id).where(
                    models.Ledger.topic_id == topic.topic_id,
                    models.Ledger.kind == models.COMPACTED,
                    models.Ledger.state != models.DELETED,
                )
            )
        )
    removed = 0
    for d in topic.ledger.store.dirs():
        m = _COMPACTED_DIR.fullmatch(d.name)
        if m is None or int(m.group(1)) in live or d.name in used:
            continue
        log.info("removing compacted ledger %s, which no view uses", d)
        d.delete_tree()
        removed += 1
    return removed


def remove_unreferenced(
    *, db: Database, topic: ManagedTopic, referenced: int | None, pinned: set[StoragePath] | None = None
) -> None:
    """Mark compacted ledgers other than ``referenced`` deleted, and remove every file under
    the topic's ``compacted-*`` directories that the current view does not name (nor
    ``pinned``: the files of older ledgers its Iceberg table's kept snapshots name,
    ``service.tables``): ledgers a crash left half-built or uncommitted, and layers, deletion
    vectors and manifests of replaced ledgers whose removal a stop interrupted."""
    with db.session() as s:
        for row in s.scalars(
            select(models.Ledger).where(
                models.Ledger.topic_id == topic.topic_id,
                models.Ledger.kind == models.COMPACTED,
                models.Ledger.state != models.DELETED,
            )
        ):
            if row.id != referenced:
                row.state = models.DELETED
    keep = (topic.view.files if topic.view is not None else set()) | (pinned or set())
    for d in topic.ledger.store.dirs():
        if not d.name.startswith("compacted-"):
            continue
        if not any(f.parent == d for f in keep):
            log.info("removing unreferenced compacted ledger %s", d)
            d.delete_tree()
            continue
        for sub in d.dirs():
            log.info("removing unreferenced compacted files %s", sub)
            sub.delete_tree()
        for f in d.files():
            if f not in keep:
                log.info("removing unreferenced compacted file %s", f)
                f.unlink()


def discard_compacted(*, db: Database, topic: ManagedTopic, ledger_id: int) -> None:
    """Remove a failed round's compacted ledger: its files (and their temporary directory),
    then its row marked DELETED; what fails here the next scrub or start-up sweeps."""
    directory = paths.compacted_dir(topic.ledger.store, ledger_id)
    try:
        directory.delete_tree()
        directory.with_name(directory.name + files.TMP_SUFFIX).delete_tree()
    except OSError:  # object storage that stopped answering: the next scrub sweeps them
        log.warning("could not remove the files of compacted ledger %s", ledger_id, exc_info=True)
    try:
        with db.session() as s:
            row = s.get(models.Ledger, ledger_id)
            if row is not None:
                row.state = models.DELETED
    except Exception:  # the start-up sweep removes it if this fails too
        log.exception("could not mark compacted ledger %s deleted", ledger_id)
