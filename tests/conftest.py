"""Shared fixtures: settings on a fresh data dir, an in-process broker, the app over ASGI,
one SparkSession for the whole run, and a real ``compactor serve`` process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.db import Database, upgrade
from service.settings import Settings
from service.topics import Broker
from tests.server import ServerProcess, fresh_database_url


@pytest.fixture
def settings(tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    url = fresh_database_url(request.node.name)
    return Settings(
        data_dir=tmp_path / "data",
        database_url=url or "",
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


class Server(ServerProcess):
    """The service as the tests run it: two local Spark cores, small shuffles, no warm-up."""

    defaults = {
        "COMPACTOR_SPARK_MASTER": "local[2]",
        "COMPACTOR_SPARK_SHUFFLE_PARTITIONS": "4",
        "COMPACTOR_SPARK_WARMUP": "false",
    }


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[type[Server]]:
    started: list[Server] = []

    class _Server(Server):
        def start(self, timeout: float = 120.0) -> None:
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
