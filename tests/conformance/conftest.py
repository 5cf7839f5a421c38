"""Fixtures of the conformance suite: one real server per ledger size, a client, a fresh topic.

Every test runs against two servers, one with the default ledger size and one that rolls its
ledgers every 3 entries, so that every scenario spans ledgers. A server is session-scoped and
warm (Spark started at start-up), and each test gets a topic of its own on it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from api.client import Client
from tests.server import ServerProcess

LEDGER_SIZES: dict[str, dict[str, str]] = {
    "default-ledgers": {},
    "3-entry-ledgers": {"COMPACTOR_MAX_ENTRIES_PER_LEDGER": "3"},
}

_topic_numbers = itertools.count()
NAMESPACE = "conformance/compaction"


class ConformanceServer(ServerProcess):
    """The service as the suite runs it: two local Spark cores, small shuffles, a warm Spark."""

    defaults = {
        "COMPACTOR_SPARK_MASTER": "local[2]",
        "COMPACTOR_SPARK_SHUFFLE_PARTITIONS": "4",
        "COMPACTOR_SPARK_WARMUP": "true",
        # The warm-up round, not the JIT's (13 s of a core that the suite's tests use).
        "COMPACTOR_SPARK_WARMUP_JOBS": "0",
    }


class _ServerPool:
    """The servers the session's tests need, all launched at once: the second one's Spark warms
    up while the tests of the first run."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, names: list[str]) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(names)))
        self.servers: dict[str, ConformanceServer] = {}
        self._started: dict[str, Future[None]] = {}
        for name in names:
            server = ConformanceServer(
                tmp_path_factory.mktemp(f"conformance-{name}") / "data", env=LEDGER_SIZES[name]
            )
            self.servers[name] = server
            self._started[name] = self._pool.submit(self._start, server)

    def get(self, name: str) -> ConformanceServer:
        self._started[name].result()  # raises what start() raised
        return self.servers[name]

    def _start(self, server: ConformanceServer) -> None:
        server.start()
        # Pulsar's test makes its tenant and namespace first; topics live only in one that exists.
        server.create_namespaces(NAMESPACE)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for server in self.servers.values():
            server.stop()


@pytest.fixture(scope="session")
def _server_pool(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_ServerPool]:
    wanted = {
        item.callspec.params["pulsar_server"]
        for item in request.session.items
        if hasattr(item, "callspec") and "pulsar_server" in item.callspec.params
    }
    pool = _ServerPool(tmp_path_factory, [name for name in LEDGER_SIZES if name in wanted])
    yield pool
    pool.close()


@pytest.fixture(scope="session", params=list(LEDGER_SIZES), ids=list(LEDGER_SIZES))
def pulsar_server(request: pytest.FixtureRequest, _server_pool: _ServerPool) -> Iterator[ConformanceServer]:
    """A real ``compactor serve`` with the ledger size of the parameter (pytest runs the tests
    of one parameter together, and stops its server once they are done)."""
    server = _server_pool.get(request.param)
    yield server
    server.stop()


@pytest.fixture
def client(pulsar_server: ConformanceServer) -> Iterator[Client]:
    with Client(pulsar_server.url) as c:
        yield c


@pytest.fixture
def topic(client: Client, request: pytest.FixtureRequest) -> str:
    """A new, empty topic named after the test (Pulsar's tests create theirs on first use)."""
    name = re.sub(r"[^A-Za-z0-9_.=-]", "-", request.node.name)[:100]
    full = f"persistent://{NAMESPACE}/{name}-{next(_topic_numbers)}"
    client.admin.topics.create(full)
    return full
