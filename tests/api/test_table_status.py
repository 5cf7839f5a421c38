"""A topic's Iceberg table in its compaction status and the metrics, against a real server
(issue 52): committed rounds show no lag; a failed table commit leaves the round SUCCESS and
shows in ``table.lagRounds``/``table.lastError`` and ``pulsar_compaction_table_lag_rounds``;
the next round catches up; a topic whose policy asks for no table has no ``table``."""

from __future__ import annotations

import httpx
import pytest

from api.client import Client, MessageId
from tests.conftest import Server

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

NS = "/admin/v2/namespaces/public/default"
TOPIC = "persistent://public/default/prices"
ADMIN = "/admin/v2/persistent/public/default/prices"


def compacted(c: Client, http: httpx.Client, topic: str, admin: str) -> dict:  # type: ignore[type-arg]
    c.admin.topics.compact(topic)
    assert c.admin.topics.wait_for_compaction(topic, timeout=180).status == "SUCCESS"
    body = http.get(f"{admin}/compaction").json()
    assert body["status"] == "SUCCESS"
    return body  # type: ignore[no-any-return]


def metric(http: httpx.Client, name: str, topic: str) -> float | None:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and f'topic="{topic}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def table_files(server: Server, name: str) -> list[str]:
    """The files of the server's table ``public/default/{name}``, wherever its ledgers are."""
    where = server.ledger_root() / "tables" / "public" / "default" / name
    return [f.key for f in where.storage.list(where.key)]


def test_table_status_and_metrics(server: Server) -> None:
    http = httpx.Client(base_url=server.url, timeout=30)
    # The failing commit below is made by a file where the table's directory goes: local disk only.
    on_disk = server.ledger_root().storage.local
    with Client(server.url) as c:
        # No table asked for: no ``table`` in the status.
        c.admin.topics.create("persistent://public/default/plain")
        c.create_producer("persistent://public/default/plain").send_many([("k", b"v")])
        plain = compacted(
            c, http, "persistent://public/default/plain", "/admin/v2/persistent/public/default/plain"
        )
        assert "table" not in plain

        assert http.post(f"{NS}/compactionPolicy", json={"table": True}).status_code == 200
        c.admin.topics.create(TOPIC)
        c.create_producer(TOPIC).send_many([("a", b"1"), ("b", b"1")])
        table = compacted(c, http, TOPIC, ADMIN)["table"]
        assert table["enabled"] is True and table["lagRounds"] == 0 and table.get("lastError") is None
        first = table["snapshotId"]
        assert isinstance(first, int)
        assert metric(http, "pulsar_compaction_table_lag_rounds", TOPIC) == 0
        # The same through the Python client.
        status = c.admin.topics.compaction_status(TOPIC).table
        assert (
            status is not None and status.enabled and status.snapshot_id == first and status.lag_rounds == 0
        )

        if on_disk:
            # A file where the table's directory is: its commits fail.
            table_dir = server.data_dir / "tables" / "public" / "default" / "prices"
            aside = table_dir.with_name("prices.aside")
            table_dir.rename(aside)
            table_dir.write_bytes(b"")
            c.create_producer(TOPIC).send_many([("a", b"2")])
            table = compacted(c, http, TOPIC, ADMIN)["table"]
            assert table["lagRounds"] == 1 and table["snapshotId"] == first
            assert table["lastError"] and "\n" not in table["lastError"]
            assert metric(http, "pulsar_compaction_table_lag_rounds", TOPIC) == 1
            assert metric(http, "pulsar_compaction_table_commit_failed_total", TOPIC) == 1
            # readCompacted is the new round's view.
            with c.create_reader(TOPIC, MessageId.earliest, read_compacted=True) as reader:
                got = []
                while reader.has_message_available():
                    m = reader.read_next(timeout_millis=10_000)
                    got.append((m.key(), m.value()))
            assert got == [("b", b"1"), ("a", b"2")]

            table_dir.unlink()
            aside.rename(table_dir)
            c.create_producer(TOPIC).send_many([("c", b"1")])
            table = compacted(c, http, TOPIC, ADMIN)["table"]
            assert table["lagRounds"] == 0 and table.get("lastError") is None and table["snapshotId"] != first
            assert metric(http, "pulsar_compaction_table_lag_rounds", TOPIC) == 0

        # Deleted with its topic.
        assert table_files(server, "prices")
        assert http.delete(ADMIN).status_code == 204
        assert not table_files(server, "prices")

        # A partitioned topic: one table, its status over the partitions, dropped with it.
        orders = "/admin/v2/persistent/public/default/orders"
        assert http.put(f"{orders}/partitions", json=2).status_code == 204
        for i in range(2):
            c.create_producer(f"persistent://public/default/orders-partition-{i}").send_many(
                [(f"k{i}", b"v")]
            )
        body = compacted(c, http, "persistent://public/default/orders", orders)
        assert body["partitions"] == {"orders-partition-0": "SUCCESS", "orders-partition-1": "SUCCESS"}
        assert body["table"]["lagRounds"] == 0 and isinstance(body["table"]["snapshotId"], int)
        assert table_files(server, "orders")
        assert http.delete(f"{orders}/partitions").status_code == 204
        assert not table_files(server, "orders")
