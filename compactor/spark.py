"""The SparkSession factory: one session per process, configured for compaction.

``get_spark()`` creates the session on first use and returns the same one afterwards (the
arguments of later calls are ignored); ``stop_spark()`` stops it at process shutdown.

What the configuration does, and why:

- adaptive query execution with partition coalescing: the compaction's shuffles are sized
  from the data at run time, so small topics do not produce hundreds of tiny part files;
- ``spark.sql.session.timeZone=UTC``: nothing here is zoned, but never depend on the host's zone;
- no ``_SUCCESS`` markers and no ``.crc`` side files (the raw local file system): a compacted
  ledger directory holds part files and its manifest only;
- LZ4 Parquet for what Spark SQL writes, as the compacted parts written with Arrow
  (``parts.PART_CODEC``);
- Python workers reach the JVM over a Unix domain socket, which halves the fixed cost of a
  job with Python tasks;
- every Python worker starts with ``WORKER_ENV`` (pyarrow's allocator without transparent
  huge pages);
- in local mode: the driver binds to 127.0.0.1, the shuffle has 2 partitions per core, the
  JVM logs only warnings (a log4j2 configuration is handed to the driver JVM at launch), and
  the Python workers are forked from a daemon that has imported what their tasks need
  (``compactor.daemon``): Spark stops idle workers after a minute, and a service's round
  otherwise starts on fresh ones that import pyarrow first;
- on a cluster (any other master): the executors' interpreter is ``python``
  (``spark.pyspark.python``), ``archives`` are unpacked beside each executor (``spark.archives``,
  e.g. a venv-pack'ed environment), and the code the tasks import is shipped to them as a zip
  (``compactor.cluster.code_zip``, through ``addPyFile``), so an executor needs only pyarrow,
  numpy and pandas. Local mode needs no zip: its Python workers run this interpreter, which
  has the project installed.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

APP_NAME = "topic-compactor"

_lock = threading.Lock()
_session: SparkSession | None = None

_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")

# Handed to the driver JVM with -Dlog4j2.configurationFile (the tests' standalone cluster uses it
# too). Without it Spark installs its own default profile and announces so on the console, and
# Hadoop warns about native libraries.
LOG4J2_PROPERTIES = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.hadoop_native.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop_native.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.parquet_shaded.name = shaded.parquet
logger.parquet_shaded.level = error
"""


# Set in every Python worker's environment (spark.executorEnv), before pyarrow loads:
# - MIMALLOC_ALLOW_THP=0: pyarrow's allocator (mimalloc 3) asks for transparent huge pages on
#   its 1 GiB arenas, so on a kernel whose THP mode is "madvise" (Debian's, Ubuntu's) the first
#   touch of every 2 MiB of them zeroes 2 MiB, again after each purge of freed memory, and a
#   task's decoding buffers come and go: the kernel's page clearing took 16-17% of a full
#   round's CPU (perf, the long-keys shape in process), 1% without; the round 15% less time.
WORKER_ENV: dict[str, str] = {"MIMALLOC_ALLOW_THP": "0"}


def local_cores(master: str) -> int | None:
    """Cores a ``local``/``local[N]``/``local[*]`` master uses; ``None`` for any other master."""
    m = _LOCAL_MASTER.match(master.strip())
    if m is None:
        return None
    n = m.group(1)
    if n is None:
        return 1
    if n == "*":
        return os.cpu_count() or 1
    return max(1, int(n))


def spark_conf(
    *,
    master: str = "local[*]",
    driver_memory: str = "2g",
    ui: bool = False,
    shuffle_partitions: int | None = None,
    python: str | None = None,
    archives: str | None = None,
    extra_conf: dict[str, str] | None = None,
) -> dict[str, str]:
    """The configuration ``get_spark`` starts a session with (without the log4j2 option)."""
    conf: dict[str, str] = {
        "spark.master": master,
        "spark.app.name": APP_NAME,
        "spark.driver.memory": driver_memory,
        "spark.ui.enabled": str(ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.compression.codec": "lz4_raw",
        # Page checksums (ledger.checksums): written on every page Spark writes, verified on
        # every page it reads, as the service's own reads do.
        "spark.hadoop.parquet.page.write-checksum.enabled": "true",
        "spark.hadoop.parquet.page.verify-checksum.enabled": "true",
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        # The raw local file system writes no .crc side files.
        "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
        "spark.hadoop.fs.file.impl.disable.cache": "true",
        # The compactor's Arrow tasks run in Python workers; give them big Arrow batches.
        "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
    }
    # The Python workers' environment (the executors' too): see WORKER_ENV.
    conf.update({f"spark.executorEnv.{name}": value for name, value in WORKER_ENV.items()})
    if os.name == "posix":
        # Python workers talk to their JVM over a Unix domain socket (Spark 4.1, SPARK-51688)
        # instead of loopback TCP: a job with Python tasks then costs ~40 ms instead of ~90 ms
        # before any work, most of an incremental round.
        conf["spark.python.unix.domain.socket.enabled"] = "true"
    cores = local_cores(master)
    if cores is not None:
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        # Local Python workers run this interpreter, which has the project and pyarrow. On a
        # cluster, ``python`` names the executors' one, which needs only pyarrow, numpy and
        # pandas: the project's code is shipped to it (see get_spark).
        conf["spark.pyspark.python"] = sys.executable
        # Its workers are forked with pyarrow and the compactor imported (compactor.daemon).
        conf["spark.python.daemon.module"] = "compactor.daemon"
    if python:
        conf["spark.pyspark.python"] = python
    if archives:
        conf["spark.archives"] = archives
    if shuffle_partitions is None and cores is not None:
        shuffle_partitions = 2 * cores
    if shuffle_partitions is not None:
        if shuffle_partitions < 1:
            raise ValueError(f"shuffle_partitions must be >= 1, got {shuffle_partitions}")
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    conf.update(extra_conf or {})
    return conf


def get_spark(
    *,
    master: str = "local[*]",
    driver_memory: str = "2g",
    ui: bool = False,
    shuffle_partitions: int | None = None,
    python: str | None = None,
    archives: str | None = None,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """The process's SparkSession, created on the first call; later calls return it unchanged.
    ``python``: the executors' interpreter; ``archives``: ``spark.archives`` (see the module
    docstring)."""
    global _session
    with _lock:
        if _session is not None:
            return _session
        conf = spark_conf(
            master=master,
            driver_memory=driver_memory,
            ui=ui,
            shuffle_partitions=shuffle_partitions,
            python=python,
            archives=archives,
            extra_conf=extra_conf,
        )
        local = local_cores(master) is not None
        if local:
            # Read by the launcher scripts; stops Spark warning that the host name is a loopback.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            # PySpark starts local Python workers with $PYSPARK_PYTHON (not the conf).
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        executor_python = conf.get("spark.pyspark.python")
        if executor_python and (python or not local):
            # The interpreter a Python task is started with is the one PySpark read from
            # $PYSPARK_PYTHON when the context was created (SparkContext.pythonExec), not the conf.
            os.environ["PYSPARK_PYTHON"] = executor_python
        log4j_file: Path | None = None
        java_opts = conf.get("spark.driver.extraJavaOptions", "")
        if "log4j" not in java_opts:
            fd, name = tempfile.mkstemp(prefix="topic-compactor-log4j2-", suffix=".properties")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(LOG4J2_PROPERTIES)
            log4j_file = Path(name)
            conf["spark.driver.extraJavaOptions"] = (
                f"{java_opts} -Dlog4j2.configurationFile={log4j_file.as_uri()}".strip()
            )
        try:
            builder = SparkSession.builder
            for k, v in conf.items():
                builder = builder.config(k, v)
            session = builder.getOrCreate()
        finally:
            # log4j reads its configuration once, when the JVM starts.
            if log4j_file is not None:
                log4j_file.unlink(missing_ok=True)
        session.sparkContext.setLogLevel("WARN")
        if not local or python:
            # Executors that do not run this interpreter do not have the project: send it.
            from compactor.cluster import code_zip

            session.sparkContext.addPyFile(str(code_zip()))
        _session = session
        return session


# The thread-local property that puts the thread's Spark jobs in a job group (as
# ``SparkContext.setJobGroup`` does), which the UI and the status tracker show.
JOB_GROUP = "spark.jobGroup.id"


@contextlib.contextmanager
def job_group(spark: SparkSession, group: str) -> Iterator[None]:
    """The calling thread's Spark jobs in job group ``group`` while the body runs; the
    thread's previous group (if any) afterwards."""
    sc = spark.sparkContext
    previous = sc.getLocalProperty(JOB_GROUP)
    sc.setLocalProperty(JOB_GROUP, group)
    try:
        yield
    finally:
        sc.setLocalProperty(JOB_GROUP, previous)  # type: ignore[arg-type]


# How long a failed job's other tasks get to end before the caller goes on anyway: Spark
# destroys a killed task's Python worker after spark.python.task.killTimeout (2 s) past its
# monitor's check (every 2 s).
TASKS_END_WITHIN_S = 30.0


def await_group_tasks(spark: SparkSession, group: str, timeout_s: float = TASKS_END_WITHIN_S) -> bool:
    """Wait until no task of job group ``group``'s jobs is running; whether none is within
    ``timeout_s``. A job fails as soon as one of its tasks does, and Spark then kills the
    others: a Python task runs on until it ends or its worker is destroyed, seconds later,
    and what it writes meanwhile must not outlive the caller's clean-up."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while True:
        running = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                running += stage.numActiveTasks if stage is not None else 0
        if running == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_spark() -> None:
    """Stop the process's session (if any); a later ``get_spark`` starts a new one."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None


def explain_string(df: DataFrame, mode: str = "formatted") -> str:
    """``df.explain(mode)`` as a string (to check what a plan reads)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        df.explain(mode=mode)
    return buf.getvalue()
