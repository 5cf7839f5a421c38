"""The daemon of the compaction's local Python workers: PySpark's, with the tasks' imports done.

Spark starts one Python daemon per executor and forks a worker from it for each task slot;
a worker left idle for a minute is stopped (``PythonWorkerFactory``'s idle timeout), so a
round that follows a minute without one -- every round of a service whose topics compact now
and then -- starts on fresh workers. A fresh worker forked from PySpark's own daemon then
imports PySpark's worker, pyarrow, numpy, pandas and the compactor before its first task can
run: about half a second of CPU per worker on a quiet machine, seconds on a busy one, in
every such round (and not in a benchmark whose rounds follow each other). Measured on the
shared 2-core machine: a two-task job took 0.86 s warm and 12.0 s after 70 s idle with
PySpark's daemon, 5.2 s with this one (before it imported ``pyspark.worker`` too). Imported
here once, before the daemon forks, every worker starts with them loaded.

Used in local mode only (``compactor.spark.spark_conf``): there the workers run the service's
own interpreter, which has the project installed. On a cluster the executors get the
project's code per task (``addPyFile``), after their daemon started, so they keep PySpark's.
"""

from __future__ import annotations

import gc

import numpy  # noqa: F401
import pandas  # noqa: F401
import pyarrow  # noqa: F401
import pyarrow.compute  # noqa: F401
import pyarrow.ipc  # noqa: F401
import pyarrow.parquet  # noqa: F401
import pyspark.worker  # noqa: F401  (what a worker runs; imported by each fresh worker otherwise)
from pyspark import daemon

import compactor.arrow_phases  # noqa: F401

if __name__ == "__main__":
    # PySpark's worker runs a full collection after every task. Frozen, the objects of these
    # imports (most of a worker's) are left out of it: ~90 ms of a core per task otherwise,
    # on this machine. Frozen before the forks, as gc.freeze's documentation advises, so
    # that collections in the workers do not write to the pages they share with the daemon.
    gc.freeze()
    daemon.manager()
