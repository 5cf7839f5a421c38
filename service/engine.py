"""The service's Spark: checked, started once, shared by every compaction round.

Before Spark starts, the Java it will run is checked (``compactor.java``); on a cluster, a probe
job then checks that the executors can run the compaction's tasks and read the storage root
(``compactor.cluster``). When any of that fails, the reason is one line: logged once, shown by
``GET /health`` as ``"compaction": "unavailable: <reason>"``, and given to every round, whose
``lastError`` then says it (:class:`~service.errors.CompactionUnavailable`), instead of a JVM
gateway traceback. A round while unavailable tries again (the operator may have fixed it).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from pyspark.sql import SparkSession

from compactor import TwoPhaseCompactor
from compactor.cluster import ExecutorsUnfit, check_executors, one_line
from compactor.java import JavaUnavailable, find_java
from compactor.spark import get_spark, local_cores
from compactor.warmup import warm_up, warm_up_jit
from ledger.storage import StoragePath
from service.errors import CompactionUnavailable
from service.settings import Settings

log = logging.getLogger(__name__)

STARTING = "starting"
AVAILABLE = "available"
# Warm-up off: Java was found, Spark starts with the first round.
ON_DEMAND = "on demand"
UNAVAILABLE = "unavailable"
# How long a stopping service waits for its warm-up to finish the Spark job it runs (an empty
# job takes milliseconds; the warm-up round, once Spark is up, a few seconds).
STOP_WAIT_SECONDS = 30.0


class SparkEngine:
    """Starts the process's SparkSession for ``settings`` and knows whether compaction can run."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._session: SparkSession | None = None
        self._probed = False
        self._status = STARTING
        self._logged: str | None = None
        self._stopping = threading.Event()
        self._starting: threading.Thread | None = None

    @property
    def status(self) -> str:
        """``starting``, ``available``, ``on demand`` or ``unavailable: <reason>``."""
        return self._status

    @property
    def warming_up(self) -> bool:
        """Whether the start-up warm-up is still running (its round or its empty jobs)."""
        return self.settings.spark_warmup and self._starting is not None and self._starting.is_alive()

    @property
    def is_cluster(self) -> bool:
        return local_cores(self.settings.spark_master) is None

    def start_in_background(self) -> threading.Thread:
        """Check at start-up, off the serving path: Java always; with warm-up on, also start
        Spark, probe a cluster's executors, run a throw-away round, then the empty jobs that
        let the JVM compile a job's path (``compactor.warmup``)."""
        thread = threading.Thread(target=self._start, name="spark-start", daemon=True)
        self._starting = thread
        thread.start()
        return thread

    def _start(self) -> None:
        try:
            if self.settings.spark_warmup:
                session = self.session()
                if not self._stopping.is_set():
                    warm_up(session, self._warm_up_under())
                warm_up_jit(session, self.settings.spark_warmup_jobs, stop=self._stopping)
            else:
                with self._lock:
                    if self._session is None:
                        try:
                            self._check_java()
                        except CompactionUnavailable as e:
                            self._unavailable(e.reason)
                            raise
                        self._status = ON_DEMAND
        except CompactionUnavailable:
            pass  # said once in the log, and in /health
        except Exception:  # noqa: BLE001 - a real round reports the same failure where it matters
            if not self._stopping.is_set():  # else Spark went down under it with the process
                log.exception("warming Spark up failed")

    def _warm_up_under(self) -> Path | StoragePath:
        """Where the warm-up round writes its scratch topic: the ledgers' storage when it is a
        bucket (the first real round then finds the tasks' clients of it made, and their
        connections open) or when the executors are a cluster's (which may share no disk with
        this machine: they read that storage, as the probe checked); else the data dir."""
        storage = self.settings.ledger_storage()
        return storage.at() if self.is_cluster or not storage.local else self.settings.data_dir

    def stop(self, timeout: float = STOP_WAIT_SECONDS) -> None:
        """The service stops: no more warm-up jobs; the one running (or the warm-up round) is
        given ``timeout`` seconds to finish. Otherwise the process would go with a Spark job
        running, and the JVM would log the Python side's going as errors, with Java stack
        traces, on the console of a user who pressed Ctrl-C in the first seconds."""
        self._stopping.set()
        starting = self._starting
        if starting is not None and starting is not threading.current_thread():
            starting.join(timeout)

    def session(self) -> SparkSession:
        """The started, checked session; raises :class:`CompactionUnavailable`."""
        with self._lock:
            try:
                if self._session is None:
                    self._check_java()
                    try:
                        self._session = self._start_spark()
                    except Exception as e:
                        raise CompactionUnavailable(f"Spark did not start: {one_line(e)}") from e
                if self.is_cluster and not self._probed:
                    try:
                        hosts = check_executors(
                            self._session,
                            self.settings.ledger_storage().at(),
                            timeout=self.settings.spark_probe_timeout_seconds,
                        )
                    except ExecutorsUnfit as e:
                        raise CompactionUnavailable(str(e)) from e
                    log.info("Spark at %s: executors on %s", self.settings.spark_master, ", ".join(hosts))
                    self._probed = True
            except CompactionUnavailable as e:
                self._unavailable(e.reason)
                raise
            self._status = AVAILABLE
            return self._session

    def compactor(self) -> TwoPhaseCompactor:
        return TwoPhaseCompactor(self.session())

    def _check_java(self) -> None:
        try:
            find_java()
        except JavaUnavailable as e:
            raise CompactionUnavailable(str(e)) from e

    def _start_spark(self) -> SparkSession:
        s = self.settings
        return get_spark(
            master=s.spark_master,
            driver_memory=s.spark_driver_memory,
            ui=s.spark_ui,
            shuffle_partitions=s.spark_shuffle_partitions,
            python=s.spark_python,
            archives=s.spark_archives,
            extra_conf=s.spark_conf,
        )

    def _unavailable(self, reason: str) -> None:
        self._status = f"{UNAVAILABLE}: {reason}"
        if reason != self._logged:  # once per reason, not once per round
            log.error("compaction is unavailable: %s", reason)
            self._logged = reason
