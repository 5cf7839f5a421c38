"""Shared fixtures: settings on a fresh data dir, an in-process broker, the app over ASGI,
one SparkSession for the whole run, and a real ``compactor serve`` process."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.db import Database, upgrade
from service.settings import Settings
from service.topics import Broker


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        fsync="always",
        spark_master="local[2]",
        spark_shuffle_partitions=4,
        spark_warmup=False,
    )


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.database_url)
    database = Database(settings.database_url)
    yield database
    database.dispose()


@pytest.fixture
def broker(settings: Settings, db: Database) -> Iterator[Broker]:
    b = Broker(settings=settings, db=db)
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def spark():
    from compactor.spark import get_spark

    return get_spark(master="local[2]", shuffle_partitions=4)


# ------------------------------------------------------------------ a real server


# The shared server's message size limit: small, so that tests can exceed it cheaply.
SHARED_MAX_MESSAGE_SIZE = 64 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``compactor serve`` as a user starts it: the console script, settings from the environment."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"server-{self.port}.log"

    def start(self, timeout: float = 60.0) -> None:
        script = shutil.which("compactor", path=str(Path(sys.executable).parent)) or "compactor"
        env = {
            **os.environ,
            "COMPACTOR_DATA_DIR": str(self.data_dir),
            "COMPACTOR_PORT": str(self.port),
            "COMPACTOR_HOST": "127.0.0.1",
            "COMPACTOR_SPARK_MASTER": "local[2]",
            "COMPACTOR_SPARK_SHUFFLE_PARTITIONS": "4",
            "COMPACTOR_SPARK_WARMUP": "false",
            **self.extra_env,
        }
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [script, "serve", "--log-level", "warning"], env=env, stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not become healthy:\n{self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash or a power cut of the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[type[Server]]:
    started: list[Server] = []

    class _Server(Server):
        def start(self, timeout: float = 60.0) -> None:
            started.append(self)
            super().start(timeout)

    yield _Server
    for s in started:
        s.kill()


@pytest.fixture
def server(tmp_path: Path, server_factory: type[Server]) -> Server:
    s = server_factory(tmp_path / "data")
    s.start()
    return s


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real server for the tests that only need distinct topic names (client, CLI): a
    server with a warm Spark is the costliest fixture of the suite."""
    s = Server(
        tmp_path_factory.mktemp("shared") / "data",
        env={"COMPACTOR_SPARK_WARMUP": "true", "COMPACTOR_MAX_MESSAGE_SIZE": str(SHARED_MAX_MESSAGE_SIZE)},
    )
    s.start()
    yield s
    s.stop()
