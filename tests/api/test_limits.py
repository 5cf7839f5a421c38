"""503 with Retry-After and a reason, /health degraded while it lasts, and the resource stats."""

from __future__ import annotations

import base64
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from service.settings import Settings

TOPIC = "/admin/v2/persistent/t/ns/limits"
DATA = "/topics/persistent/t/ns/limits"


def batch(n: int) -> dict:
    return {"messages": [{"key": f"k{i}", "value": base64.b64encode(b"v").decode()} for i in range(n)]}


def test_a_full_seal_backlog_answers_503_and_health_says_degraded(settings: Settings) -> None:
    settings.max_entries_per_ledger = 10
    settings.max_pending_seals_per_topic = 1
    settings.max_pending_seals = 1
    settings.seal_wait_ms = 0
    with TestClient(create_app(settings)) as c:
        assert c.get("/health").json()["status"] == "ok"
        assert c.put("/admin/v2/tenants/t").status_code == 204
        assert c.put("/admin/v2/namespaces/t/ns").status_code == 204
        assert c.put(TOPIC).status_code == 204
        ml = c.app.state.broker.topics()[0].ledger
        stalled, entered = threading.Event(), threading.Event()

        def stall(point: str) -> None:
            if point == "sealed":
                entered.set()
                stalled.wait(30)

        ml.fault_hook = stall
        assert c.post(DATA, json=batch(10)).status_code == 200
        assert entered.wait(10)
        r = c.post(DATA, json=batch(10))
        assert r.status_code == 503
        assert r.headers["Retry-After"] == "1"
        assert "sealing closed ledgers more slowly" in r.json()["reason"]
        health = c.get("/health").json()
        assert health["status"] == "degraded" and "seal backlog is full" in health["reason"]
        res = c.get("/admin/v2/broker-stats/resources").json()
        assert res["sealBacklog"]["refusedProducers"] == 1 and res["sealBacklog"]["pending"] == 1
        assert res["openDescriptors"] > 0 and res["descriptorLimit"]["soft"] == res["descriptorLimit"]["hard"]
        assert c.get(f"{TOPIC}/stats").json()["sealBacklog"] == 1
        stalled.set()
        ml.fault_hook = None
        ml.wait_sealed(timeout=30)
        assert c.post(DATA, json=batch(10)).status_code == 200
        got = c.get(f"{DATA}/messages", params={"maxMessages": 100}).json()["messages"]
        assert len(got) == 20


def test_the_client_retries_503_with_back_off_then_raises_unavailable() -> None:
    # The client against a scripted transport: what the server says is fixed, the client's
    # handling of it is under test (the real server's 503s are exercised end to end in
    # tests/e2e/test_descriptor_limits.py).
    from api.client import Client, Unavailable

    answers = [503, 503, 200]
    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the producer's probe of the topic
            return httpx.Response(200, json={"messages": [], "nextMessageId": None})
        seen.append(time.monotonic())
        status = answers.pop(0) if answers else 503
        if status == 503:
            return httpx.Response(503, json={"reason": "seal backlog full"}, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"messageIds": ["1:0"]})

    with Client("http://test", transport=httpx.MockTransport(handler)) as client:
        p = client.create_producer("t/ns/x")
        assert [str(i) for i in p.send_many([("k", b"v")])] == ["1:0"]
        assert len(seen) == 3 and seen[2] - seen[0] >= 0.05 + 0.1  # backed off 50 ms, then 100 ms
    with Client("http://test", transport=httpx.MockTransport(handler), retry_unavailable_s=0) as client:
        p = client.create_producer("t/ns/x")
        with pytest.raises(Unavailable, match="seal backlog full"):
            p.send(b"v")
