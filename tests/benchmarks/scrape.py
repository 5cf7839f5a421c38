"""What a Prometheus scraper costs produce and consume: one server, the serving benchmark's
workloads in blocks, with and without a scraper of ``GET /metrics``, alternating.

Comparing two whole ``serving`` sections (two servers, minutes apart) measured mostly the
machine's drift: their pairs disagreed by ±40% on a quiet 2-core machine. Here both sides run
on the same server, block after block (without, with; then with, without), so drift falls on
both alike, and each block is long enough to hold several scrapes: a produce of ``batches`` x
1,000 messages from one client, a full replay of the state topic, and ``compacted_repeats``
readCompacted loads of it. Each figure is reported as the median of its blocks per side and as
the median of the per-pair changes. The server's CPU per message is the steadier figure: the
client shares the cores, and the server's CPU includes every scrape that fell in the block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.benchmarks.serving import Scraper, ServingBench, ServingParams, ServingResult, scrape_cpu_seconds

FIGURES = ("produce", "consume_full", "consume_compacted")


@dataclass
class Block:
    """One block's throughput (msg/s), server CPU per message (µs), and the server CPU its
    scrapes took (s, from the service's own ``compactor_metrics_scrape_cpu_seconds``) against all
    the server's CPU and the wall time of the workload (s), by workload."""

    rate: dict[str, float] = field(default_factory=dict)
    cpu_us: dict[str, float] = field(default_factory=dict)
    scrape_cpu_s: dict[str, float] = field(default_factory=dict)
    server_cpu_s: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)


def scrape_counters(url: str) -> tuple[float, float]:
    """The service's count of scrapes served and the CPU seconds they took, as of this scrape
    (whose own cost the next one counts)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        if family.name in ("compactor_metrics_scrapes", "compactor_metrics_scrape_cpu_seconds"):
            found[family.name] = family.samples[0].value
    # A service from before these counters: none (its blocks then show no scrape CPU).
    return found.get("compactor_metrics_scrapes", 0.0), found.get("compactor_metrics_scrape_cpu_seconds", 0.0)


@dataclass
class ScrapeResult:
    interval_s: float
    pairs: list[tuple[Block, Block]] = field(default_factory=list)  # (without, with)
    scrapes: list[float] = field(default_factory=list)  # seconds of each scrape
    scrape_cpu_s: float = 0.0  # server CPU per scrape, back to back, after the blocks
    topics: int = 0
    metrics_lines: int = 0


class ScrapeBench:
    def __init__(
        self,
        work_dir: Path,
        params: ServingParams,
        *,
        pairs: int,
        interval_s: float = 1.0,
        compacted_repeats: int = 5,
        log: Callable[[str], None] = print,
    ) -> None:
        self.serving = ServingBench(work_dir, params, log=log)
        self.params = params
        self.pairs = pairs
        self.interval_s = interval_s
        self.compacted_repeats = compacted_repeats
        self.log = log
        self._loads = 0

    def run(self) -> ScrapeResult:
        import httpx

        result = ScrapeResult(self.interval_s)
        serving = self.serving
        serving.server.start()
        try:
            with serving.client() as client:
                serving.open(client)
                state = ServingResult(self.params)
                topic = serving.prepare_state(client, state)
                for i in range(self.pairs):
                    sides: dict[bool, Block] = {}
                    for scraped in (False, True) if i % 2 == 0 else (True, False):
                        with contextlib.ExitStack() as stack:
                            if scraped:
                                scraper = Scraper(serving.server.url, self.interval_s, result.scrapes)
                                stack.enter_context(scraper)
                            sides[scraped] = self._block(client, topic, state)
                        b = sides[scraped]
                        self.log(
                            f"scrape pair {i + 1} {'with' if scraped else 'without'} a scraper: "
                            + ", ".join(f"{k} {b.rate[k]:,.0f}/s {b.cpu_us[k]:.2f} µs" for k in FIGURES)
                        )
                    result.pairs.append((sides[False], sides[True]))
            result.scrape_cpu_s = scrape_cpu_seconds(serving.server.url)
            body = httpx.get(f"{serving.server.url}/metrics", timeout=30).text
            result.metrics_lines = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
            result.topics = serving._topics
        finally:
            serving.server.stop()
        return result

    def _block(self, client, topic: str, state: ServingResult) -> Block:  # type: ignore[no-untyped-def]
        serving = self.serving
        url = serving.server.url
        block = Block()

        def measured(name: str, messages: int, work: Callable[[], float]) -> None:
            """``work`` returns its seconds; the scrape counters are read outside the window."""
            scrapes0, scrape_cpu0 = scrape_counters(url)
            cpu = serving.server_cpu_s()
            seconds = work()
            cpu = serving.server_cpu_s() - cpu
            scrapes1, scrape_cpu1 = scrape_counters(url)
            # The second read counts the first one's cost too: take it out at the mean per scrape.
            served = scrapes1 - scrapes0
            block.scrape_cpu_s[name] = (scrape_cpu1 - scrape_cpu0) * (served - 1) / served if served else 0.0
            block.server_cpu_s[name] = cpu
            block.wall_s[name] = seconds
            block.rate[name] = messages / seconds
            block.cpu_us[name] = cpu / messages * 1e6

        produced = self.params.batches * 1000
        measured("produce", produced, lambda: produced / serving._produce(client, threads=1))
        self._loads += 1
        n = self._loads

        def full() -> float:
            return serving._load(client, topic, f"scrape-full-{n}", False, state.full_messages)[0]

        def compacted() -> float:
            return sum(
                serving._load(client, topic, f"scrape-compacted-{n}-{j}", True, state.compacted_messages)[0]
                for j in range(self.compacted_repeats)
            )

        measured("consume_full", state.full_messages, full)
        measured("consume_compacted", state.compacted_messages * self.compacted_repeats, compacted)
        return block
