"""Topic termination and backlog quotas over REST, at Pulsar's admin paths: what Go's
pulsaradmin and Java's admin client send and parse, bad input refused with a reason and
nothing changed, and the effects a REST producer sees."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from service.settings import Settings

ADMIN = "/admin/v2/persistent/t/ns"
PRODUCE = "/topics/persistent/t/ns"
NS = "/admin/v2/namespaces/t/ns"


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    settings.backlog_quota_check_interval_in_seconds = 0.1
    with TestClient(create_app(settings)) as c:
        assert c.put("/admin/v2/tenants/t").status_code == 204
        assert c.put(NS).status_code == 204
        yield c


def produce(client: TestClient, topic: str, n: int = 1, size: int = 10) -> object:
    value = base64.b64encode(b"x" * size).decode()
    return client.post(
        f"{PRODUCE}/{topic}", json={"messages": [{"key": f"k{i}", "value": value} for i in range(n)]}
    )


def test_terminate_answers_the_last_id_and_the_topic_takes_no_more_writes(client: TestClient) -> None:
    assert client.put(f"{ADMIN}/ended").status_code == 204
    ids = produce(client, "ended", 3).json()["messageIds"]  # type: ignore[attr-defined]
    r = client.post(f"{ADMIN}/ended/terminate")
    assert r.status_code == 200, r.text
    ledger, entry = (int(x) for x in ids[-1].split(":"))
    assert r.json() == {
        "ledgerId": ledger,
        "entryId": entry,
        "partitionIndex": -1,
        "batchIndex": -1,
        "batchSize": 0,
    }
    assert client.post(f"{ADMIN}/ended/terminate").json() == r.json()  # again: the same id
    refused = produce(client, "ended")
    assert refused.status_code == 409 and "terminated" in refused.json()["reason"]  # type: ignore[attr-defined]
    page = client.get(f"{PRODUCE}/ended/messages", params={"startMessageId": "earliest"}).json()
    assert [m["messageId"] for m in page["messages"]] == ids  # reads go on
    assert client.get(f"{ADMIN}/ended/internalStats").json()["state"] == "Terminated"
    assert client.get(f"{ADMIN}/other-topic/internalStats").status_code == 404


def test_an_open_topic_shows_its_state_and_an_unknown_one_is_404(client: TestClient) -> None:
    assert client.put(f"{ADMIN}/open").status_code == 204
    assert client.get(f"{ADMIN}/open/internalStats").json()["state"] == "LedgerOpened"
    r = client.post(f"{ADMIN}/nosuch/terminate")
    assert r.status_code == 404 and r.json()["reason"]


def test_a_partitioned_topic_terminates_by_its_partitions(client: TestClient) -> None:
    assert client.put(f"{ADMIN}/parted/partitions", json=2).status_code == 204
    whole = client.post(f"{ADMIN}/parted/terminate")
    assert whole.status_code == 405 and "partitioned" in whole.json()["reason"]
    r = client.post(f"{ADMIN}/parted/terminate/partitions")
    assert r.status_code == 200, r.text
    assert sorted(r.json()) == ["0", "1"] and all(v["entryId"] == -1 for v in r.json().values())
    assert produce(client, "parted").status_code == 409
    assert client.post(f"{ADMIN}/plain-nosuch/terminate/partitions").status_code == 404


def test_namespace_backlog_quotas_as_pulsars_admin_clients_call_them(client: TestClient) -> None:
    assert client.get(f"{NS}/backlogQuotaMap").json() == {}
    body = {"limitSize": 1000, "limitTime": -1, "policy": "producer_exception"}
    assert client.post(f"{NS}/backlogQuota", json=body).status_code == 204
    age = {"limitSize": -1, "limitTime": 60, "policy": "consumer_backlog_eviction"}
    r = client.post(f"{NS}/backlogQuota", params={"backlogQuotaType": "message_age"}, json=age)
    assert r.status_code == 204
    assert client.get(f"{NS}/backlogQuotaMap").json() == {
        "destination_storage": {"limit": 1000, **body},
        "message_age": {"limit": -1, **age},
    }
    assert (
        client.delete(f"{NS}/backlogQuota", params={"backlogQuotaType": "destination_storage"}).status_code
        == 204
    )
    assert list(client.get(f"{NS}/backlogQuotaMap").json()) == ["message_age"]
    assert client.get("/admin/v2/namespaces/t/nope/backlogQuotaMap").status_code == 404


@pytest.mark.parametrize(
    ("params", "body", "word"),
    [
        ({}, {"limitSize": 10, "policy": "drop_it"}, "policy"),
        ({}, {"limitSize": -5, "policy": "producer_exception"}, "limitSize"),
        ({}, {"limitTime": -7, "policy": "producer_exception"}, "limitTime"),
        ({"backlogQuotaType": "disk"}, {"limitSize": 10, "policy": "producer_exception"}, "backlogQuotaType"),
        ({}, "lots", "dictionary"),
        ({}, {"limitSize": 10, "policy": "producer_exception", "extra": 1}, "extra"),
    ],
)
def test_bad_quotas_are_refused_with_a_reason_and_change_nothing(
    client: TestClient, params: dict[str, str], body: object, word: str
) -> None:
    good = {"limitSize": 1, "limitTime": -1, "policy": "producer_request_hold"}
    assert client.put(f"{ADMIN}/q").status_code == 204
    assert client.post(f"{ADMIN}/q/backlogQuota", json=good).status_code == 204
    for path in (f"{NS}/backlogQuota", f"{ADMIN}/q/backlogQuota"):
        r = client.post(path, params=params, json=body)
        assert r.status_code == 422 and word in r.json()["reason"], r.text
    assert client.get(f"{NS}/backlogQuotaMap").json() == {}
    assert client.get(f"{ADMIN}/q/backlogQuotaMap").json() == {"destination_storage": {"limit": 1, **good}}


def test_topic_quota_over_namespace_over_default_and_unknown_topic(client: TestClient) -> None:
    assert client.put(f"{ADMIN}/q").status_code == 204
    applied = client.get(f"{ADMIN}/q/backlogQuotaMap", params={"applied": "true"}).json()
    assert applied["destination_storage"]["limitSize"] == -1  # no default quota unless set
    ns = {"limitSize": 500, "limitTime": -1, "policy": "producer_request_hold"}
    assert client.post(f"{NS}/backlogQuota", json=ns).status_code == 204
    applied = client.get(f"{ADMIN}/q/backlogQuotaMap", params={"applied": "true"}).json()
    assert applied["destination_storage"]["limitSize"] == 500
    mine = {"limitSize": 50, "limitTime": -1, "policy": "producer_exception"}
    assert client.post(f"{ADMIN}/q/backlogQuota", json=mine).status_code == 204
    applied = client.get(f"{ADMIN}/q/backlogQuotaMap", params={"applied": "true"}).json()
    assert applied["destination_storage"]["policy"] == "producer_exception"
    stats = client.get(f"{ADMIN}/q/stats").json()  # the limits in force, as Pulsar's stats name them
    assert (stats["backlogQuotaLimitSize"], stats["backlogQuotaLimitTime"]) == (50, -1)
    assert client.delete(f"{ADMIN}/q/backlogQuota").status_code == 204
    assert client.get(f"{ADMIN}/q/backlogQuotaMap").json() == {}
    assert client.post(f"{ADMIN}/nosuch/backlogQuota", json=mine).status_code == 404


def _until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


@pytest.mark.parametrize(("policy", "status"), [("producer_exception", 409), ("producer_request_hold", 503)])
def test_over_a_producer_quota_rest_producers_are_refused_until_consumers_catch_up(
    client: TestClient, policy: str, status: int
) -> None:
    assert client.put(f"{ADMIN}/busy").status_code == 204
    assert (
        client.put(f"{ADMIN}/busy/subscription/slow", params={"initialPosition": "earliest"}).status_code
        == 204
    )
    body = {"limitSize": 100, "limitTime": -1, "policy": policy}
    assert client.post(f"{ADMIN}/busy/backlogQuota", json=body).status_code == 204
    assert produce(client, "busy", 5, size=100).status_code == 200  # over it now; checked soon
    _until(lambda: produce(client, "busy").status_code == status)
    refused = produce(client, "busy")
    assert "backlog quota" in refused.json()["reason"]  # type: ignore[attr-defined]
    if status == 503:
        assert refused.headers["retry-after"]  # type: ignore[attr-defined]
    # The subscription skips its backlog: the next check lets producers in again.
    r = client.post(f"{ADMIN}/busy/subscription/slow/resetcursor", json={"messageId": "latest"})
    assert r.status_code == 204, r.text
    _until(lambda: produce(client, "busy").status_code == 200)


def test_eviction_moves_a_slow_subscription_forward(client: TestClient) -> None:
    assert client.put(f"{ADMIN}/evict").status_code == 204
    assert (
        client.put(f"{ADMIN}/evict/subscription/slow", params={"initialPosition": "earliest"}).status_code
        == 204
    )
    body = {"limitSize": 1000, "limitTime": -1, "policy": "consumer_backlog_eviction"}
    assert client.post(f"{ADMIN}/evict/backlogQuota", json=body).status_code == 204
    assert produce(client, "evict", 20, size=100).status_code == 200

    def backlog() -> int:
        return client.get(f"{ADMIN}/evict/stats").json()["subscriptions"]["slow"]["backlogSize"]  # type: ignore[no-any-return]

    _until(lambda: backlog() <= 1000)
    assert backlog() > 0  # the newest messages stay
    assert produce(client, "evict").status_code == 200  # eviction never refuses producers
