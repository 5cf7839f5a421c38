"""The dashboard in a real browser (headless Chromium) against a real ``compactor serve``.

The module's server starts Spark only at the first compaction, which the test starts with
"Compact now": that round runs for seconds, long enough to watch its progress bar."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.client import Client
from tests.conftest import Server

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

TOPIC = "persistent://public/default/orders"
PAGE = "/dashboard/topics/public/default/orders"
ADMIN = "/admin/v2/persistent/public/default/orders"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("dashboard") / "data")
    s.start()
    with Client(s.url) as c:
        c.admin.topics.create(TOPIC)
        c.admin.topics.create_subscription(TOPIC, "billing", initial_position="earliest")
        c.create_producer(TOPIC).send_many([(f"order-{i % 40}", b"x" * (20 + i % 50)) for i in range(400)])
        c.admin.topics.create("persistent://public/default/audit")
    http = httpx.Client(base_url=s.url)
    # A policy at each level, so that the page shows every source.
    assert http.post(f"{ADMIN}/compactionThreshold", json=1_000_000).status_code == 204
    ns = "/admin/v2/namespaces/public/default/compactionPolicy"
    policy = {"minCompactionLagMs": 0, "deleteRetentionMs": 60_000, "table": True}
    assert http.post(ns, json=policy).status_code == 200
    yield s
    s.stop()


@pytest.fixture
def page(browser, srv: Server):  # type: ignore[no-untyped-def]
    p = browser.new_page()
    p.set_default_timeout(30_000)
    yield p
    p.close()


def test_topic_page_compact_now_shows_progress_then_success(page, srv: Server) -> None:
    from playwright.sync_api import expect

    # The page fills its sections and then the status, each when its call answers: wait for
    # what is asserted, never read it at once.
    page.goto(srv.url + PAGE)
    page.wait_for_selector("#ledgers table")
    expect(page.locator("#compaction-status")).to_have_text("NOT_RUN")
    page.click("#compact-now")
    # The progress bar, while the round runs: phase and percent, from the REST status.
    page.wait_for_selector("#progress:not([hidden])")
    text = page.locator("#progress-text").inner_text()
    assert re.match(r"phase-(one|two) · \d+\.\d% · ", text) or text.startswith("commit"), text
    page.wait_for_function(
        "document.getElementById('compaction-status').innerText === 'SUCCESS'", timeout=180_000
    )
    assert page.locator("#progress").is_hidden()
    # The topic's Iceberg table (its namespace's policy asks for one): committed, no lag.
    expect(page.locator("#table")).to_contain_text("Iceberg table: on · snapshot committed · lag 0 rounds")
    # The page refreshed itself: the compacted ledger, its horizon, the run in the history chart.
    page.wait_for_selector("#history svg.chart rect")
    ledgers = page.locator("#ledgers")
    expect(ledgers).to_contain_text(re.compile(r"40\s+compacted entries"), use_inner_text=True)
    expect(ledgers).to_contain_text(re.compile(r"(0:)?399\s+horizon"), use_inner_text=True)
    expect(page.locator("#cursors")).to_contain_text("billing")
    policies = page.locator("#policies table")
    for applied in (
        r"compactionThreshold\s+1000000\s+topic",
        r"deleteRetentionMs\s+60000\s+namespace",
        r"compactionStrategy\s+\"offset\"\s+default",
    ):
        expect(policies).to_contain_text(re.compile(applied), use_inner_text=True)

    # Two more rounds (Spark is warm now) for a history worth a screenshot.
    with Client(srv.url) as c:
        for n in (150, 80):
            c.create_producer(TOPIC).send_many([(f"order-{i % 60}", b"y" * 40) for i in range(n)])
            c.admin.topics.compact(TOPIC)
            assert c.admin.topics.wait_for_compaction(TOPIC, timeout=180).status == "SUCCESS"

    page.reload()
    # The page renders its sections again once it has checked for a running round: wait for
    # the chart that holds the three runs, not for the first one drawn.
    expect(page.locator("#history svg.chart rect")).to_have_count(6)  # before and after, per run
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 10_000


def test_topic_list(page, srv: Server) -> None:
    page.goto(srv.url + "/dashboard/")
    row = page.locator("tr", has_text=TOPIC)
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[0] == TOPIC
    assert cells[1].endswith(("KiB", "B"))  # storage
    assert page.locator("tr", has_text="persistent://public/default/audit").count() == 1
    page.click(f"text={TOPIC}")
    page.wait_for_url(f"**{PAGE}")


def test_token_is_sent_and_refusals_are_shown(page, srv: Server) -> None:
    # Authentication arrives with another change; the page's side of it is tested here: the
    # stored token goes with every call, and a 403 shows its reason where the data would be.
    from playwright.sync_api import expect

    refusal = json.dumps({"reason": "role 'viewer' may not read stats"})
    page.route(
        re.compile(r".*/stats$"),
        lambda route: route.fulfill(status=403, content_type="application/json", body=refusal),
    )
    page.route(
        re.compile(r".*/compaction$"),
        lambda route: (
            route.fulfill(status=403, content_type="application/json", body=refusal)
            if route.request.method == "PUT"
            else route.continue_()
        ),
    )
    page.goto(srv.url + PAGE)
    expect(page.locator("#ledgers table")).to_be_visible()
    # The page refreshes once more after it checked for a running round; let that tokenless
    # refresh finish, so that the request caught below is the one the token submit sends.
    page.wait_for_load_state("networkidle")
    page.fill("#token", "secret-token")
    with page.expect_request(lambda r: r.url.endswith("/internalStats")) as sent:
        page.click("#token-form button[type=submit]")
    assert sent.value.headers.get("authorization") == "Bearer secret-token"
    assert page.evaluate("sessionStorage.getItem('compactorToken')") == "secret-token"
    expect(page.locator("#cursors")).to_contain_text("Not permitted (403): role 'viewer' may not read stats")
    expect(page.locator("#ledgers table")).to_be_visible()  # what the role may see is shown
    with page.expect_request(lambda r: r.url.endswith("/compaction") and r.method == "PUT") as put:
        page.click("#compact-now")
    assert put.value.headers.get("authorization") == "Bearer secret-token"
    expect(page.locator("#compaction-error")).to_contain_text("Not permitted (403)")


def test_the_topic_list_shows_a_role_only_what_it_may_see(secure_server) -> None:
    # With authorization on, the dashboard's views answer as the admin API does for that role.
    admin = secure_server.headers("admin")
    with httpx.Client(base_url=secure_server.url, timeout=30) as http:
        for tenant in ("dash-a", "dash-b"):
            r = http.put(
                f"/admin/v2/tenants/{tenant}", json={"adminRoles": [f"{tenant}-admin"]}, headers=admin
            )
            assert r.status_code == 204
            assert http.put(f"/admin/v2/namespaces/{tenant}/ns", headers=admin).status_code == 204
            assert http.put(f"/admin/v2/persistent/{tenant}/ns/t", headers=admin).status_code == 204

        def names(role: str) -> set[str]:
            r = http.get("/dashboard/api/topics", headers=secure_server.headers(role))
            assert r.status_code == 200, r.text
            return {t["name"] for t in r.json() if "/dash-" in t["name"]}

        assert http.get("/dashboard/api/topics").status_code == 401
        assert names("dash-a-admin") == {"persistent://dash-a/ns/t"}
        assert names("nobody") == set()
        assert names("admin") == {"persistent://dash-a/ns/t", "persistent://dash-b/ns/t"}
        policies = "/dashboard/api/topics/dash-b/ns/t/policies"
        refused = http.get(policies, headers=secure_server.headers("dash-a-admin"))
        assert refused.status_code == 403 and "dash-a-admin" in refused.json()["reason"]
        assert http.get(policies, headers=secure_server.headers("dash-b-admin")).status_code == 200
