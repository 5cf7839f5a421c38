"""Producing and reading over REST, and every bad input getting its 4xx with nothing changed."""

from __future__ import annotations

import base64
import time

import pytest
from fastapi.testclient import TestClient
from pyspark.sql import SparkSession

from api.app import create_app
from compactor.warmup import JIT_JOB_GROUP
from service.settings import Settings

ADMIN = "/admin/v2/persistent/t/ns"
TOPICS = "/topics/persistent/t/ns"


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


@pytest.fixture
def topic(client: TestClient) -> str:
    assert client.put(f"{ADMIN}/orders").status_code == 204
    r = client.post(
        f"{TOPICS}/orders", json={"messages": [{"key": "a", "value": b64(b"1")}, {"key": "b", "value": None}]}
    )
    assert r.status_code == 200
    return "orders"


def snapshot(client: TestClient) -> tuple[object, object]:
    stats = client.get(f"{ADMIN}/orders/internalStats").json()
    msgs = client.get(f"{TOPICS}/orders/messages", params={"maxMessages": 1000}).json()
    return stats["ledgers"], msgs


def test_health(client: TestClient) -> None:
    # The Java check runs in the background at start-up; warm-up is off, so Spark starts
    # with the first round.
    deadline = time.monotonic() + 30
    while (body := client.get("/health").json())["compaction"] == "starting" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert body == {"status": "ok", "compaction": "on demand"}


def test_health_says_warming_up_while_the_warm_up_runs_and_stopping_ends_it(
    settings: Settings, spark: SparkSession
) -> None:
    tracker = spark.sparkContext.statusTracker()
    before = len(tracker.getJobIdsForGroup(JIT_JOB_GROUP))
    warm = settings.model_copy(update={"spark_warmup": True, "spark_warmup_jobs": 1_000_000})
    with TestClient(create_app(warm)) as c:
        assert c.get("/health").json()["warmingUp"] is True
        deadline = time.monotonic() + 120
        while len(tracker.getJobIdsForGroup(JIT_JOB_GROUP)) < before + 2:  # in its empty jobs
            assert time.monotonic() < deadline, "the warm-up's jobs did not start"
            time.sleep(0.05)
        body = c.get("/health").json()
        assert body == {"status": "ok", "compaction": "available", "warmingUp": True}
    # The service stopped: its warm-up ran at most the job it was in.
    ran = len(tracker.getJobIdsForGroup(JIT_JOB_GROUP))
    time.sleep(1.0)
    assert len(tracker.getJobIdsForGroup(JIT_JOB_GROUP)) <= ran + 1


def test_produce_returns_ids_in_request_order_and_read_returns_them(client: TestClient, topic: str) -> None:
    r = client.post(
        f"{TOPICS}/{topic}",
        json={"messages": [{"key": None, "value": b64(b"x"), "properties": {"p": "q"}, "eventTime": 42}] * 3},
    )
    ids = r.json()["messageIds"]
    body = client.get(f"{TOPICS}/{topic}/messages", params={"startMessageId": ids[0]}).json()
    assert [m["messageId"] for m in body["messages"]] == ids
    assert body["messages"][0] | {"publishTime": 0} == {
        "messageId": ids[0],
        "key": None,
        "value": b64(b"x"),
        "properties": {"p": "q"},
        "publishTime": 0,
        "eventTime": 42,
    }
    # The next page starts after the last message; reading it now returns nothing yet.
    nxt = body["nextMessageId"]
    assert client.get(f"{TOPICS}/{topic}/messages", params={"startMessageId": nxt}).json()["messages"] == []
    latest = client.get(f"{TOPICS}/{topic}/messages", params={"startMessageId": "latest"}).json()
    assert latest["messages"] == [] and latest["nextMessageId"] == nxt


def test_a_message_may_leave_every_field_out_and_the_reply_holds_only_the_ids(
    client: TestClient, topic: str
) -> None:
    r = client.post(f"{TOPICS}/{topic}", json={"messages": [{}, {"key": "k", "value": ""}]})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert list(r.json()) == ["messageIds"] and len(r.json()["messageIds"]) == 2
    first = r.json()["messageIds"][0]
    read = client.get(f"{TOPICS}/{topic}/messages", params={"startMessageId": first}).json()["messages"]
    assert [(m["key"], m["value"], m["properties"], m["eventTime"]) for m in read] == [
        (None, None, {}, None),
        ("k", "", {}, None),
    ]


def test_a_read_as_columns_holds_what_the_rows_hold(client: TestClient, topic: str) -> None:
    """``format=columns`` (what the Python reader asks for): the same page, one array per
    field, values cut from one base64 string, and the same ``nextMessageId``."""
    client.post(f"{TOPICS}/{topic}", json={"messages": [{"key": "c", "value": b64(b"xyz"), "eventTime": 9}]})
    for start in ("earliest", "1:1"):
        params = {"startMessageId": start, "maxMessages": 2}
        rows = client.get(f"{TOPICS}/{topic}/messages", params=params).json()
        cols = client.get(f"{TOPICS}/{topic}/messages", params=params | {"format": "columns"}).json()
        assert cols["nextMessageId"] == rows["nextMessageId"] and "redeliveryCounts" not in cols
        assert cols["count"] == len(rows["messages"]) == 2
        blob, at, values = base64.b64decode(cols["values"]), 0, []
        for n in cols["valueLengths"]:
            values.append(b64(blob[at : at + n]) if n >= 0 else None)
            at += max(n, 0)
        events = cols["eventTimes"] or [None] * 2
        assert [
            {
                "messageId": f"{lid}:{eid}",
                "key": k,
                "value": v,
                "properties": {},
                "publishTime": t,
                "eventTime": e,
            }
            for lid, eid, k, v, t, e in zip(
                cols["ledgerIds"],
                cols["entryIds"],
                cols["keys"],
                values,
                cols["publishTimes"],
                events,
                strict=True,
            )
        ] == rows["messages"]


def test_topic_create_conflict_list_delete(client: TestClient, topic: str) -> None:
    assert client.put(f"{ADMIN}/{topic}").status_code == 409
    assert client.get(ADMIN).json() == ["persistent://t/ns/orders"]
    assert client.delete(f"{ADMIN}/{topic}").status_code == 204
    assert client.get(ADMIN).json() == []
    assert client.delete(f"{ADMIN}/{topic}").status_code == 404
    # A re-created topic starts empty.
    assert client.put(f"{ADMIN}/{topic}").status_code == 204
    assert client.get(f"{TOPICS}/{topic}/messages").json()["messages"] == []


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("put", f"{ADMIN}/%2E%2E", {}, 400),
        ("put", "/admin/v2/persistent/t/%2E%2E/x", {}, 400),
        ("put", f"{ADMIN}/a%20b", {}, 400),
        ("put", f"{ADMIN}/" + "x" * 129, {}, 400),
        ("post", f"{TOPICS}/%2E%2E", {"json": {"messages": [{"key": "k", "value": "AA=="}]}}, 400),
        ("get", f"{TOPICS}/%2E/messages", {}, 400),
        ("post", f"{TOPICS}/orders", {"json": {"messages": [{"key": "k", "value": "not base64!"}]}}, 400),
        ("post", f"{TOPICS}/orders", {"json": {"messages": [{"key": "k", "value": "AAA"}]}}, 400),
        # Strict base64: data after the padding, a space, a character outside ASCII.
        ("post", f"{TOPICS}/orders", {"json": {"messages": [{"key": "k", "value": "AA==AA=="}]}}, 400),
        ("post", f"{TOPICS}/orders", {"json": {"messages": [{"key": "k", "value": "AA AA=="}]}}, 400),
        ("post", f"{TOPICS}/orders", {"json": {"messages": [{"key": "k", "value": "AAé="}]}}, 400),
        ("post", f"{TOPICS}/orders", {"json": {"messages": [{"key": "k", "properties": None}]}}, 422),
        ("post", f"{TOPICS}/orders", {"json": {"messages": [{"key": "k", "extra": 1}]}}, 422),
        ("post", f"{TOPICS}/orders", {"json": {"messages": []}}, 400),
        ("post", f"{TOPICS}/orders", {"json": {"messages": [{"key": 5, "value": "AA=="}]}}, 422),
        (
            "post",
            f"{TOPICS}/orders",
            {"json": {"messages": [{"key": "k", "value": "AA==", "eventTime": -1}]}},
            422,
        ),
        ("post", f"{TOPICS}/orders", {"json": {"msgs": []}}, 422),
        (
            "post",
            f"{TOPICS}/orders",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            422,
        ),
        # JSON may escape a lone surrogate, which no text holds: refused, and echoed in the
        # reply without breaking it.
        (
            "post",
            "/admin/v2/schemas/public/default/orders/schema",
            {
                "content": b'{"type": "JSON", "schema": "\\ud800"}',
                "headers": {"content-type": "application/json"},
            },
            422,
        ),
        (
            "post",
            f"{TOPICS}/orders",
            {"json": {"messages": [{"value": b64(b"x" * (5 * 1024 * 1024 + 1))}]}},
            413,
        ),
        (
            "post",
            f"{TOPICS}/orders",
            {"json": {"messages": [{"value": "AA=="}, {"value": b64(b"x" * (5 * 1024 * 1024 + 1))}]}},
            413,
        ),
        ("post", f"{TOPICS}/missing", {"json": {"messages": [{"key": "k", "value": "AA=="}]}}, 404),
        ("get", f"{TOPICS}/missing/messages", {}, 404),
        ("get", f"{ADMIN}/missing/internalStats", {}, 404),
        ("get", f"{TOPICS}/orders/messages", {"params": {"startMessageId": "1:x"}}, 400),
        ("get", f"{TOPICS}/orders/messages", {"params": {"startMessageId": "99999999999999999999:0"}}, 400),
        ("get", f"{TOPICS}/orders/messages", {"params": {"maxMessages": 0}}, 422),
        ("get", f"{TOPICS}/orders/messages", {"params": {"maxMessages": -5}}, 422),
        ("get", f"{TOPICS}/orders/messages", {"params": {"readCompacted": "maybe"}}, 422),
        ("get", f"{TOPICS}/orders/messages", {"params": {"format": "csv"}}, 422),
    ],
)
def test_bad_input_gets_4xx_json_reason_and_changes_nothing(
    client: TestClient,
    topic: str,
    method: str,
    path: str,
    kwargs: dict,
    status: int,
) -> None:
    before = snapshot(client)
    r = getattr(client, method)(path, **kwargs)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["reason"], str) and r.json()["reason"]
    assert snapshot(client) == before
    assert client.get(ADMIN).json() == ["persistent://t/ns/orders"]


def test_oversize_request_body_is_refused_before_it_is_read(client: TestClient, topic: str, settings) -> None:
    r = client.post(
        f"{TOPICS}/{topic}",
        content=b"x" * 10,
        headers={"content-type": "application/json", "content-length": str(settings.max_request_bytes + 1)},
    )
    assert r.status_code == 413
