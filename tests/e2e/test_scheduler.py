"""Automatic compaction in a running service, and stopping it in the middle of a round."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

ADMIN = "/admin/v2/persistent/public/default/state"
TOPIC = "/topics/persistent/public/default/state"


def wait_for(predicate, timeout: float = 180, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(interval)


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_stopping_during_a_scheduled_compaction_recovers_and_completes(
    server_factory, tmp_path: Path, how
) -> None:
    env = {"COMPACTOR_COMPACTION_MONITOR_INTERVAL_SECONDS": "0.3", "COMPACTOR_COMPACTION_THRESHOLD": "100"}
    srv = server_factory(tmp_path / "data", env=env)
    srv.start()
    c = httpx.Client(base_url=srv.url, timeout=30)
    assert c.put(ADMIN).status_code == 204
    msgs = [{"key": f"k{i % 10}", "value": base64.b64encode(b"%d" % i).decode()} for i in range(50)]
    assert c.post(TOPIC, json={"messages": msgs}).status_code == 200
    # No REST call: the scheduler starts the round. Stop the service while it runs (the first
    # round also starts Spark, so there is time to catch it RUNNING).
    wait_for(lambda: c.get(f"{ADMIN}/compaction").json()["status"] == "RUNNING", interval=0.05)
    srv.kill() if how == "kill" else srv.stop()

    srv.start()
    c = httpx.Client(base_url=srv.url, timeout=30)
    wait_for(lambda: c.get(f"{ADMIN}/compaction").json()["status"] == "SUCCESS")
    runs = c.get(f"{ADMIN}/compactionRuns").json()
    assert runs[0]["status"] == "SUCCESS" and runs[0]["trigger"] == "threshold"
    if how == "kill":
        assert runs[-1]["status"] == "ERROR" and "interrupted" in runs[-1]["error"]
    got = c.get(f"{TOPIC}/messages", params={"readCompacted": "true", "maxMessages": 100}).json()["messages"]
    assert sorted((m["key"], m["value"]) for m in got) == sorted(
        (f"k{i}", base64.b64encode(b"%d" % (40 + i)).decode()) for i in range(10)
    )
    stats = c.get(f"{ADMIN}/internalStats").json()
    root = srv.ledger_root() / "ledgers/public/default/state"
    assert sorted(p.name for p in root.dirs() if p.name.startswith("compacted-")) == [
        f"compacted-{stats['compactedLedger']['ledgerId']:020d}"
    ]
    assert len(c.get(f"{TOPIC}/messages", params={"maxMessages": 100}).json()["messages"]) == 50
    if how == "kill":  # the round after the restart was the scheduler's: in the metrics, by its rule
        assert 'compactor_scheduler_decisions_total{trigger="threshold"} 1.0' in c.get("/metrics").text
