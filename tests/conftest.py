"""Shared fixtures: settings on a fresh data dir, an in-process broker, the app over ASGI,
one SparkSession for the whole run, and a real ``compactor serve`` process."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compactor import TwoPhaseCompactor
from ledger.storage import S3Settings, Storage, open_storage
from migrations import upgrade
from service.compaction import CompactionService
from service.db import Database
from service.settings import Settings
from service.topics import Broker
from tests.certificates import TlsFiles, make_tls_files
from tests.server import (
    S3_ENV,
    WAL_ENV,
    ServerProcess,
    export_s3_client_env,
    fresh_database_url,
    s3_settings,
)

# apache/pulsar-client-python's own test files: run against a configured server by
# tests/e2e/test_upstream_python_client.py, never collected as this suite's tests.
collect_ignore = ["upstream"]


def local_wal_only(reason: str) -> pytest.MarkDecorator:
    """For a test of the local write-ahead files themselves (skipped with ``--wal=object``)."""
    return pytest.mark.skipif(os.environ.get(WAL_ENV, "local") != "local", reason=reason)


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
        # In-process apps do not listen for Pulsar's protocol (they would share port 6650); the
        # tests of the protocol start the service as a user does, on a port of their own.
        broker_service_port=0,
        # COMPACTOR_TEST_WAL=object runs the in-process tests on group-committed write-ahead objects.
        wal=os.environ.get(WAL_ENV, "local"),
        wal_flush_ms=int(os.environ.get(f"{WAL_ENV}_FLUSH_MS", "5")),
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


@pytest.fixture
def compaction(broker: Broker, spark) -> Iterator[CompactionService]:
    """The compaction service on the in-process broker and the session's SparkSession."""
    svc = CompactionService(broker=broker, compactor=lambda: TwoPhaseCompactor(spark, min_part_bytes=0))
    svc.start()
    yield svc
    svc.stop()


# ------------------------------------------------------------------ ledger storage: a directory or a bucket

# When the tests are loaded: before the session's Spark starts.
export_s3_client_env()


def s3_storage(prefix: str) -> Storage:
    """A prefix of the bucket of the S3-compatible server ``.ci/s3`` started (its settings in
    ``COMPACTOR_TEST_S3_SETTINGS``, as ``NAME=value`` lines)."""
    found = s3_settings()
    assert found is not None, f"{S3_ENV} is not set"
    url = found["COMPACTOR_STORAGE_URL"].rstrip("/") + f"/{prefix}"
    return open_storage(
        url,
        S3Settings(endpoint_url=found["COMPACTOR_S3_ENDPOINT_URL"], region=found.get("COMPACTOR_S3_REGION")),
    )


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    """A storage root on each backend: a local directory, and a fresh prefix of the test
    bucket (skipped when no S3-compatible server is given), emptied after the test."""
    if request.param == "local":
        yield open_storage(str(tmp_path / "root"))
        return
    if s3_settings() is None:
        pytest.skip(f"no S3-compatible server: {S3_ENV} is not set (.ci/run sets it from .ci/s3)")
    store = s3_storage(f"tests-{uuid.uuid4().hex[:12]}")
    yield store
    store.delete_prefix("")


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
        env={
            "COMPACTOR_SPARK_WARMUP": "true",
            # The warm-up round, not the JIT's (13 s of a core that the suite's tests use).
            "COMPACTOR_SPARK_WARMUP_JOBS": "0",
            "COMPACTOR_MAX_MESSAGE_SIZE": str(SHARED_MAX_MESSAGE_SIZE),
        },
    )
    s.start()
    # The namespaces the tests on it use, beside public/default.
    s.create_namespaces("public/cli", "e2e/consumers", "e2e/default")
    yield s
    s.stop()


# ------------------------------------------------------------------ a real server with security on

SUPERUSER = "admin"


@dataclass(frozen=True)
class SecureServer:
    """A running server with authentication and authorization on (HS256 tokens, superuser
    ``admin``), and ``token(role)`` to make tokens it accepts."""

    server: Server
    secret_key: bytes

    @property
    def url(self) -> str:
        return self.server.url

    def token(self, role: str, **claims: object) -> str:
        import jwt

        return jwt.encode({"sub": role, **claims}, self.secret_key, algorithm="HS256")

    def headers(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(role)}"}


@pytest.fixture(scope="session")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServer]:
    """One server with security on for every test of it (each uses its own tenants)."""
    from service.tokens import create_secret_key

    key = create_secret_key()
    s = Server(
        tmp_path_factory.mktemp("secure") / "data",
        env={
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_AUTHORIZATION_ENABLED": "true",
            "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(key).decode(),
            "COMPACTOR_SUPERUSER_ROLES": f"{SUPERUSER}, ops",
        },
    )
    s.start()
    yield SecureServer(s, key)
    s.stop()


# ------------------------------------------------------------------ TLS


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A throw-away CA, a server certificate for localhost and 127.0.0.1, a client certificate,
    and a client certificate of another CA (``tests.certificates``)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


# ------------------------------------------------------------------ a real browser

# Chromium as the dashboard test runs it: headless, no sandbox (root in a container), and
# nothing that would reach the network (the machine has none).
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One headless Chromium for the session (Debian's, installed by ``.ci/chromium`` when
    missing), driven by Playwright; the test is skipped, with the reason, if there is none."""
    import subprocess

    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    found = subprocess.run(
        [str(Path(__file__).resolve().parents[1] / ".ci" / "chromium")], capture_output=True, text=True
    )
    if found.returncode != 0:
        pytest.skip(f"no Chromium for the browser tests: {found.stderr.strip().splitlines()[-1:]}")
    profile = tmp_path_factory.mktemp("chromium-profile")
    # ``expect`` waits 5 s by default: too short for a page on a loaded 2-core CI machine.
    playwright_api.expect.set_options(timeout=30_000)
    with playwright_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=found.stdout.strip(),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 1000},
        )
        yield context
        context.close()


# ------------------------------------------------------------------ the ledger storage of servers


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--storage",
        choices=("local", "s3"),
        default=None,
        help="the ledger storage of the servers the tests start: their data dir (local, the default) "
        "or a fresh prefix of the S3 bucket .ci/s3 made (s3; needs COMPACTOR_TEST_S3_SETTINGS)",
    )
    parser.addoption(
        "--wal",
        choices=("local", "object"),
        default=None,
        help="the write-ahead mode of the servers the tests start and of the in-process tests' "
        "settings: local files (the default) or group-committed objects in the ledger storage",
    )


def pytest_configure(config: pytest.Config) -> None:
    from tests.server import STORAGE_ENV

    chosen = config.getoption("--storage")
    if chosen is not None:
        # An environment variable: servers are processes, and benchmarks read it too.
        os.environ[STORAGE_ENV] = chosen
    wal = config.getoption("--wal")
    if wal is not None:
        os.environ[WAL_ENV] = wal
