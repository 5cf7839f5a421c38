"""The benchmark suite (issue 6): ``python -m tests.benchmarks [--quick]``, or ``make bench`` /
``make bench-quick``. Not collected by pytest (no ``test_*.py`` here).

Modules: ``workload`` (synthetic sealed ledgers), ``compactors`` (the project, DuckDB and a
plain Python compactor, and the row-for-row output check), ``measure`` (timing, RSS and CPU
sampling), ``runner`` (full, incremental and per-size rounds), ``serving`` (a real
``compactor serve`` through ``api.client``), ``soak`` (descriptors and RSS of a real server over
minutes of produce, consume and compaction), ``report`` (tables, targets, plot,
BENCHMARKS.md), ``spark_profile`` (stage metrics from Spark's event log, ``--spark-profile``).
"""
