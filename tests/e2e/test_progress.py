"""A running compaction's ``progress`` in ``GET .../compaction`` of a real server."""

from __future__ import annotations

import base64
import uuid

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

FIELDS = {
    "phase",
    "entriesRead",
    "entriesTotal",
    "bytesRead",
    "bytesTotal",
    "percent",
    "startedAt",
    "elapsedMs",
}


def test_progress_while_running_and_throughput_in_the_history(shared_server) -> None:
    topic = f"public/default/progress-{uuid.uuid4().hex[:8]}"
    admin = f"/admin/v2/persistent/{topic}"
    c = httpx.Client(base_url=shared_server.url, timeout=30)
    assert c.put(admin).status_code == 204
    value = base64.b64encode(b"v" * 30).decode()
    for _ in range(5):
        msgs = [{"key": f"k{i % 300}", "value": value} for i in range(1000)]
        assert c.post(f"/topics/persistent/{topic}", json={"messages": msgs}).status_code == 200
    assert "progress" not in c.get(f"{admin}/compaction").json()  # NOT_RUN

    assert c.put(f"{admin}/compaction").status_code == 204
    seen = []
    while (body := c.get(f"{admin}/compaction").json())["status"] == "RUNNING":
        seen.append(body["progress"])
    assert body["status"] == "SUCCESS" and "progress" not in body
    assert seen, "the round was never seen RUNNING"
    assert all(set(p) == FIELDS for p in seen)
    assert {p["phase"] for p in seen} <= {"phase-one", "phase-two", "commit"}
    percents = [p["percent"] for p in seen]
    assert percents == sorted(percents) and all(0 <= x <= 100 for x in percents)
    elapsed = [p["elapsedMs"] for p in seen]
    assert elapsed == sorted(elapsed)
    assert len({p["startedAt"] for p in seen}) == 1
    with_totals = [p for p in seen if p["entriesTotal"]]
    assert with_totals and all(p["entriesTotal"] == 5000 for p in with_totals)
    assert all(p["entriesRead"] <= p["entriesTotal"] and p["bytesRead"] <= p["bytesTotal"] for p in seen)

    run = c.get(f"{admin}/compactionRuns").json()[0]
    assert run["durationMs"] >= 0 and run["phaseOneMs"] is not None and run["phaseTwoMs"] is not None
    assert run["readThroughput"] == round(run["bytesIn"] * 1000 / max(1, run["durationMs"]), 1)
    assert run["writeThroughput"] > 0
