"""The benchmark suite (issue 6): ``python -m tests.benchmarks [--quick]``, or ``make bench`` /
``make bench-quick``. The benchmarks are not collected by pytest; their unit tests (``test_*.py``:
the report, the reading of pulsar-perf's output) are, and run without a benchmark.

Modules: ``workload`` (synthetic sealed ledgers), ``compactors`` (the project, DuckDB and a
plain Python compactor, and the row-for-row output check), ``measure`` (timing, RSS and CPU
sampling), ``runner`` (full, incremental and per-size rounds), ``serving`` (a real
``compactor serve`` through ``api.client``), ``soak`` (descriptors and RSS of a real server over
minutes of produce, consume and compaction), ``report`` (tables, targets), ``document``
(BENCHMARKS.md: today's figures by area, a run replacing the blocks it measured), ``plots`` (PNGs
from figures, into ``docs/img``), ``spark_profile`` (stage metrics from Spark's event log,
``--spark-profile``).
"""
