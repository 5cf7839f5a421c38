"""Consumers against a real server: at-least-once across a consumer crash and a server restart."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e

ADMIN = "/admin/v2/persistent/public/default/jobs"
TOPIC = "/topics/persistent/public/default/jobs"
CONSUMERS = f"{TOPIC}/subscription/workers/consumers"


def test_unacked_messages_are_redelivered_after_consumer_crash_and_server_restart(
    server_factory, tmp_path: Path
) -> None:
    srv = server_factory(tmp_path / "data", env={"COMPACTOR_MAX_ENTRIES_PER_LEDGER": "25"})
    srv.start()
    c = httpx.Client(base_url=srv.url, timeout=30)
    assert c.put(ADMIN).status_code == 204
    assert c.put(f"{ADMIN}/subscription/workers", params={"initialPosition": "earliest"}).status_code == 204
    msgs = [{"key": f"job-{i}", "value": base64.b64encode(b"%d" % i).decode()} for i in range(60)]
    all_ids = c.post(TOPIC, json={"messages": msgs}).json()["messageIds"]

    cid = c.post(CONSUMERS, json={}).json()["consumerId"]
    first = c.post(f"{CONSUMERS}/{cid}/receive", json={"maxMessages": 30}).json()["messages"]
    acked = [m["messageId"] for m in first[:10]] + [m["messageId"] for m in first[15:20]]
    assert c.post(f"{CONSUMERS}/{cid}/ack", json={"messageIds": acked}).status_code == 204
    # The consumer dies mid-batch (its other 15 messages unacknowledged), then the server is killed.
    srv.kill()
    srv.start()

    c = httpx.Client(base_url=srv.url, timeout=30)
    cid = c.post(CONSUMERS, json={}).json()["consumerId"]
    seen: list[str] = []
    while batch := c.post(f"{CONSUMERS}/{cid}/receive", json={"maxMessages": 7}).json()["messages"]:
        seen.extend(m["messageId"] for m in batch)
        c.post(f"{CONSUMERS}/{cid}/ack", json={"messageIds": [m["messageId"] for m in batch]})
    assert seen == [i for i in all_ids if i not in acked]
    stats = c.get(f"{ADMIN}/stats").json()["subscriptions"]["workers"]
    assert stats["msgBacklog"] == 0 and stats["markDeletePosition"] == all_ids[-1]


def test_second_consumer_is_refused_while_the_first_is_active(server) -> None:
    c = httpx.Client(base_url=server.url, timeout=30)
    assert c.put(ADMIN).status_code == 204
    assert c.put(f"{ADMIN}/subscription/workers").status_code == 204
    first = c.post(CONSUMERS, json={"consumerName": "a", "readCompacted": True})
    assert first.status_code == 200 and first.json()["readCompacted"] is True
    second = c.post(CONSUMERS, json={"consumerName": "b"})
    assert second.status_code == 409 and "exclusive" in second.json()["reason"]
    assert c.delete(f"{CONSUMERS}/{first.json()['consumerId']}").status_code == 204
    assert c.post(CONSUMERS, json={"consumerName": "b"}).status_code == 200
