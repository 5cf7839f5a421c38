"""A table as a round's commit leaves it, for the catalog's tests: its files under the storage
root's ``tables/{tenant}/{namespace}/{name}`` (written by pyiceberg here) and its ``TopicTable``
row naming the current metadata file."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

from service.db import Database
from service.models import TopicTable
from service.table_catalog import file_io_properties
from tests.server import ServerProcess as Server
from tests.server import engine_keys

ROWS = pa.table(
    {
        "key": pa.array(["a", "b", None], pa.string()),
        "value": pa.array([b"1", b"2", b"x"], pa.binary()),
        "entry_id": pa.array([0, 1, 2], pa.int64()),
    }
)
MORE = pa.table(
    {
        "key": pa.array(["c"], pa.string()),
        "value": pa.array([b"3"], pa.binary()),
        "entry_id": pa.array([3], pa.int64()),
    }
)


def make_table(server: Server, tenant: str, namespace: str, name: str) -> tuple[int, int]:
    """A table of two snapshots (ROWS, then MORE appended) where the service keeps its
    tables, and its catalog row; the two snapshots' ids."""
    root = server.ledger_root()
    location = str(root / "tables" / tenant / namespace / name)
    props = file_io_properties(root.storage, engine_keys())
    scratch = SqlCatalog("scratch", uri="sqlite:///:memory:", warehouse=location, **props)
    scratch.create_namespace("n")
    table = scratch.create_table(("n", name), ROWS.schema, location=location)
    table.append(ROWS)
    first = table.current_snapshot()
    table.append(MORE)
    table = scratch.load_table(("n", name))
    last = table.current_snapshot()
    assert first is not None and last is not None
    db = Database(server.database_url())
    try:
        with db.session() as s:
            s.add(
                TopicTable(
                    tenant=tenant,
                    namespace=namespace,
                    name=name,
                    metadata_location=table.metadata_location.removeprefix("file://"),
                    version=1,
                    created_at=0,
                    updated_at=0,
                )
            )
    finally:
        db.dispose()
    return first.snapshot_id, last.snapshot_id
