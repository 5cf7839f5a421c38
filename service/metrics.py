"""The service's Prometheus metrics: Pulsar's per-topic names, and the service's own.

Per-topic series are not kept in prometheus-client objects: a ``Collector`` reads, at scrape
time, what the service keeps anyway (each managed ledger's append totals, each topic's delivery
tally, its ledgers, subscriptions and compacted ledger) plus the compaction totals recorded here
at the end of each round. So produce and consume pay for no metric object per message, and a
deleted topic's series disappear with the topic: the collector only walks topics that exist.

Pulsar exposes its topic metrics as gauges (``pulsar_compaction_succeed_count`` ...); so do we,
keeping the names exact. The two running message totals are counters (``..._total``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from ledger import object_wal, wal
from service.managed_topic import ManagedTopic
from service.stats import resource_stats
from service.subscription_stats import backlog_of
from service.subscriptions import Subscription
from service.topics import Broker

# Compaction latency buckets, milliseconds (a round takes from a fraction of a second to minutes).
COMPACTION_LATENCY_BUCKETS_MS = (100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 300_000)
# Request latency buckets, seconds: most requests take a millisecond; long polls take seconds.
HTTP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30)
FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1)
FLUSH_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
SPARK_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


@dataclass
class CompactionTotals:
    """One topic's compaction totals since the service started (Pulsar's compaction metrics)."""

    succeed: int = 0
    failed: int = 0
    removed_events: int = 0
    duration_ms: int = 0  # of every succeeded round
    # The last succeeded round's read and write throughput, bytes per second.
    read_throughput: float = 0.0
    write_throughput: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(COMPACTION_LATENCY_BUCKETS_MS))
    latency_count: int = 0
    latency_sum_ms: int = 0
    # Its Iceberg table (``service.tables``): rounds since the last committed snapshot (None:
    # no table), and the table commits that failed.
    table_lag: int | None = None
    table_failed: int = 0

    def observe(self, duration_ms: int) -> None:
        for i, le in enumerate(COMPACTION_LATENCY_BUCKETS_MS):
            if duration_ms <= le:
                self.latency_buckets[i] += 1
        self.latency_count += 1
        self.latency_sum_ms += duration_ms


class CompactionMetrics:
    """What each finished round adds to its topic's totals, by topic id (a re-created topic of
    the same name starts again from zero). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[int, CompactionTotals] = {}

    def succeeded(
        self, topic_id: int, *, duration_ms: int, removed: int = 0, bytes_in: int = 0, bytes_out: int = 0
    ) -> None:
        with self._lock:
            t = self._totals.setdefault(topic_id, CompactionTotals())
            t.succeed += 1
            t.removed_events += removed
            t.duration_ms += duration_ms
            seconds = max(duration_ms, 1) / 1000
            t.read_throughput = bytes_in / seconds
            t.write_throughput = bytes_out / seconds
            t.observe(duration_ms)

    def failed(self, topic_id: int, *, duration_ms: int) -> None:
        with self._lock:
            t = self._totals.setdefault(topic_id, CompactionTotals())
            t.failed += 1
            t.observe(duration_ms)

    def table_lag(self, topic_id: int, lag: int | None, *, failed: bool = False) -> None:
        """The topic's table lag after a commit (``failed``: one that failed), or at its load;
        None once its table is dropped."""
        with self._lock:
            t = self._totals.setdefault(topic_id, CompactionTotals())
            t.table_lag = lag
            t.table_failed += failed

    def snapshot(self, live_topic_ids: Iterable[int]) -> dict[int, CompactionTotals]:
        """The totals of the live topics (copies), forgetting those of deleted ones."""
        live = set(live_topic_ids)
        with self._lock:
            for gone in [i for i in self._totals if i not in live]:
                del self._totals[gone]
            return {
                i: CompactionTotals(**{**t.__dict__, "latency_buckets": list(t.latency_buckets)})
                for i, t in self._totals.items()
            }


class IntegrityMetrics:
    """Damage found and scrubbing done since the service started (README, "Integrity and
    repair"): ``compactor_damage_found_total{kind, check}``, ``compactor_scrub_*``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.damage = Counter(
            "compactor_damage_found",
            "Damaged files found (by reads, compactions and scrubs), by ledger kind and failed check.",
            ["kind", "check"],
            registry=registry,
        )
        self.scrub_runs = Counter(
            "compactor_scrub_runs",
            "Scrubs of a topic finished, by outcome (CLEAN, DAMAGED, ERROR).",
            ["status"],
            registry=registry,
        )
        self.scrub_files = Counter("compactor_scrub_files", "Files the scrubber verified.", registry=registry)
        self.scrub_bytes = Counter("compactor_scrub_bytes", "Bytes the scrubber verified.", registry=registry)

    def damage_found(self, kind: str, check: str) -> None:
        self.damage.labels(kind, check).inc()


class TopicCollector(Collector):
    """Pulsar's per-topic metrics, read from the broker at scrape time."""

    def __init__(self, broker: Broker, compaction: CompactionMetrics) -> None:
        self.broker = broker
        self.compaction = compaction

    def collect(self) -> Iterator[Metric]:
        topics = self.broker.topics()
        totals = self.compaction.snapshot(t.topic_id for t in topics)
        labels = ["namespace", "topic"]
        sub_labels = [*labels, "subscription"]

        def gauge(name: str, doc: str, names: list[str] = labels) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=names)

        storage = gauge(
            "pulsar_storage_size", "Bytes the topic takes on disk: its ledgers and compacted ledger."
        )
        backlog = gauge("pulsar_msg_backlog", "Messages the topic's subscriptions have yet to acknowledge.")
        in_msgs = CounterMetricFamily("pulsar_in_messages", "Messages produced since start.", labels=labels)
        in_bytes = CounterMetricFamily(
            "pulsar_in_bytes", "Payload bytes produced since start.", labels=labels
        )
        out_msgs = CounterMetricFamily(
            "pulsar_out_messages", "Messages delivered to consumers and readers since start.", labels=labels
        )
        subs_count = gauge("pulsar_subscriptions_count", "Durable subscriptions of the topic.")
        consumers = gauge("pulsar_consumers_count", "Consumers attached to the topic's subscriptions.")
        sub_backlog = gauge(
            "pulsar_subscription_back_log", "Messages the subscription has yet to acknowledge.", sub_labels
        )
        sub_unacked = gauge(
            "pulsar_subscription_unacked_messages", "Messages delivered, not yet acknowledged.", sub_labels
        )
        sub_consumers = gauge(
            "pulsar_subscription_consumers_count", "Consumers attached to the subscription.", sub_labels
        )
        c_succeed = gauge("pulsar_compaction_succeed_count", "Compaction rounds that succeeded since start.")
        c_failed = gauge("pulsar_compaction_failed_count", "Compaction rounds that failed since start.")
        c_removed = gauge("pulsar_compaction_removed_event_count", "Messages compaction removed since start.")
        c_duration = gauge(
            "pulsar_compaction_duration_time_in_millis", "Time spent in succeeded compaction rounds, ms."
        )
        c_read = gauge("pulsar_compaction_read_throughput", "Last round's read throughput, bytes/s.")
        c_write = gauge("pulsar_compaction_write_throughput", "Last round's write throughput, bytes/s.")
        c_entries = gauge("pulsar_compaction_compacted_entries_count", "Entries in the compacted ledger.")
        c_size = gauge("pulsar_compaction_compacted_entries_size", "Bytes of the compacted ledger.")
        c_latency = HistogramMetricFamily(
            "pulsar_compaction_latency_ms", "Duration of compaction rounds, milliseconds.", labels=labels
        )
        t_lag = gauge(
            "pulsar_compaction_table_lag_rounds",
            "Compaction rounds since the topic's last committed Iceberg table snapshot.",
        )
        t_failed = CounterMetricFamily(
            "pulsar_compaction_table_commit_failed",
            "Iceberg table commits of the topic's rounds that failed since start.",
            labels=labels,
        )

        for topic in topics:
            name = topic.name
            lv = [f"{name.tenant}/{name.namespace}", str(name)]
            ledgers = topic.ledger.ledgers()
            view = topic.view
            compacted = view.ledger if view is not None else None
            storage.add_metric(
                lv, sum(i.file_bytes for i in ledgers) + (compacted.size_bytes if compacted else 0)
            )
            in_msgs.add_metric(lv, topic.ledger.entries_added)
            in_bytes.add_metric(lv, topic.ledger.bytes_added)
            out_msgs.add_metric(lv, topic.messages_out.value)
            total_backlog = attached = 0
            subscriptions = list(topic.subscriptions.values())
            for sub in subscriptions:
                n, _ = _subscription_backlog(topic, sub)
                has_consumer = sub.consumer_count()
                total_backlog += n
                attached += has_consumer
                sub_backlog.add_metric([*lv, sub.name], n)
                sub_unacked.add_metric([*lv, sub.name], sub.unacked())
                sub_consumers.add_metric([*lv, sub.name], has_consumer)
            backlog.add_metric(lv, total_backlog)
            subs_count.add_metric(lv, len(subscriptions))
            consumers.add_metric(lv, attached)
            t = totals.get(topic.topic_id)
            if t is None and compacted is None:
                # As Pulsar: compaction series only for topics compaction has run on. Most
                # topics of a large service are never compacted, and a scrape's cost is per line.
                continue
            t = t or CompactionTotals()
            c_succeed.add_metric(lv, t.succeed)
            c_failed.add_metric(lv, t.failed)
            c_removed.add_metric(lv, t.removed_events)
            c_duration.add_metric(lv, t.duration_ms)
            c_read.add_metric(lv, t.read_throughput)
            c_write.add_metric(lv, t.write_throughput)
            c_entries.add_metric(lv, compacted.entries if compacted else 0)
            c_size.add_metric(lv, compacted.size_bytes if compacted else 0)
            buckets = [
                (str(le), n) for le, n in zip(COMPACTION_LATENCY_BUCKETS_MS, t.latency_buckets, strict=True)
            ]
            c_latency.add_metric(lv, [*buckets, ("+Inf", t.latency_count)], t.latency_sum_ms)
            if t.table_lag is not None:
                t_lag.add_metric(lv, t.table_lag)
                t_failed.add_metric(lv, t.table_failed)
        yield from (
            storage, backlog, in_msgs, in_bytes, out_msgs, subs_count, consumers,
            sub_backlog, sub_unacked, sub_consumers,
            c_succeed, c_failed, c_removed, c_duration, c_read, c_write, c_entries, c_size, c_latency,
            t_lag, t_failed,
        )  # fmt: skip


class ResourceCollector(Collector):
    """The service's bounded resources (``GET /admin/v2/broker-stats/resources``), at scrape
    time: descriptors, the seal backlog, the cache of open sealed-ledger files, the cache of
    hot row groups."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        st = resource_stats(self.broker)
        b, f = st.seal_backlog, st.ledger_files
        if st.open_descriptors is not None:
            yield GaugeMetricFamily(
                "compactor_open_descriptors", "File descriptors open now.", st.open_descriptors
            )
        limit = GaugeMetricFamily(
            "compactor_descriptor_limit", "RLIMIT_NOFILE of the process.", labels=["kind"]
        )
        limit.add_metric(["soft"], st.descriptor_limit.soft)
        limit.add_metric(["hard"], st.descriptor_limit.hard)
        yield limit
        yield CounterMetricFamily(
            "compactor_descriptor_exhaustions",
            "Times the process ran out of descriptors.",
            st.descriptor_exhaustions,
        )
        yield GaugeMetricFamily("compactor_seal_backlog", "Closed ledgers waiting to be sealed.", b.pending)
        yield GaugeMetricFamily(
            "compactor_seal_backlog_limit", "Ledgers that may wait to be sealed.", b.limit
        )
        yield CounterMetricFamily(
            "compactor_seal_backlog_refused",
            "Produce requests refused (503) by a full seal backlog.",
            b.refused,
        )
        yield GaugeMetricFamily(
            "compactor_seal_failures", "Ledgers whose sealing is failing now.", st.seal_failures
        )
        yield GaugeMetricFamily("compactor_ledger_files_open", "Sealed-ledger files open for reads.", f.open)
        yield GaugeMetricFamily(
            "compactor_ledger_files_limit", "Sealed-ledger files that may be open.", f.max_open
        )
        for name, doc, value in (
            ("compactor_ledger_file_cache_hits", "Reads that found their file open.", f.hits),
            ("compactor_ledger_file_cache_misses", "Reads that had to open their file.", f.misses),
            ("compactor_ledger_file_cache_evictions", "Files closed to stay within the limits.", f.evictions),
        ):
            yield CounterMetricFamily(name, doc, value)
        g = st.row_groups
        yield GaugeMetricFamily(
            "compactor_row_group_cache_bytes", "Decoded row groups cached, bytes.", g.cached_bytes
        )
        yield GaugeMetricFamily(
            "compactor_row_group_cache_limit_bytes", "Bytes the row-group cache may hold.", g.max_bytes
        )
        for name, doc, value in (
            ("compactor_row_group_cache_hits", "Row groups read from the cache.", g.hits),
            ("compactor_row_group_cache_misses", "Row groups decoded from their file.", g.misses),
            (
                "compactor_row_group_cache_evictions",
                "Row groups dropped to stay within the limit.",
                g.evictions,
            ),
        ):
            yield CounterMetricFamily(name, doc, value)


def _subscription_backlog(topic: ManagedTopic, sub: Subscription) -> tuple[int, int]:
    # As the topic stats compute it: the way its last consumer reads, minus individual acks.
    return backlog_of(topic, sub.mark_delete, sub.read_compacted, len(sub.acked))


class ServiceMetrics:
    """Every metric of one service instance, on its own registry (so that apps made in one
    process, as tests make them, never share a series): the service's own metric objects, the
    process metrics, and the per-topic collector once the broker exists."""

    def __init__(self) -> None:
        # No ``*_created`` series (Pulsar has none): a scrape's cost is per line, and they
        # would add one per counter and histogram child for no use Prometheus makes of them.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.compaction = CompactionMetrics()
        self.integrity = IntegrityMetrics(self.registry)
        self.http_requests = Counter(
            "compactor_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "compactor_http_request_duration_seconds",
            "HTTP request latency by method and route template.",
            ["method", "route"],
            buckets=HTTP_BUCKETS_S,
            registry=self.registry,
        )
        self.scheduler_decisions = Counter(
            "compactor_scheduler_decisions",
            "Compactions the scheduler started, by the rule that fired.",
            ["trigger"],
            registry=self.registry,
        )
        self.spark_job_seconds = Histogram(
            "compactor_spark_job_seconds",
            "Time of a compaction round's Spark work by phase.",
            ["phase"],
            buckets=SPARK_BUCKETS_S,
            registry=self.registry,
        )
        self.wal_fsync_seconds = Histogram(
            "compactor_wal_fsync_seconds",
            "Latency of write-ahead log fsyncs (one per group commit).",
            buckets=FSYNC_BUCKETS_S,
            registry=self.registry,
        )
        self.wal_flush_seconds = Histogram(
            "compactor_wal_flush_seconds",
            "Latency of write-ahead object flushes (COMPACTOR_WAL=object): one upload and one "
            "metadata commit, for every topic of the instance.",
            buckets=FLUSH_BUCKETS_S,
            registry=self.registry,
        )
        # What scrapes cost the service: the CPU time each spends collecting and rendering (its
        # own thread's, so a busy server's other work does not count), for operators who scrape
        # often and for the benchmark that bounds the cost.
        self.scrapes = Counter(
            "compactor_metrics_scrapes", "Scrapes of /metrics served.", registry=self.registry
        )
        self.scrape_cpu_seconds = Counter(
            "compactor_metrics_scrape_cpu_seconds",
            "CPU time spent collecting and rendering /metrics.",
            registry=self.registry,
        )
        self._topics: TopicCollector | None = None
        self._resources: ResourceCollector | None = None
        # Children by label values: ``labels()`` builds a key and takes a lock on every call.
        self._http_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def watch(self, broker: Broker) -> None:
        """Start reporting ``broker``'s topics, and the write-ahead logs' fsyncs."""
        if self._topics is not None:
            self.registry.unregister(self._topics)
        self._topics = TopicCollector(broker, self.compaction)
        self.registry.register(self._topics)
        if self._resources is not None:
            self.registry.unregister(self._resources)
        self._resources = ResourceCollector(broker)
        self.registry.register(self._resources)
        wal.fsync_observer = self.wal_fsync_seconds.observe
        object_wal.flush_observer = self.wal_flush_seconds.observe

    def unwatch(self) -> None:
        if self._topics is not None:
            self.registry.unregister(self._topics)
            self._topics = None
        if self._resources is not None:
            self.registry.unregister(self._resources)
            self._resources = None
        if wal.fsync_observer == self.wal_fsync_seconds.observe:
            wal.fsync_observer = None
        if object_wal.flush_observer == self.wal_flush_seconds.observe:
            object_wal.flush_observer = None

    def render(self) -> bytes:
        """The text exposition of every metric, counting its own CPU time (seen by the next scrape)."""
        start = time.thread_time()
        body = generate_latest(self.registry)
        self.scrapes.inc()
        self.scrape_cpu_seconds.inc(time.thread_time() - start)
        return body

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        children = self._http_children.get(key)
        if children is None:
            children = (
                self.http_requests.labels(method, route, str(status)),
                self.http_latency.labels(method, route),
            )
            self._http_children[key] = children
        children[0].inc()
        children[1].observe(seconds)
