"""The console of ``compactor serve`` as a user watches it: the start-up, its warm-up, the minute
after it (Spark retires the idle Python workers), Ctrl-C. A healthy service prints no traceback."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.e2e

# What a failure on the console looks like: a traceback, an exception's line
# ("BrokenPipeError: [Errno 32] Broken pipe"), PySpark's daemon's own report of one.
FAILURE = re.compile(r"Traceback|\w+Error\b|PySpark daemon failed")


def _parents() -> dict[int, int]:
    """Every process's parent (Linux)."""
    found: dict[int, int] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        found[int(name)] = int(stat.rpartition(")")[2].split()[1])  # after "pid (comm)": state ppid
    return found


def python_workers(server_pid: int) -> list[int]:
    """The local Python workers under the server process: the children of the daemon
    (``compactor.daemon``) that its JVM started."""
    parents = _parents()
    below = {server_pid}
    for _ in range(4):  # server -> JVM -> daemon -> worker
        below |= {pid for pid, parent in parents.items() if parent in below}
    daemons = set()
    for pid in below:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"compactor.daemon" in argv[1:3]:  # python -m compactor.daemon pyspark.worker
            daemons.add(pid)
    return sorted(pid for pid in daemons if parents.get(pid) in daemons)


def _health_once(url: str, reached: Callable[[dict[str, Any]], bool], within: float = 180) -> dict[str, Any]:
    """The server's ``/health`` answer, polled until ``reached`` says yes (within ``within`` s)."""
    deadline = time.monotonic() + within
    while True:
        health: dict[str, Any] = httpx.get(f"{url}/health", timeout=5).json()
        if reached(health):
            return health
        assert time.monotonic() < deadline, health
        time.sleep(0.25)


def test_start_up_idle_workers_and_ctrl_c_print_no_traceback(server_factory, tmp_path: Path) -> None:
    # Issue 28: a minute after the warm-up, Spark retires its idle Python workers by closing
    # their sockets, and PySpark's worker printed "BrokenPipeError: [Errno 32] Broken pipe" with
    # a traceback for each (its daemon.py, outfile.flush()).
    srv = server_factory(
        tmp_path / "data",
        # The warm-up round and a few of its empty jobs (all of them: 150, ~13 s).
        env={"COMPACTOR_SPARK_WARMUP": "true", "COMPACTOR_SPARK_WARMUP_JOBS": "5"},
    )
    srv.start()
    assert srv.proc is not None
    health = _health_once(srv.url, lambda h: h["compaction"] != "starting" and "warmingUp" not in h)
    assert health == {"status": "ok", "compaction": "available", "brokerServiceUrl": srv.pulsar_url}
    assert python_workers(srv.proc.pid), "the warm-up's workers wait for their next task"

    # Spark retires them after a minute without a task (PythonWorkerFactory: a fixed minute,
    # checked every 10 s; no setting shortens it).
    deadline = time.monotonic() + 150
    while python_workers(srv.proc.pid):
        assert time.monotonic() < deadline, "Spark did not retire its idle workers"
        time.sleep(0.5)
    time.sleep(1)  # the JVM copies its daemon's stderr to the console

    srv.proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert srv.proc.wait(60) == 0
    console = srv.log.read_text()
    assert not [line for line in console.splitlines() if FAILURE.search(line)], console


def test_ctrl_c_while_the_warm_up_runs_spark_jobs_prints_nothing_and_stops_promptly(
    server_factory, tmp_path: Path
) -> None:
    # A user who presses Ctrl-C in the first seconds stops the service while its warm-up runs
    # Spark jobs: the JVM logged "Failed to update accumulator" (Connection reset, Broken pipe)
    # with Java stack traces as the Python side went away under a running job.
    srv = server_factory(
        tmp_path / "data",
        # Empty jobs for far longer than the test: one is running when Ctrl-C comes.
        env={"COMPACTOR_SPARK_WARMUP": "true", "COMPACTOR_SPARK_WARMUP_JOBS": "100000"},
    )
    srv.start()
    assert srv.proc is not None
    # Spark is up and the warm-up runs its jobs.
    _health_once(srv.url, lambda h: h["compaction"] == "available" and "warmingUp" in h)
    time.sleep(3)
    srv.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    assert srv.proc.wait(60) == 0
    assert time.monotonic() - t0 < 30
    console = srv.log.read_text()
    assert not [line for line in console.splitlines() if FAILURE.search(line) or " ERROR " in line], console
