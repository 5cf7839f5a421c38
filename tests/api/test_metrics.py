"""``GET /metrics`` of a real ``compactor serve``: Pulsar's per-topic names and labels, the
service's own metrics, deleted topics' series gone, and bounded cardinality."""

from __future__ import annotations

import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.client import Client

pytestmark = [pytest.mark.e2e, pytest.mark.spark]


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``/metrics`` by (name, labels)."""
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def of_topic(samples, topic: str) -> dict[str, float]:
    """The samples labelled with ``topic`` (and no subscription), by name."""
    return {
        name: v
        for (name, labels), v in samples.items()
        if ("topic", topic) in labels and not any(k == "subscription" for k, _ in labels)
    }


def test_topic_metrics_under_pulsar_names(shared_server) -> None:
    name = f"persistent://public/default/metrics-{uuid.uuid4().hex[:8]}"
    with Client(shared_server.url) as c:
        c.admin.topics.create(name)
        consumer = c.subscribe(name, "s1", initial_position="earliest", ack_group_time_ms=0)
        c.create_producer(name).send_many([(f"k{i % 10}", b"v%03d" % i) for i in range(100)])
        got = consumer.batch_receive(max_messages=30, timeout_millis=5000)
        consumer.acknowledge_cumulative(got[9])  # 10 acknowledged, 20 delivered and unacknowledged
        c.admin.topics.compact(name)
        assert c.admin.topics.wait_for_compaction(name, timeout=180).status == "SUCCESS"
        samples = scrape(shared_server.url)
        consumer.close()

    m = of_topic(samples, name)
    labels = {k: v for (n, ls), _ in samples.items() if ("topic", name) in ls for k, v in ls}
    assert labels["namespace"] == "public/default"
    assert m["pulsar_in_messages_total"] == 100
    assert m["pulsar_in_bytes_total"] == 100 * (len("k0") + len("v000"))
    assert m["pulsar_out_messages_total"] == len(got) == 30
    assert m["pulsar_msg_backlog"] == 90
    assert m["pulsar_consumers_count"] == 1 and m["pulsar_subscriptions_count"] == 1
    assert m["pulsar_storage_size"] > 0
    assert m["pulsar_compaction_succeed_count"] == 1 and m["pulsar_compaction_failed_count"] == 0
    assert m["pulsar_compaction_removed_event_count"] == 90
    assert m["pulsar_compaction_compacted_entries_count"] == 10
    assert m["pulsar_compaction_compacted_entries_size"] > 0
    assert m["pulsar_compaction_duration_time_in_millis"] > 0
    assert m["pulsar_compaction_read_throughput"] > 0 and m["pulsar_compaction_write_throughput"] > 0
    assert m["pulsar_compaction_latency_ms_count"] == 1
    sub = {("topic", name), ("namespace", "public/default"), ("subscription", "s1")}
    assert samples[("pulsar_subscription_back_log", frozenset(sub))] == 90
    assert samples[("pulsar_subscription_unacked_messages", frozenset(sub))] == 20

    names = {n for n, _ in samples}
    assert not [n for n in names if n.endswith("_created")]  # none, as Pulsar's
    # The service's own: requests by route template, Spark time per phase, fsyncs, the process.
    assert {
        "compactor_http_requests_total",
        "compactor_http_request_duration_seconds_bucket",
        "compactor_spark_job_seconds_count",
        "process_cpu_seconds_total",
        "process_open_fds",
    } <= names
    phases = {dict(ls)["phase"] for n, ls in samples if n == "compactor_spark_job_seconds_count"}
    assert phases == {"phase-one", "phase-two"}
    # A write-ahead fsync per group commit, or a flush per group commit with COMPACTOR_WAL=object.
    committed = ("compactor_wal_fsync_seconds_count", "compactor_wal_flush_seconds_count")
    assert sum(v for (n, _), v in samples.items() if n in committed) >= 1
    produce = frozenset(
        {("method", "POST"), ("route", "/topics/persistent/{tenant}/{namespace}/{topic}"), ("status", "200")}
    )
    assert samples[("compactor_http_requests_total", produce)] >= 1
    # The bounded resources of broker-stats: descriptors, the seal backlog, the file cache.
    assert samples[("compactor_open_descriptors", frozenset())] > 0
    assert samples[("compactor_descriptor_limit", frozenset({("kind", "soft")}))] >= 128
    assert samples[("compactor_seal_backlog", frozenset())] >= 0
    assert samples[("compactor_ledger_files_limit", frozenset())] > 0
    assert ("compactor_ledger_file_cache_hits_total", frozenset()) in samples
    assert ("compactor_row_group_cache_hits_total", frozenset()) in samples
    assert samples[("compactor_row_group_cache_limit_bytes", frozenset())] >= 0


def test_series_of_a_deleted_topic_disappear(shared_server) -> None:
    name = f"persistent://public/default/gone-{uuid.uuid4().hex[:8]}"
    with Client(shared_server.url) as c:
        c.admin.topics.create(name)
        c.admin.topics.create_subscription(name, "s")
        c.create_producer(name).send("v")
        m = of_topic(scrape(shared_server.url), name)
        assert m["pulsar_in_messages_total"] == 1
        # Never compacted: no compaction series for it at all, as Pulsar (a scrape costs per line).
        assert [n for n in m if n.startswith("pulsar_compaction_")] == []
        c.admin.topics.delete(name)
    assert not [k for k in scrape(shared_server.url) if ("topic", name) in k[1]]


def test_request_series_stay_bounded_by_route_templates(shared_server) -> None:
    def request_series() -> set[frozenset[tuple[str, str]]]:
        return {ls for n, ls in scrape(shared_server.url) if n == "compactor_http_requests_total"}

    with Client(shared_server.url) as c:
        warm = f"persistent://public/default/card-{uuid.uuid4().hex[:8]}"
        c.admin.topics.create(warm)
        c.admin.topics.stats(warm)
        before = request_series()
        for i in range(20):
            topic = f"persistent://public/default/card-{uuid.uuid4().hex[:8]}-{i}"
            c.admin.topics.create(topic)
            c.admin.topics.stats(topic)
        httpx.get(f"{shared_server.url}/no/such/path/{uuid.uuid4().hex}")
    after = request_series()
    # Twenty new topics add no series; an unknown path adds at most one, "unmatched".
    assert len(after - before) <= 1
    assert all("card-" not in v for ls in after for _, v in ls)
    assert {dict(ls)["route"] for ls in after - before} <= {"unmatched"}


def test_metrics_are_open_unless_authenticate_metrics_endpoint(
    secure_server, server_factory, tmp_path
) -> None:
    # Pulsar's authenticateMetricsEndpoint: off, /metrics answers without a token even with
    # authentication on; on, it needs a valid token (any role: authentication only).
    assert httpx.get(f"{secure_server.url}/metrics", timeout=30).status_code == 200
    key = "data:;base64,YS1zZWNyZXQtZm9yLXRoZS1tZXRyaWNzLXRlc3Qtb2YtMzIrLWJ5dGVz"
    s = server_factory(
        tmp_path / "data",
        env={
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_AUTHORIZATION_ENABLED": "true",
            "COMPACTOR_TOKEN_SECRET_KEY": key,
            "COMPACTOR_AUTHENTICATE_METRICS_ENDPOINT": "true",
        },
    )
    s.start()
    r = httpx.get(f"{s.url}/metrics", timeout=30)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert "authentication required" in r.json()["reason"]
    import jwt

    token = jwt.encode(
        {"sub": "prometheus"}, b"a-secret-for-the-metrics-test-of-32+-bytes", algorithm="HS256"
    )
    ok = httpx.get(f"{s.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert ok.status_code == 200 and "process_cpu_seconds_total" in ok.text


def test_scrapes_count_what_they_cost(shared_server) -> None:
    # An operator who scrapes often sees what it costs the service (each scrape counts itself
    # in the next one).
    first = scrape(shared_server.url)[("compactor_metrics_scrapes_total", frozenset())]
    second = scrape(shared_server.url)
    assert second[("compactor_metrics_scrapes_total", frozenset())] == first + 1
    assert second[("compactor_metrics_scrape_cpu_seconds_total", frozenset())] > 0
