"""The vs-pulsar benchmark's reading of pulsar-perf's output and its table, on lines pulsar-perf
4.0.6 printed (no broker, no Java: the benchmark itself runs only with ``--only vs-pulsar``)."""

from __future__ import annotations

import math

import pytest

from tests.benchmarks.report import vs_pulsar_tables
from tests.benchmarks.vs_pulsar import BrokerRuns, Run, VsPulsarParams, VsPulsarResult, parse_perf

# Whole lines as pulsar-perf printed them (trimmed to what is read), one string each.
PRODUCE = "\n".join(
    [
        "02:35:45.806 INFO  PerformanceProducer - Created 1 producers",
        "02:35:54.621 INFO  PerformanceProducer - Throughput produced:  347523 msg ---  34751.6 msg/s --- "
        "    26.5 Mbit/s  --- failure      0.0 msg/s --- Latency: mean: 2805.496 ms - med: 2501.263 - "
        "95pct: 4169.471 - 99pct: 4184.175 - 99.9pct: 4384.479 - 99.99pct: 4386.175 - Max: 4386.911",
        "02:35:56.850 INFO  PerformanceProducer - ------------- DONE (reached the maximum duration: "
        "[11 seconds] of production) --------------",
        "02:36:04.657 ERROR PerfClientUtils - Failed to close client",
        "org.apache.pulsar.client.api.PulsarClientException: java.lang.InterruptedException",
        "02:36:04.695 INFO  PerformanceProducer - Aggregated throughput stats --- 956366 records sent --- "
        "47032.563 msg/s --- 35.883 Mbit/s ",
        "02:36:05.223 INFO  PerformanceProducer - Aggregated latency stats --- Latency: mean: 6661.325 ms - "
        "med: 7105.503 - 95pct: 10389.887 - 99pct: 10635.071 - 99.9pct: 10700.000 - 99.99pct: 10710.000 - "
        "99.999pct: 10711.000 - Max: 10712.000",
    ]
)
CONSUME = "\n".join(
    [
        "02:32:38.932 INFO  PerformanceConsumer - Start receiving from 1 consumers per subscription "
        "on 1 topics",
        "02:32:44.625 INFO  PerformanceConsumer - ------------------- DONE -----------------------",
        "02:32:44.635 INFO  PerformanceConsumer - Aggregated throughput stats --- 1476516 records "
        "received --- 258952.397 msg/s --- 197.565 Mbit/s --- AckRate: 258952.22117966934  msg/s "
        "--- ack failed 0 msg",
        "02:32:44.692 INFO  PerformanceConsumer - Aggregated latency stats --- Latency: mean: 25636.504 ms - "
        "med: 25516 - 95pct: 26248 - 99pct: 26284 - 99.9pct: 26287 - 99.99pct: 26287 - 99.999pct: 26288 - "
        "Max: 26288",
    ]
)


def test_a_produce_run() -> None:
    run = Run("produce-1")
    parse_perf(PRODUCE, run)
    assert run.messages == 956_366
    assert run.rate == pytest.approx(47_032.563)
    assert (run.p50_ms, run.p99_ms, run.max_ms) == pytest.approx((7105.503, 10635.071, 10712.0))
    assert run.intervals == [pytest.approx(34_751.6)]
    assert run.window_s == pytest.approx(11.044)
    # Sent in 11.044 s, the last acknowledged at most 10.712 s later; pulsar-perf's Aggregated
    # time (20.3 s) is shorter.
    assert run.acked_rate == pytest.approx(47_032.563)
    run.rate = 30_000.0
    assert run.acked_rate == pytest.approx(956_366 / (11.044 + 10.712))


def test_a_consume_run_is_timed_from_its_first_message_to_its_last() -> None:
    run = Run("consume")
    parse_perf(CONSUME, run)
    assert run.messages == 1_476_516
    assert run.window_s == pytest.approx(5.693)
    assert run.acked_rate == pytest.approx(1_476_516 / 5.693)


def test_no_aggregated_line_is_an_error() -> None:
    with pytest.raises(ValueError, match="Aggregated"):
        parse_perf(PRODUCE.split("\n02:36:04.695")[0], Run("produce-1"))


def test_a_table_per_mode_with_ratios_and_a_missed_rate_marked() -> None:
    def runs(name: str, scale: float) -> BrokerRuns:
        side = BrokerRuns(name, ready_s=3.0)
        for what, n in (("produce-1", 100_000), ("produce-4", 200_000), ("consume", 100_000)):
            run = Run(what, messages=int(n * scale), rate=n * scale / 10, window_s=1.0, max_ms=0.0)
            run.broker_cpu_s, run.wall_s, run.load = 2.0, 5.0, (1.5, 1.0, 0.5)
            side.runs[what] = run
        for at in (10_000, 50_000):
            sent = at * scale * 5
            run = Run(f"latency-{at}", messages=int(sent), window_s=5.0, max_ms=10.0, p50_ms=2.0, p99_ms=9.0)
            side.runs[run.what] = run
        return side

    result = VsPulsarResult(VsPulsarParams(seconds=5, modes=("durable",)), "4.0.7")
    result.modes["durable"] = {"Pulsar": runs("Pulsar", 1.0), "service": runs("service", 0.5)}
    (table,) = vs_pulsar_tables(result)
    rows = {row[0]: row for row in table.rows}
    assert rows["produce, 1 producer (msg/s)"][1:4] == ["100,000", "50,000", "0.50x"]
    # Half the messages asked for acknowledged: the service's latency cells are marked, Pulsar's not.
    assert rows["publish latency p50 at 10,000 msg/s (ms)"][1:3] == ["2.00", "2.00 *"]
    assert rows["broker CPU s per million consumed"][1:4] == ["20.00", "40.00", "2.00x"]
    assert rows["produce, 1 producer (msg/s)"][4] == "1.50 / 1.50"
    assert any(n.startswith("*:") for n in table.notes)
    assert not math.isnan(result.modes["durable"]["Pulsar"].runs["consume"].acked_rate)


def test_errors_name_the_broker_and_the_run() -> None:
    result = VsPulsarResult(VsPulsarParams(modes=("durable",)), "4.0.7")
    ok = BrokerRuns("Pulsar", runs={"produce-1": Run("produce-1", messages=1)})
    failed = BrokerRuns("service", runs={"consume": Run("consume", error="no 'Aggregated' line")})
    result.modes["durable"] = {"Pulsar": ok, "service": failed}
    assert result.errors() == ["vs-pulsar (durable) service consume: no 'Aggregated' line"]
    failed.error = "RuntimeError: server exited"
    assert result.errors()[0] == "vs-pulsar (durable) service: RuntimeError: server exited"
