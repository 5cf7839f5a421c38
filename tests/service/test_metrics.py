"""The per-topic collector and the compaction totals, in process: a failed round counts, a
round with nothing to do counts as a success, a re-created topic starts again from zero."""

from __future__ import annotations

import pytest

from compactor import TwoPhaseCompactor
from ledger.entry import Record
from service.compaction import CompactionService
from service.compaction_runs import ERROR, SUCCESS
from service.metrics import ServiceMetrics
from service.names import TopicName
from service.topics import Broker

pytestmark = pytest.mark.spark

NAME = TopicName("public", "default", "m")
LABELS = {"namespace": "public/default", "topic": "persistent://public/default/m"}


def value(metrics: ServiceMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name, LABELS)


def test_failed_and_empty_rounds_and_a_recreated_topic(broker: Broker, spark) -> None:
    metrics = ServiceMetrics()
    metrics.watch(broker)
    svc = CompactionService(
        broker=broker, compactor=lambda: TwoPhaseCompactor(spark, min_part_bytes=0), metrics=metrics
    )
    svc.start()
    try:
        broker.create_topic(NAME)
        # Never compacted: no compaction series yet (as Pulsar), the topic's others are there.
        assert value(metrics, "pulsar_compaction_succeed_count") is None
        assert value(metrics, "pulsar_in_messages_total") == 0
        assert svc.compact_now(NAME).status == SUCCESS  # nothing to compact: a quick success
        assert value(metrics, "pulsar_compaction_succeed_count") == 1
        broker.produce(NAME, [Record(key="k", value=b"v")] * 3)

        def fail(at: str) -> None:
            if at == "phase_two":
                raise RuntimeError("injected")

        svc.fault_hook = fail
        assert svc.compact_now(NAME).status == ERROR
        assert value(metrics, "pulsar_compaction_failed_count") == 1
        assert value(metrics, "pulsar_compaction_succeed_count") == 1
        assert value(metrics, "pulsar_compaction_latency_ms_count") == 2
        assert value(metrics, "pulsar_compaction_compacted_entries_count") == 0
        svc.fault_hook = None
        assert svc.compact_now(NAME).status == SUCCESS
        assert value(metrics, "pulsar_compaction_removed_event_count") == 2
        assert value(metrics, "pulsar_compaction_compacted_entries_count") == 1
        assert value(metrics, "pulsar_in_messages_total") == 3

        broker.delete_topic(NAME)
        assert value(metrics, "pulsar_compaction_succeed_count") is None
        broker.create_topic(NAME)  # the same name again: starts from nothing
        assert value(metrics, "pulsar_compaction_succeed_count") is None
        assert value(metrics, "pulsar_in_messages_total") == 0
    finally:
        svc.stop()
        metrics.unwatch()
