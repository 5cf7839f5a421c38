"""The service as a user runs it: ``compactor serve``, curl, SIGKILL, restart."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import local_wal_only

pytestmark = pytest.mark.e2e

TOPIC = "/admin/v2/persistent/public/default/orders"
PRODUCE = "/topics/persistent/public/default/orders"


def curl(*args: str) -> tuple[int, str]:
    out = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    body, _, code = out.rpartition("\n")
    return int(code), body


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def read_all(url: str, start: str = "earliest", page: int = 7) -> list[dict]:
    out: list[dict] = []
    while True:
        r = httpx.get(f"{url}{PRODUCE}/messages", params={"startMessageId": start, "maxMessages": page})
        r.raise_for_status()
        body = r.json()
        out.extend(body["messages"])
        if not body["messages"]:
            return out
        start = body["nextMessageId"]


def test_curl_create_produce_read_in_order(server) -> None:
    code, _ = curl("-X", "PUT", server.url + TOPIC)
    assert code == 204
    code, body = curl(server.url + "/admin/v2/persistent/public/default")
    assert code == 200 and json.loads(body) == ["persistent://public/default/orders"]

    msgs = [{"key": f"k{i}", "value": b64(f"v{i}"), "properties": {"n": str(i)}} for i in range(5)]
    msgs.append({"key": "k0", "value": None})
    code, body = curl(
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps({"messages": msgs}),
        server.url + PRODUCE,
    )
    assert code == 200
    ids = json.loads(body)["messageIds"]
    assert len(ids) == 6 and len(set(ids)) == 6

    code, body = curl(f"{server.url}{PRODUCE}/messages?startMessageId=earliest&maxMessages=100")
    assert code == 200
    got = json.loads(body)["messages"]
    assert [m["messageId"] for m in got] == ids
    assert [m["key"] for m in got] == [m["key"] for m in msgs]
    assert [m["value"] for m in got] == [m["value"] for m in msgs]
    assert got[1]["properties"] == {"n": "1"}
    assert all(m["publishTime"] > 0 for m in got)

    # Starting from an id in the middle is inclusive.
    code, body = curl(f"{server.url}{PRODUCE}/messages?startMessageId={ids[3]}&maxMessages=2")
    assert [m["messageId"] for m in json.loads(body)["messages"]] == ids[3:5]


def test_acknowledged_messages_survive_sigkill_and_restart(server_factory, tmp_path: Path) -> None:
    # Small ledgers so that the kill finds sealed ledgers and an open one with entries.
    srv = server_factory(tmp_path / "data", env={"COMPACTOR_MAX_ENTRIES_PER_LEDGER": "40"})
    srv.start()
    assert httpx.put(srv.url + TOPIC).status_code == 204
    acked: list[tuple[str, str]] = []
    with httpx.Client(base_url=srv.url) as c:
        for batch in range(13):
            msgs = [{"key": f"k{batch}-{i}", "value": b64(f"{batch}-{i}")} for i in range(9)]
            r = c.post(PRODUCE, json={"messages": msgs})
            assert r.status_code == 200
            acked.extend(zip(r.json()["messageIds"], [m["value"] for m in msgs], strict=True))
    srv.kill()

    srv.start()
    got = read_all(srv.url)
    assert [(m["messageId"], m["value"]) for m in got] == acked
    ledgers = httpx.get(srv.url + TOPIC + "/internalStats").json()["ledgers"]
    assert len(ledgers) >= 3 and ledgers[-1]["state"] == "OPEN"

    # The log goes on after recovery: the next id follows the last acknowledged one.
    r = httpx.post(srv.url + PRODUCE, json={"messages": [{"key": "after", "value": b64("x")}]})
    assert r.status_code == 200
    assert read_all(srv.url)[-1]["key"] == "after"


@local_wal_only("a torn tail of a local write-ahead file")
def test_torn_write_ahead_tail_recovers_after_kill(server_factory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = server_factory(data)
    srv.start()
    assert httpx.put(srv.url + TOPIC).status_code == 204
    r = httpx.post(
        srv.url + PRODUCE, json={"messages": [{"key": f"k{i}", "value": b64(str(i))} for i in range(10)]}
    )
    ids = r.json()["messageIds"]
    srv.kill()

    # A crash mid-write: half a frame of garbage after the last whole record.
    wal = next((data / "ledgers" / "public" / "default" / "orders").glob("*.wal"))
    with open(wal, "ab") as f:
        f.write(b"\x40\x00\x00\x00\xde\xad\xbe\xefpartial-record")
    srv.start()
    assert [m["messageId"] for m in read_all(srv.url)] == ids
    assert list(wal.parent.glob("*.quarantine*")), "the torn bytes are kept aside"
    r = httpx.post(srv.url + PRODUCE, json={"messages": [{"key": "next", "value": b64("n")}]})
    assert r.status_code == 200
    srv.kill()
    srv.start()
    got = read_all(srv.url)
    assert [m["key"] for m in got] == [f"k{i}" for i in range(10)] + ["next"]


@pytest.mark.parametrize(
    "path",
    [
        "/admin/v2/persistent/public/default/..",
        "/admin/v2/persistent/public/../orders",
        "/admin/v2/persistent/public/default/%2E%2E",
        "/admin/v2/persistent/public/default/a%2Fb",
        "/topics/persistent/public/default/../messages",
    ],
)
def test_path_traversal_in_a_name_is_refused(server, path: str) -> None:
    code, body = curl("--path-as-is", "-X", "PUT", server.url + path)
    assert code == 400, body
    assert "invalid" in json.loads(body)["reason"]
    assert not (server.data_dir / "ledgers").exists() or not any((server.data_dir / "ledgers").rglob("*.wal"))


@pytest.mark.spark
def test_compaction_through_the_running_service(shared_server) -> None:
    server = shared_server
    topic = "/admin/v2/persistent/e2e/default/orders"
    produce = "/topics/persistent/e2e/default/orders"

    assert httpx.put(server.url + topic).status_code == 204
    msgs = [{"key": f"k{i % 3}", "value": b64(f"v{i}")} for i in range(9)] + [{"key": "k1", "value": None}]
    assert httpx.post(server.url + produce, json={"messages": msgs}).status_code == 200
    code, _ = curl("-X", "PUT", server.url + topic + "/compaction")
    assert code == 204
    deadline = time.monotonic() + 180
    while (status := httpx.get(server.url + topic + "/compaction").json())["status"] == "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert status == {"status": "SUCCESS", "lastError": None}
    r = httpx.get(f"{server.url}{produce}/messages", params={"readCompacted": "true"})
    # In message-id order: k0's latest is entry 6, k2's is entry 8; k1 was deleted.
    assert [(m["key"], m["value"]) for m in r.json()["messages"]] == [("k0", b64("v6")), ("k2", b64("v8"))]
