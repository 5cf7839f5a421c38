"""Policy documents over REST: levels, applied values, invalid values refused whole, run history."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

TOPIC = "/admin/v2/persistent/t/ns/orders"
NS = "/admin/v2/namespaces/t/ns"


@pytest.fixture
def client(client: TestClient) -> TestClient:
    assert client.put(TOPIC).status_code == 204
    return client


def test_topic_over_namespace_over_default(client: TestClient) -> None:
    applied = client.get(f"{TOPIC}/compactionPolicy", params={"applied": "true"}).json()
    assert applied["compactionThreshold"] == 0 and applied["compactionStrategy"] == "offset"
    r = client.post(
        f"{NS}/compactionPolicy", json={"compactionThreshold": 500, "minCleanableDirtyRatio": 0.5}
    )
    assert r.status_code == 200 and r.json()["compactionThreshold"] == 500
    client.post(
        f"{TOPIC}/compactionPolicy", json={"compactionThreshold": 5, "compactionStrategy": "property:v"}
    )
    applied = client.get(f"{TOPIC}/compactionPolicy", params={"applied": "true"}).json()
    assert applied["compactionThreshold"] == 5 and applied["minCleanableDirtyRatio"] == 0.5
    assert applied["compactionStrategy"] == "property:v"
    assert client.get(f"{TOPIC}/compactionThreshold", params={"applied": "true"}).json() == 5
    # A field sent as null is unset at that level: the topic falls back to the namespace.
    client.post(f"{TOPIC}/compactionPolicy", json={"compactionThreshold": None})
    assert client.get(f"{TOPIC}/compactionThreshold", params={"applied": "true"}).json() == 500
    assert client.delete(f"{TOPIC}/compactionPolicy").status_code == 204
    assert client.get(f"{TOPIC}/compactionPolicy").json()["compactionStrategy"] is None
    assert client.delete(f"{NS}/compactionPolicy").status_code == 204
    assert client.get(f"{TOPIC}/compactionThreshold", params={"applied": "true"}).json() == 0


def test_deduplication_at_pulsars_paths_topic_over_namespace_over_default(client: TestClient) -> None:
    # Off by default (Pulsar's brokerDeduplicationEnabled); unset at both levels.
    assert client.get(f"{TOPIC}/deduplicationEnabled", params={"applied": "true"}).json() is False
    assert client.get(f"{NS}/deduplication").json() is None
    assert client.post(f"{NS}/deduplication", json=True).status_code == 204
    assert client.get(f"{NS}/deduplication").json() is True
    assert client.get(f"{TOPIC}/deduplicationEnabled").json() is None
    assert client.get(f"{TOPIC}/deduplicationEnabled", params={"applied": "true"}).json() is True
    assert client.post(f"{TOPIC}/deduplicationEnabled", json=False).status_code == 204
    assert client.get(f"{TOPIC}/deduplicationEnabled", params={"applied": "true"}).json() is False
    assert client.get(f"{TOPIC}/compactionPolicy").json()["deduplicationEnabled"] is False
    assert client.delete(f"{TOPIC}/deduplicationEnabled").status_code == 204
    assert client.get(f"{TOPIC}/deduplicationEnabled", params={"applied": "true"}).json() is True
    assert client.delete(f"{NS}/deduplication").status_code == 204
    assert client.get(f"{NS}/deduplication").json() is None
    # Not a boolean: 400 with a reason, nothing changed.
    for path in (f"{TOPIC}/deduplicationEnabled", f"{NS}/deduplication"):
        r = client.post(path, json="yes")
        assert r.status_code == 400 and "deduplicationEnabled" in r.json()["reason"], r.text
    assert client.get(f"{TOPIC}/deduplicationEnabled", params={"applied": "true"}).json() is False
    assert client.post("/admin/v2/persistent/t/ns/nothere/deduplicationEnabled", json=True).status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {"deduplicationEnabled": "on"},
        {"compactionThreshold": -1},
        {"minCleanableDirtyRatio": 1.01},
        {"minCleanableDirtyRatio": -0.1},
        {"compactionStrategy": "largest"},
        {"compactionStrategy": "property:"},
        {"maxCompactionLagMs": "1h"},
        {"retainNullKey": 1},
        {"retentionSizeBytes": 1.5},
        {"noSuchField": 1},
        {"compactionThreshold": 10, "deleteRetentionMs": -5},  # one bad field: nothing is set
    ],
)
def test_invalid_values_get_400_and_change_nothing(client: TestClient, body: dict) -> None:
    before = client.get(f"{TOPIC}/compactionPolicy").json()
    for path in (f"{TOPIC}/compactionPolicy", f"{NS}/compactionPolicy"):
        r = client.post(path, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["reason"]
    assert client.get(f"{TOPIC}/compactionPolicy").json() == before
    assert client.get(f"{NS}/compactionPolicy").json()["compactionThreshold"] is None


def test_policy_of_unknown_topic_is_404_and_body_must_be_an_object(client: TestClient) -> None:
    assert client.get("/admin/v2/persistent/t/ns/missing/compactionPolicy").status_code == 404
    assert client.post(f"{TOPIC}/compactionPolicy", json=[1, 2]).status_code == 422


@pytest.mark.spark
def test_run_history(client: TestClient, spark) -> None:
    client.post("/topics/persistent/t/ns/orders", json={"messages": [{"key": "a", "value": "AA=="}] * 3})
    assert client.put(f"{TOPIC}/compaction").status_code == 204
    client.app.state.compaction.wait(_name(), timeout=120)
    runs = client.get(f"{TOPIC}/compactionRuns").json()
    assert len(runs) == 1
    run = runs[0]
    assert run["trigger"] == "manual" and run["status"] == "SUCCESS" and run["horizon"] is not None
    assert run["entriesRead"] == 3 and run["recordsKept"] == 1 and run["recordsRemoved"] == 2
    assert run["bytesIn"] > 0 and run["bytesOut"] > 0 and run["durationMs"] >= 0
    assert client.get(f"{TOPIC}/compactionRuns", params={"limit": 0}).status_code == 422


def _name():
    from service.names import TopicName

    return TopicName("t", "ns", "orders")
