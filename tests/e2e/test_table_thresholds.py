"""Tables kept by the rounds the service starts itself (issue 52): with ``COMPACTOR_TABLE_DEFAULT``
on and a compaction threshold, no REST call compacts the topic, and its Iceberg table, read
through the REST catalog by pyiceberg and DuckDB, is the readCompacted view after each round
(deletes included), its previous snapshot the previous round's."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx
import pytest
from pyiceberg.catalog import load_catalog

from tests.iceberg_readers import duckdb_connection

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

ADMIN = "/admin/v2/persistent/public/default/levels"
TOPIC = "/topics/persistent/public/default/levels"


def _status(c: httpx.Client) -> dict:  # type: ignore[type-arg]
    return c.get(f"{ADMIN}/compaction").json()  # type: ignore[no-any-return]


def _committed_after(c: httpx.Client, previous: int | None, timeout: float = 180) -> int:
    """Wait for a threshold round whose table commit made a snapshot other than ``previous``."""
    deadline = time.monotonic() + timeout
    while True:
        st = _status(c)
        table = st.get("table") or {}
        snapshot = table.get("snapshotId")
        if st["status"] == "SUCCESS" and table.get("lagRounds") == 0 and snapshot not in (None, previous):
            return int(snapshot)
        assert time.monotonic() < deadline, st
        time.sleep(0.2)


def _view(c: httpx.Client) -> list[tuple[str, bytes]]:
    got = c.get(f"{TOPIC}/messages", params={"readCompacted": "true", "maxMessages": 1000}).json()["messages"]
    return sorted((m["key"], base64.b64decode(m["value"])) for m in got)


def _send(c: httpx.Client, messages: list[tuple[str, bytes | None]]) -> None:
    body = [{"key": k, "value": None if v is None else base64.b64encode(v).decode()} for k, v in messages]
    assert c.post(TOPIC, json={"messages": body}).status_code == 200


def test_threshold_rounds_commit_the_table_the_view_is(server_factory, tmp_path: Path) -> None:
    env = {
        "COMPACTOR_COMPACTION_MONITOR_INTERVAL_SECONDS": "0.3",
        "COMPACTOR_COMPACTION_THRESHOLD": "100",
        "COMPACTOR_TABLE_DEFAULT": "true",
    }
    srv = server_factory(tmp_path / "data", env=env)
    srv.start()
    c = httpx.Client(base_url=srv.url, timeout=30)
    assert c.put(ADMIN).status_code == 204
    _send(c, [(f"k{i % 10}", b"v%d" % i) for i in range(50)])
    first = _committed_after(c, None)
    runs = c.get(f"{ADMIN}/compactionRuns").json()
    assert runs[0]["trigger"] == "threshold"
    first_view = _view(c)
    assert len(first_view) == 10

    # Deletes (a null value) and updates: past the threshold again, a second round.
    _send(c, [(f"k{i}", None) for i in range(3)] + [(f"k{3 + i % 7}", b"w%d" % i) for i in range(60)])
    second = _committed_after(c, first)
    view = _view(c)
    assert {k for k, _ in view} == {f"k{i}" for i in range(3, 10)}

    catalog = load_catalog("svc", type="rest", uri=f"{srv.url}/iceberg")
    table = catalog.load_table("public.default.levels")
    assert table.current_snapshot().snapshot_id == second  # type: ignore[union-attr]
    rows = table.scan(selected_fields=("key", "value")).to_arrow().to_pylist()
    assert sorted((r["key"], r["value"]) for r in rows) == view
    before = table.scan(selected_fields=("key", "value"), snapshot_id=first).to_arrow().to_pylist()
    assert sorted((r["key"], r["value"]) for r in before) == first_view

    con = duckdb_connection()
    con.execute(f"ATTACH '' AS svc (TYPE iceberg, ENDPOINT '{srv.url}/iceberg', AUTHORIZATION_TYPE 'none')")
    got = con.execute('SELECT key, value FROM svc."public.default".levels').fetchall()
    assert sorted((k, bytes(v)) for k, v in got) == view
