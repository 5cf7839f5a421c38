"""The local workers' daemon (``compactor.daemon``), started as Spark's ``PythonWorkerFactory``
starts it: a retired worker exits quietly, errors still reach Spark and the console."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

# SpecialLengths.PYTHON_EXCEPTION_THROWN: what a worker writes before a failure's text.
PYTHON_EXCEPTION_THROWN = -2


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"{len(data)} of {n} bytes")
        data += chunk
    return data


@contextmanager
def workers_daemon(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``python -m compactor.daemon pyspark.worker`` with the environment Spark 4.3 gives it in
    local mode (Unix domain sockets; a worker killed when a flush fails, the default); yields
    its socket path and the file of its stderr (its console), then stops it as the JVM does
    (closes its stdin)."""
    env = {
        **os.environ,
        "PYTHON_UNIX_DOMAIN_ENABLED": "True",
        "PYTHON_WORKER_FACTORY_SOCK_DIR": str(tmp_path),
        "PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE": "1",
        "SPARK_REUSE_WORKER": "1",
        "PYTHONUNBUFFERED": "YES",
    }
    console = tmp_path / "daemon.stderr"
    with open(console, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "compactor.daemon", "pyspark.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    try:
        assert proc.stdout is not None
        (length,) = struct.unpack("!i", proc.stdout.read(4))
        yield proc.stdout.read(length).decode(), console
    finally:
        proc.communicate(timeout=30)


def _worker(path: str) -> tuple[socket.socket, int]:
    """A worker forked for a new connection, as the JVM gets one: its socket and pid."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    (pid,) = struct.unpack("!i", _read(sock, 4))
    return sock, pid


def _wait_gone(pid: int) -> None:
    """Until process ``pid`` (a child of the daemon, which ignores SIGCHLD) is gone."""
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"worker {pid} still runs"
        time.sleep(0.02)


def test_a_worker_whose_socket_spark_closes_exits_quietly(tmp_path: Path) -> None:
    # Spark retires an idle worker by closing its socket (PythonWorkerFactory's idle timeout,
    # and when it stops). PySpark's worker took that for a failed task and its daemon printed
    # "BrokenPipeError: [Errno 32] Broken pipe" with a traceback on the service's console.
    with workers_daemon(tmp_path) as (path, console):
        for _ in range(2):
            sock, pid = _worker(path)
            sock.close()
            _wait_gone(pid)
    assert console.read_text() == ""


def test_a_workers_error_still_reaches_spark(tmp_path: Path) -> None:
    # Anything but the end of the stream is handed to PySpark's worker, whose failure the JVM
    # reads as before (here: a message that is not a task's start).
    with workers_daemon(tmp_path) as (path, _):
        sock, pid = _worker(path)
        with sock:
            sock.sendall(struct.pack("!i", 12345))
            (code,) = struct.unpack("!i", _read(sock, 4))
            (length,) = struct.unpack("!i", _read(sock, 4))
            failure = _read(sock, length).decode()
        _wait_gone(pid)
    assert code == PYTHON_EXCEPTION_THROWN
    assert "AssertionError" in failure and "12345" in failure


@pytest.mark.spark
def test_a_tasks_exception_reaches_the_driver(spark: SparkSession) -> None:
    # The session's local workers are forked by compactor.daemon.
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == "compactor.daemon"
    with pytest.raises(Exception, match="ZeroDivisionError"):
        spark.sparkContext.parallelize(range(2), 2).map(lambda x: x // 0).collect()


def test_a_worker_whose_socket_breaks_mid_task_exits_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    # Spark closed the socket while the worker was still writing to it (a task Spark gave up
    # on, which it reports itself): the daemon ends the worker without a traceback. Any other
    # error goes on to PySpark's daemon, which prints it.
    from compactor import daemon

    def worker(error: BaseException) -> Callable[[socket.socket, bool], int]:
        def run(sock: socket.socket, authenticated: bool) -> int:
            raise error

        return run

    a, b = socket.socketpair()
    with a, b:
        for gone in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "Connection reset")):
            monkeypatch.setattr(daemon, "_pyspark_worker", worker(gone))
            assert daemon.serve(a, True) == daemon.RETIRED != 0
        monkeypatch.setattr(daemon, "_pyspark_worker", worker(ValueError("a bug")))
        with pytest.raises(ValueError, match="a bug"):
            daemon.serve(a, True)
