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

A worker that Spark retires exits quietly. Spark retires an idle worker (after that minute,
and every idle one when it stops) by closing its socket between two tasks, for the worker to
exit (``PythonWorkerFactory.cleanupIdleWorkers``). PySpark's worker, waiting there for its next
task, takes the end of the stream for a failed task: it writes an ``EOFError`` to the closed
socket, the write fails, and its daemon prints the ``BrokenPipeError`` with a traceback on the
service's console (``spark.python.daemon.killWorkerOnFlushFailure``, on by default since Spark
4.1): one per idle worker a minute after every round, the first ones a minute after the
start-up warm-up. Here a worker waits for its next task's first byte before PySpark's worker
reads the task, and exits at the end of the stream instead (:func:`next_task`); a worker whose
socket Spark closed while it was still writing to it (a task Spark gave up on, which Spark
reports itself) exits quietly too (:func:`serve`). Any other error in a worker is printed as
before, and a task's exception reaches Spark as before: PySpark's worker sends it to the JVM,
which is reading.
"""

from __future__ import annotations

import gc
import io
import socket

import numpy  # noqa: F401
import pandas  # noqa: F401
import pyarrow  # noqa: F401
import pyarrow.compute  # noqa: F401
import pyarrow.ipc  # noqa: F401
import pyarrow.parquet  # noqa: F401
import pyspark.worker  # what a worker runs; imported by each fresh worker otherwise
from pyspark import daemon

import compactor.arrow_phases  # noqa: F401
import compactor.sql_paths  # noqa: F401

# PySpark's daemon runs each task of a worker with its ``worker``, which runs the worker
# module's ``main``.
_pyspark_worker = daemon.worker
_pyspark_main = pyspark.worker.main

# What a retired worker's ``worker`` returns to PySpark's daemon: not 0, so that the daemon ends
# the worker (exit status 0) instead of waiting for another task on its socket.
RETIRED = 1


def next_task(infile: io.BufferedReader, outfile: io.BufferedWriter) -> None:
    """``pyspark.worker.main``: runs the next task once its first byte has arrived; raises
    ``SystemExit(RETIRED)`` at the end of the stream instead (Spark closed the idle worker's
    socket), having written nothing."""
    try:
        retired = not infile.peek(1)
    except ConnectionResetError:
        retired = True
    if retired:
        raise SystemExit(RETIRED)  # PySpark's ``worker`` returns the code to its daemon
    _pyspark_main(infile, outfile)


def serve(sock: socket.socket, authenticated: bool) -> int:
    """``pyspark.daemon.worker``: one task; ``RETIRED`` when Spark closed the socket while the
    worker was still writing to it (nothing reads it any more)."""
    try:
        return _pyspark_worker(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError):
        return RETIRED


if __name__ == "__main__":
    # Every task of every worker forked from here goes through both (see the module docstring).
    pyspark.worker.main = next_task
    daemon.worker = serve
    # PySpark's worker runs a full collection after every task. Frozen, the objects of these
    # imports (most of a worker's) are left out of it: ~90 ms of a core per task otherwise,
    # on this machine. Frozen before the forks, as gc.freeze's documentation advises, so
    # that collections in the workers do not write to the pages they share with the daemon.
    gc.freeze()
    daemon.manager()
