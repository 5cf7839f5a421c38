"""What the compactor needs from a Spark cluster, and the checks that it has it.

- :func:`code_zip`: the packages the compactor's tasks import (``compactor`` and ``ledger``),
  zipped once per process from their installed sources, for ``SparkContext.addPyFile``. An
  executor then needs only an interpreter with pyarrow, numpy, pandas and fastavro: nothing of this
  project has to be installed on the cluster.
- :func:`check_executors`: a probe job whose tasks import pyarrow, numpy, pandas and fastavro and read a
  file the driver just wrote under the storage root. Compaction tasks read and write ledger
  files at the paths the driver names, so a local storage root must be mounted at the same
  path on every executor, and an object storage bucket must be reachable from every executor
  with the settings the driver has; when it is not (or the executors' interpreter lacks a
  package, or no executor takes the job), this says so in one line instead of letting every
  round fail in its tasks.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import re
import socket
import tempfile
import threading
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path

from pyspark.sql import SparkSession

from ledger.storage import StoragePath, as_storage_path

# The packages whose modules the compactor's tasks unpickle (arrow_phases, sql_paths and what
# they import).
SHIPPED_PACKAGES = ("compactor", "ledger")
# What an executor's interpreter must have.
EXECUTOR_PACKAGES = ("pyarrow", "numpy", "pandas", "fastavro")

PROBE_PREFIX = ".compactor-probe-"

_zip_lock = threading.Lock()
_zip: Path | None = None


class ExecutorsUnfit(RuntimeError):
    """The cluster's executors cannot run the compaction; the message is one line saying why."""


def _package_dir(name: str) -> Path:
    module = __import__(name)
    return Path(module.__file__).parent  # type: ignore[arg-type]


def build_code_zip(directory: Path) -> Path:
    """Zip the shipped packages' ``.py`` files into ``directory``; the name carries a digest of
    the content (Spark refuses a second file of one name with other bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in SHIPPED_PACKAGES:
            root = _package_dir(name)
            for path in sorted(root.rglob("*.py")):
                # A fixed timestamp: the same sources give the same bytes, hence the same name.
                info = zipfile.ZipInfo(str(Path(name) / path.relative_to(root)), (1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, path.read_bytes())
    data = buf.getvalue()
    out = Path(directory) / f"topic-compactor-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    out.write_bytes(data)
    return out


def code_zip() -> Path:
    """The zip of the shipped packages, built on the first call of the process (in a temporary
    directory of its own) and the same path afterwards."""
    global _zip
    with _zip_lock:
        if _zip is None or not _zip.exists():
            _zip = build_code_zip(Path(tempfile.mkdtemp(prefix="topic-compactor-code-")))
        return _zip


def one_line(error: BaseException) -> str:
    """An exception as one line: for an error raised in a Python task (whose message carries
    the worker's traceback and the JVM's), the last ``SomeError: message`` line of it."""
    text = str(error)
    found = re.findall(r"^(\w+(?:Error|Exception): .+)$", text, flags=re.MULTILINE)
    if found:
        return str(found[-1]).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _probe_task(probe: bytes, token: str, partitions: Iterable[int]) -> Iterator[tuple[str, str, str]]:
    """Runs on an executor: (host, working directory, error or "") per partition. ``probe`` is
    the pickled ``StoragePath`` of the probe file, unpickled here, after the packages it needs
    are found (a missing one is then reported, not a failure to start the task)."""
    for _ in partitions:
        error = ""
        try:
            for name in EXECUTOR_PACKAGES:
                __import__(name)
            path: StoragePath = pickle.loads(probe)
            local = path.local
            if local is not None:
                with open(local, encoding="utf-8") as f:
                    found = f.read()
            else:
                found = path.read_bytes().decode("utf-8")
            if found != token:
                error = f"{path} holds other content than the driver wrote"
        except OSError as e:  # without the probe's name: the same failure reads the same
            error = f"{type(e).__name__}: {e.strerror or e}"
        except Exception as e:  # reported, not raised: the driver words the one line
            error = f"{type(e).__name__}: {e}"
        yield socket.gethostname(), os.getcwd(), error


def check_executors(
    spark: SparkSession, storage_root: Path | StoragePath, *, timeout: float = 120.0
) -> list[str]:
    """Run the probe job (see the module docstring): at least one task per core of the
    cluster. Returns the hosts that ran it; raises :class:`ExecutorsUnfit`."""
    root = as_storage_path(storage_root)
    local = root.local
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    probe = root / f"{PROBE_PREFIX}{token}"
    sc = spark.sparkContext
    group = f"compactor-probe-{token}"
    results: list[tuple[str, str, str]] = []
    failure: list[BaseException] = []

    def run() -> None:
        sc.setJobGroup(group, "storage probe", interruptOnCancel=True)
        try:
            n = max(2, sc.defaultParallelism)
            rdd = sc.parallelize(range(n), n).mapPartitions(partial(_probe_task, pickle.dumps(probe), token))
            results.extend(rdd.collect())
        except BaseException as e:
            failure.append(e)

    try:
        if probe.local is not None:
            with open(probe.local, "w", encoding="utf-8") as f:
                f.write(token)
                f.flush()
                os.fsync(f.fileno())
        else:
            probe.write_bytes(token.encode("utf-8"))
        thread = threading.Thread(target=run, name="executor-probe", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            sc.cancelJobGroup(group)
            thread.join(30)
            raise ExecutorsUnfit(
                f"no executor ran the start-up probe within {timeout:g} s: "
                f"does the cluster at {sc.master} have workers with free cores and memory?"
            )
        if failure:
            raise ExecutorsUnfit(f"the executors could not run the start-up probe: {one_line(failure[0])}")
    finally:
        if probe.local is not None:
            probe.local.unlink(missing_ok=True)
        else:
            with contextlib.suppress(OSError):  # a leftover probe is harmless; the error above is not
                probe.unlink()
    bad = [(host, error) for host, _, error in results if error]
    if bad:
        host, error = bad[0]
        if "ModuleNotFoundError" in error or "ImportError" in error:
            raise ExecutorsUnfit(
                f"the executors' Python on {host} lacks a package the compaction needs ({error}): "
                f"it needs {', '.join(EXECUTOR_PACKAGES)} (COMPACTOR_SPARK_PYTHON, COMPACTOR_SPARK_ARCHIVES)"
            )
        if local is None:
            raise ExecutorsUnfit(
                f"the executors cannot read the storage {root} ({host}: {error}): every worker "
                "needs network access to it and the credentials the service has"
            )
        raise ExecutorsUnfit(
            f"the storage root {root} is not readable at the same path on the executors "
            f"({host}: {error}): mount it at {root} on every worker"
        )
    return sorted({host for host, _, _ in results})
