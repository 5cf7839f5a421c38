"""Subscriptions and consumers over REST: shapes, stats, and bad input refused with no cursor change."""

from __future__ import annotations

import base64

import pytest
from fastapi.testclient import TestClient

ADMIN = "/admin/v2/persistent/t/ns/orders"
TOPIC = "/topics/persistent/t/ns/orders"
SUB = f"{TOPIC}/subscription/s/consumers"


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


@pytest.fixture
def consumer(client: TestClient) -> str:
    assert client.put(ADMIN).status_code == 204
    msgs = [{"key": f"k{i}", "value": b64(b"x" * 10)} for i in range(6)]
    assert client.post(TOPIC, json={"messages": msgs}).status_code == 200
    assert client.put(f"{ADMIN}/subscription/s", params={"initialPosition": "earliest"}).status_code == 204
    r = client.post(SUB, json={"consumerName": "c1"})
    assert r.status_code == 200 and r.json()["readCompacted"] is False
    return r.json()["consumerId"]


def sub_stats(client: TestClient) -> dict:
    return client.get(f"{ADMIN}/stats").json()["subscriptions"]["s"]


def test_receive_ack_and_stats(client: TestClient, consumer: str) -> None:
    assert client.get(f"{ADMIN}/subscriptions").json() == ["s"]
    st = sub_stats(client)
    assert (
        st["msgBacklog"] == 6 and st["backlogSize"] == 6 * 12 and st["consumers"][0]["consumerName"] == "c1"
    )
    msgs = client.post(f"{SUB}/{consumer}/receive", json={"maxMessages": 4}).json()["messages"]
    assert [m["key"] for m in msgs] == ["k0", "k1", "k2", "k3"] and msgs[0]["redeliveryCount"] == 0
    assert sub_stats(client)["unackedMessages"] == 4
    r = client.post(f"{SUB}/{consumer}/ack", json={"messageIds": [msgs[1]["messageId"]], "cumulative": True})
    assert r.status_code == 204
    st = sub_stats(client)
    assert st["msgBacklog"] == 4 and st["markDeletePosition"] == msgs[1]["messageId"]
    assert client.post(f"{SUB}/{consumer}/redeliver").status_code == 204
    again = client.post(f"{SUB}/{consumer}/receive", json={"maxMessages": 10}).json()["messages"]
    assert [m["key"] for m in again] == ["k2", "k3", "k4", "k5"] and again[0]["redeliveryCount"] == 1
    assert client.post(f"{SUB}/{consumer}/seek", json={"messageId": "earliest"}).status_code == 204
    assert sub_stats(client)["msgBacklog"] == 6
    assert client.delete(f"{SUB}/{consumer}").status_code == 204
    assert client.delete(f"{ADMIN}/subscription/s").status_code == 204
    assert client.get(f"{ADMIN}/subscriptions").json() == []


def test_a_page_as_columns_holds_what_the_rows_hold(client: TestClient) -> None:
    """The column form of a page (what the Python client asks for) carries every field of
    the row form: ids, keys, values with tombstones, properties, times, redelivery counts."""
    assert client.put(ADMIN).status_code == 204
    msgs = [
        {"key": "a", "value": b64(b"one"), "properties": {"p": "1"}, "eventTime": 7},
        {"key": None, "value": b64(b"")},
        {"key": "a", "value": None},
        {"key": "b", "value": b64(bytes(range(256)))},
    ]
    assert client.post(TOPIC, json={"messages": msgs}).status_code == 200
    assert client.put(f"{ADMIN}/subscription/s", params={"initialPosition": "earliest"}).status_code == 204
    cid = client.post(SUB, json={}).json()["consumerId"]

    def both() -> tuple[list[dict], dict]:
        rows = client.post(f"{SUB}/{cid}/receive", json={"maxMessages": 10}).json()["messages"]
        assert client.post(f"{SUB}/{cid}/redeliver").status_code == 204
        page = client.post(f"{SUB}/{cid}/receive", json={"maxMessages": 10, "format": "columns"}).json()
        assert client.post(f"{SUB}/{cid}/redeliver").status_code == 204
        return rows, page

    def as_rows(page: dict) -> list[dict]:
        blob, at, out = base64.b64decode(page["values"]), 0, []
        for i in range(page["count"]):
            n = page["valueLengths"][i]
            out.append(
                {
                    "messageId": f"{page['ledgerIds'][i]}:{page['entryIds'][i]}",
                    "key": page["keys"][i],
                    "value": b64(blob[at : at + n]) if n >= 0 else None,
                    "properties": (page["properties"] or [{}] * page["count"])[i],
                    "publishTime": page["publishTimes"][i],
                    "eventTime": (page["eventTimes"] or [None] * page["count"])[i],
                    "redeliveryCount": (page["redeliveryCounts"] or [0] * page["count"])[i],
                }
            )
            at += max(n, 0)
        assert at == len(blob)
        return out

    rows, page = both()
    assert [m["redeliveryCount"] for m in rows] == [0] * 4 and page["redeliveryCounts"] == [1] * 4
    assert as_rows(page) == [m | {"redeliveryCount": 1} for m in rows]
    assert page["valueLengths"] == [3, 0, -1, 256]
    # Columns every message leaves empty are null.
    assert client.post(TOPIC, json={"messages": [{"key": "c", "value": b64(b"x")}]}).status_code == 200
    first = rows[-1]["messageId"]
    r = client.post(f"{SUB}/{cid}/ack", json={"messageIds": [first], "cumulative": True})
    assert r.status_code == 204
    page = client.post(f"{SUB}/{cid}/receive", json={"maxMessages": 10, "format": "columns"}).json()
    assert page["count"] == 1 and page["keys"] == ["c"]
    assert page["properties"] is None and page["eventTimes"] is None and page["redeliveryCounts"] is None


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("post", f"{TOPIC}/subscription/nope/consumers", {}, 404),
        ("post", "{SUB}/not-a-consumer/receive", {}, 404),
        ("post", "{SUB}/{cid}/receive", {"maxMessages": -1}, 422),
        ("post", "{SUB}/{cid}/receive", {"maxMessages": 0}, 422),
        ("post", "{SUB}/{cid}/receive", {"timeoutMs": -1}, 422),
        ("post", "{SUB}/{cid}/receive", {"format": "arrow"}, 422),
        ("post", "{SUB}/{cid}/ack", {"messageIds": ["{never}"]}, 400),
        ("post", "{SUB}/{cid}/ack", {"messageIds": ["99:0"], "cumulative": True}, 400),
        ("post", "{SUB}/{cid}/ack", {"messageIds": ["nonsense"]}, 400),
        ("post", "{SUB}/{cid}/ack", {"messageIds": []}, 422),
        ("post", "{SUB}/{cid}/seek", {}, 400),
        ("post", "{SUB}/{cid}/seek", {"messageId": "1:0", "publishTime": 5}, 400),
        ("post", "{SUB}/{cid}/seek", {"messageId": "x:y"}, 400),
        ("post", SUB, {"consumerName": "second"}, 409),
        ("post", SUB, {"ackTimeoutMs": -1}, 422),
        ("put", f"{ADMIN}/subscription/s", None, 409),
        ("put", f"{ADMIN}/subscription/__compaction", None, 409),
        ("delete", f"{ADMIN}/subscription/__compaction", None, 409),
        ("post", f"{TOPIC}/subscription/__compaction/consumers", {}, 409),
        ("put", f"{ADMIN}/subscription/x?initialPosition=middle", None, 422),
        ("post", f"{ADMIN}/subscription/s/resetcursor/-5", None, 400),
        ("post", f"{ADMIN}/subscription/s/resetcursor", {"messageId": "1:"}, 400),
        ("delete", f"{ADMIN}/subscription/nope", None, 404),
    ],
)
def test_bad_input_gets_4xx_and_changes_no_cursor(
    client: TestClient,
    consumer: str,
    method: str,
    path: str,
    body: dict | None,
    status: int,
) -> None:
    delivered = client.post(f"{SUB}/{consumer}/receive", json={"maxMessages": 2}).json()["messages"]
    client.post(f"{SUB}/{consumer}/ack", json={"messageIds": [delivered[0]["messageId"]]})
    never = "1:5"
    before = (sub_stats(client), client.get(f"{ADMIN}/internalStats").json()["cursors"])
    url = path.replace("{SUB}", SUB).replace("{cid}", consumer)
    kwargs = (
        {}
        if body is None
        else {
            "json": {
                k: ([i.replace("{never}", never) for i in v] if isinstance(v, list) else v)
                for k, v in body.items()
            }
        }
    )
    r = client.request(method.upper(), url, **kwargs)
    assert r.status_code == status, r.text
    assert r.json()["reason"]
    assert (sub_stats(client), client.get(f"{ADMIN}/internalStats").json()["cursors"]) == before


def test_thresholds_at_topic_and_namespace_level(client: TestClient) -> None:
    assert client.put(ADMIN).status_code == 204
    ns = "/admin/v2/namespaces/t/ns/compactionThreshold"
    assert client.get(f"{ADMIN}/compactionThreshold").json() is None
    assert client.post(ns, json=1000).status_code == 204
    assert client.post(f"{ADMIN}/compactionThreshold", json=50).status_code == 204
    assert client.get(ns).json() == 1000 and client.get(f"{ADMIN}/compactionThreshold").json() == 50
    for bad in (-1, "many", 1.5, True):
        r = client.post(f"{ADMIN}/compactionThreshold", json=bad)
        assert r.status_code == 400, (bad, r.text)
    assert client.get(f"{ADMIN}/compactionThreshold").json() == 50
    assert client.delete(f"{ADMIN}/compactionThreshold").status_code == 204
    assert client.get(f"{ADMIN}/compactionThreshold").json() is None
    assert client.post("/admin/v2/persistent/t/ns/missing/compactionThreshold", json=5).status_code == 404
