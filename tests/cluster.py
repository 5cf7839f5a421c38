"""A real Spark standalone cluster for tests and benchmarks: a Master and Workers started from
the pyspark wheel's ``bin/spark-class``, each its own process, as a new user would start them;
and an executor interpreter that has pyarrow, numpy, pandas and fastavro and nothing of this project.

The Workers can run in a mount namespace of their own where one directory (``hidden``) is an
empty tmpfs: a storage root under it is then on the driver's disk only, as a storage root
that is not shared with the executors would be (needs ``unshare``, i.e. root).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from compactor.spark import LOG4J2_PROPERTIES
from tests.server import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
# Where the executor interpreter is cached between runs (ignored by git).
EXECUTOR_VENV_CACHE = REPO_ROOT / ".venv-executor"
EXECUTOR_PACKAGES = ("pyarrow", "numpy", "pandas", "fastavro")


def spark_home() -> Path:
    """The pyspark wheel's directory: it has ``bin/spark-class`` and the jars."""
    import pyspark

    return Path(pyspark.__file__).parent


def executor_python(cache: Path = EXECUTOR_VENV_CACHE) -> Path:
    """An interpreter with only pyarrow, numpy, pandas and fastavro (the driver's versions), in a venv
    without system site packages, built once and cached under ``cache``: what a cluster's
    executors have, and nothing of this project."""
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in EXECUTOR_PACKAGES]
    tag = "py{}{}-".format(*sys.version_info[:2]) + "-".join(p.replace("==", "") for p in pins)
    venv = cache / tag
    python = venv / "bin" / "python"
    if python.exists():
        return python
    cache.mkdir(parents=True, exist_ok=True)
    building = cache / f"{tag}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(building)], check=True)
    # pip of this interpreter installs into the new venv (its pip cache makes this fast).
    subprocess.run(
        [
            sys.executable, "-m", "pip", "--python", str(building / "bin" / "python"),
            "install", "--quiet", "--disable-pip-version-check", *pins,
        ],
        check=True,
    )  # fmt: skip
    with contextlib.suppress(OSError):  # another process built it meanwhile: use theirs
        os.rename(building, venv)
    shutil.rmtree(building, ignore_errors=True)
    return python


def executor_archive(cache: Path = EXECUTOR_VENV_CACHE) -> Path:
    """:func:`executor_python`'s venv packed as a ``.tar.gz`` (cached beside it), for
    ``spark.archives``: unpacked as ``environment`` in each executor's directory, its
    interpreter is ``./environment/bin/python``. (A venv whose ``bin/python`` links to an
    interpreter every worker has at the same path, as here, needs no venv-pack.)"""
    venv = executor_python(cache).parent.parent
    archive = venv.with_name(venv.name + ".tar.gz")
    if not archive.exists():
        building = archive.with_name(f"{archive.name}.building-{os.getpid()}")
        with open(building, "wb") as out:
            # Without the packages' own test suites and byte code: a third less to ship and unpack.
            leave_out = ["--exclude=__pycache__", "--exclude=./lib/python*/site-packages/*/tests"]
            command = ["tar", "-cf", "-", *leave_out, "-C", str(venv), "."]
            tar = subprocess.Popen(command, stdout=subprocess.PIPE)
            subprocess.run(["gzip", "-1"], stdin=tar.stdout, stdout=out, check=True)
            if tar.wait() != 0:
                raise RuntimeError(f"tar of {venv} failed")
        os.replace(building, archive)
    return archive


def can_hide_directories() -> bool:
    """Whether Workers can be started in a mount namespace of their own (root, ``unshare``)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


class SparkCluster:
    """A standalone Master and ``workers`` Workers (``cores`` and ``memory`` each) on 127.0.0.1,
    logs and work directories under ``work_dir``. ``hidden``: a directory the Workers and their
    executors see as empty (see the module docstring)."""

    def __init__(
        self,
        work_dir: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        hidden: Path | None = None,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.hidden = hidden
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def worker_dir(self, i: int) -> Path:
        return self.work_dir / f"worker-{i}"

    def _env(self) -> dict[str, str]:
        conf_dir = self.work_dir / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "PYTHON", "SPARK_"))}
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.work_dir / "logs"),
            # The daemons' own heap; executors get the application's spark.executor.memory.
            SPARK_DAEMON_MEMORY="256m",
        )
        return env

    def _spawn(self, name: str, args: list[str], *, hide: bool = False) -> None:
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        if hide and self.hidden is not None:
            self.hidden.mkdir(parents=True, exist_ok=True)
            command = [
                "unshare", "-m", "--propagation", "private",
                "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"', str(self.hidden), *command,
            ]  # fmt: skip
        log = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            self.procs.append(
                subprocess.Popen(
                    command,
                    env=self._env(),
                    cwd=self.work_dir,
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    # Its own process group: stop() ends it with the executors it started.
                    start_new_session=True,
                )
            )
        finally:
            log.close()

    def start(self, timeout: float = 120.0) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port),
            ],
        )  # fmt: skip
        for i in range(self.workers):
            self.worker_dir(i).mkdir(parents=True, exist_ok=True)
            self._spawn(
                f"worker-{i}",
                [
                    "org.apache.spark.deploy.worker.Worker", self.master_url,
                    "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
                    "--work-dir", str(self.worker_dir(i)), "--webui-port", str(free_port()),
                ],
                hide=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"a Spark daemon exited with {p.returncode}: see {self.work_dir}")
            if self.alive_workers() >= self.workers:
                return
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"the Spark cluster did not come up in {timeout:g} s: see {self.work_dir}")

    def state(self) -> dict:  # type: ignore[type-arg]
        """The Master's state (its web UI's JSON)."""
        return httpx.get(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5).json()  # type: ignore[no-any-return]

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except (httpx.HTTPError, ValueError):
            return 0

    def executor_dirs(self) -> dict[int, list[Path]]:
        """Per Worker, the directories of the executors it ran (``app-*/<executor id>``)."""
        return {i: sorted(self.worker_dir(i).glob("app-*/*")) for i in range(self.workers)}

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
            # Executors and Python workers are in the Worker's group; make sure none is left.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        self.procs.clear()
