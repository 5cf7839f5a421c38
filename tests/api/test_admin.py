"""Compaction over REST: trigger, status, conflicts, internalStats, readCompacted reads."""

from __future__ import annotations

import base64
import threading
import time

import pytest
from fastapi.testclient import TestClient

pytestmark = pytest.mark.spark

ADMIN = "/admin/v2/persistent/t/ns"
TOPICS = "/topics/persistent/t/ns"


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def wait_status(client: TestClient, topic: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(f"{ADMIN}/{topic}/compaction").json()
        if body["status"] != "RUNNING" or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


@pytest.fixture
def client(client: TestClient, spark) -> TestClient:
    # The app reuses the test session's SparkSession (one per process).
    assert client.put(f"{ADMIN}/prices").status_code == 204
    msgs = [
        {"key": "a", "value": b64(b"1")},
        {"key": "b", "value": b64(b"2")},
        {"key": "a", "value": b64(b"3")},
    ]
    assert client.post(f"{TOPICS}/prices", json={"messages": msgs}).status_code == 200
    return client


def test_trigger_then_status_then_read_compacted(client: TestClient) -> None:
    assert client.get(f"{ADMIN}/prices/compaction").json()["status"] == "NOT_RUN"
    stats = client.get(f"{ADMIN}/prices/internalStats").json()
    assert stats["compactedLedger"] == {
        "ledgerId": -1,
        "entries": -1,
        "size": -1,
        "offloaded": False,
        "underReplicated": False,
        "checksum": None,
    }

    assert client.put(f"{ADMIN}/prices/compaction").status_code == 204
    assert wait_status(client, "prices") == {"status": "SUCCESS", "lastError": None}

    stats = client.get(f"{ADMIN}/prices/internalStats").json()
    compacted = stats["compactedLedger"]
    assert compacted["entries"] == 2 and compacted["size"] > 0
    cursor = stats["cursors"]["__compaction"]
    assert cursor["properties"] == {"CompactedTopicLedger": compacted["ledgerId"]}
    assert cursor["markDeletePosition"] == stats["horizon"]

    body = client.get(f"{TOPICS}/prices/messages", params={"readCompacted": "true"}).json()
    assert [(m["key"], m["value"]) for m in body["messages"]] == [("b", b64(b"2")), ("a", b64(b"3"))]
    full = client.get(f"{TOPICS}/prices/messages", params={"readCompacted": "false"}).json()
    assert len(full["messages"]) == 3


def test_unknown_topic_is_404_and_running_compaction_is_409(client: TestClient) -> None:
    assert client.put(f"{ADMIN}/nope/compaction").status_code == 404
    assert client.get(f"{ADMIN}/nope/compaction").status_code == 404

    compaction = client.app.state.compaction
    gate = threading.Event()
    compaction.fault_hook = lambda at: gate.wait(60) if at == "phase_one" else None
    try:
        assert client.put(f"{ADMIN}/prices/compaction").status_code == 204
        r = client.put(f"{ADMIN}/prices/compaction")
        assert r.status_code == 409 and "already running" in r.json()["reason"]
        assert client.get(f"{ADMIN}/prices/compaction").json()["status"] == "RUNNING"
        # The topic cannot be deleted under a running compaction either.
        assert client.delete(f"{ADMIN}/prices").status_code == 409
    finally:
        gate.set()
    assert wait_status(client, "prices")["status"] == "SUCCESS"


def test_failed_compaction_reports_error_and_the_next_succeeds(client: TestClient) -> None:
    compaction = client.app.state.compaction

    def fail(at: str) -> None:
        if at == "phase_two":
            raise RuntimeError("disk on fire")

    compaction.fault_hook = fail
    assert client.put(f"{ADMIN}/prices/compaction").status_code == 204
    body = wait_status(client, "prices")
    assert body["status"] == "ERROR" and "disk on fire" in body["lastError"]
    assert client.get(f"{ADMIN}/prices/internalStats").json()["compactedLedger"]["ledgerId"] == -1
    record = client.get(f"{ADMIN}/prices/stats").json()["compaction"]
    failed_at = record["lastCompactionFailedTimestamp"]
    assert failed_at > 0 and record["lastCompactionSucceedTimestamp"] == 0
    compaction.fault_hook = None
    assert client.put(f"{ADMIN}/prices/compaction").status_code == 204
    assert wait_status(client, "prices") == {"status": "SUCCESS", "lastError": None}
    # Pulsar's compaction record: the last success and the last failure, each kept.
    record = client.get(f"{ADMIN}/prices/stats").json()["compaction"]
    assert record["lastCompactionSucceedTimestamp"] >= failed_at == record["lastCompactionFailedTimestamp"]
