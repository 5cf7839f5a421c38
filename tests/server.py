"""A real ``compactor serve`` process, started as a user starts it, for tests and benchmarks."""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ledger.storage import S3Settings, Storage, StoragePath, as_storage_path, open_storage

# Set to an admin URL (e.g. postgresql+psycopg://postgres:pg@127.0.0.1/postgres) to run every
# server, and the in-process fixtures, on a fresh PostgreSQL database instead of SQLite.
POSTGRES_ENV = "COMPACTOR_TEST_POSTGRES_URL"
# ``.ci/s3``'s settings of a real S3-compatible server (NAME=value lines), and the ledger
# storage the servers use: ``local`` (their data dir, the default) or ``s3`` (a fresh prefix of
# that server's bucket for each server). ``pytest --storage=s3`` sets the latter.
S3_ENV = "COMPACTOR_TEST_S3_SETTINGS"
STORAGE_ENV = "COMPACTOR_TEST_STORAGE"
# "object": every test server (and the in-process tests' settings) write ahead to objects.
WAL_ENV = "COMPACTOR_TEST_WAL"


def s3_settings() -> dict[str, str] | None:
    """The ``NAME=value`` settings ``.ci/s3`` printed, if the tests were given them."""
    text = os.environ.get(S3_ENV, "").strip()
    if not text:
        return None
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def export_s3_client_env() -> None:
    """Give this process the AWS SDK's own settings of the test bucket (credentials, checksum
    mode), before Spark starts: its Python workers inherit the environment, and a compaction
    round's tasks reach the bucket from them."""
    found = s3_settings()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REQUEST_CHECKSUM_CALCULATION"):
        if found is not None and name in found:
            os.environ.setdefault(name, found[name])


# Prefixes of this test run in the bucket: a run never finds another run's objects.
_RUN = os.urandom(4).hex()


def fresh_storage_env(name: str) -> dict[str, str]:
    """The settings that put a server's ledgers in a prefix of the S3 bucket of its own
    (``name``, in this run) when the servers run on object storage (``STORAGE_ENV``), else
    none (their data dir)."""
    if os.environ.get(STORAGE_ENV, "local") != "s3":
        return {}
    found = s3_settings()
    if found is None:
        raise RuntimeError(f"{STORAGE_ENV}=s3 needs {S3_ENV} (the settings .ci/s3 prints)")
    env = {k: v for k, v in found.items() if k.startswith(("COMPACTOR_", "AWS_"))}
    keys = engine_keys()
    if keys is not None:  # the keys the Iceberg catalog hands to engines
        env["COMPACTOR_TABLE_S3_ACCESS_KEY_ID"], env["COMPACTOR_TABLE_S3_SECRET_ACCESS_KEY"] = keys
    bucket = found["COMPACTOR_STORAGE_URL"].rstrip("/")
    env["COMPACTOR_STORAGE_URL"] = f"{bucket}/{_RUN}/{name}"
    return env


def engine_keys() -> tuple[str, str] | None:
    """The S3 keys the servers' Iceberg catalogs hand to engines: the test gateway's one user's
    (a deployment gives the catalog a read-only key of its own); None without a gateway."""
    found = s3_settings()
    if found is None or not found.get("AWS_ACCESS_KEY_ID"):
        return None
    return found["AWS_ACCESS_KEY_ID"], found.get("AWS_SECRET_ACCESS_KEY", "")


def s3_server_env(name: str) -> dict[str, str]:
    """``fresh_storage_env`` on the S3 bucket whatever ``STORAGE_ENV`` says: a test of object
    storage itself."""
    saved = os.environ.get(STORAGE_ENV)
    os.environ[STORAGE_ENV] = "s3"
    try:
        return fresh_storage_env(name)
    finally:
        if saved is None:
            del os.environ[STORAGE_ENV]
        else:
            os.environ[STORAGE_ENV] = saved


def bucket_of(env: dict[str, str]) -> Storage:
    """A server's storage (its settings ``env``) as a test sees it: its files, listed and read
    directly."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REQUEST_CHECKSUM_CALCULATION"):
        os.environ.setdefault(name, env[name])
    return open_storage(
        env["COMPACTOR_STORAGE_URL"],
        S3Settings(endpoint_url=env["COMPACTOR_S3_ENDPOINT_URL"], region=env.get("COMPACTOR_S3_REGION")),
    )


def fresh_database_url(name: str, admin: str | None = None) -> str | None:
    """A new, empty PostgreSQL database for one test when ``POSTGRES_ENV`` is set (or an admin
    URL is given), else None."""
    admin = admin or os.environ.get(POSTGRES_ENV)
    if not admin:
        return None
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    db = "t_" + "".join(c if c.isalnum() else "_" for c in name.lower())[-50:]
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{db}"'))
    engine.dispose()
    return make_url(admin).set(database=db).render_as_string(hide_password=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """The console script of this interpreter's environment, settings from the environment
    (``COMPACTOR_*``: the data dir and port given here, then ``defaults``, then ``env``)."""

    defaults: dict[str, str] = {}

    def __init__(
        self,
        data_dir: Path,
        env: dict[str, str] | None = None,
        *,
        unset: tuple[str, ...] = (),
        max_open_files: int | None = None,
    ) -> None:
        """``max_open_files``: the process's soft *and* hard ``RLIMIT_NOFILE`` (the service
        raises its soft limit to the hard one at start, so only a low hard limit holds)."""
        self.data_dir = Path(data_dir)
        self.max_open_files = max_open_files
        self.port = free_port()
        # Pulsar's binary protocol: never the default 6650, which servers of one run would share.
        self.broker_port = free_port()
        self.pulsar_url = f"pulsar://127.0.0.1:{self.broker_port}"
        self.extra_env = dict(env or {})  # a copy: start() records the fresh database in it
        self.unset = unset  # variables of this process's environment the server does not get
        # With TLS on the one port (a certificate and no HTTPS port of its own), https, and trust
        # in the server's own (self-signed) certificate.
        cert = self.extra_env.get("COMPACTOR_TLS_CERT_FILE")
        if "COMPACTOR_WEB_SERVICE_PORT_TLS" in self.extra_env:
            cert = None  # HTTPS on a port of its own: this URL stays plain HTTP
        self.url = f"{'https' if cert else 'http'}://127.0.0.1:{self.port}"
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=cert) if cert else True
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.data_dir.parent / f"server-{self.port}.log"

    def start(self, timeout: float = 120.0) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        script = shutil.which("compactor", path=str(Path(sys.executable).parent)) or "compactor"
        env = {
            **{k: v for k, v in os.environ.items() if k not in self.unset},
            "COMPACTOR_DATA_DIR": str(self.data_dir),
            "COMPACTOR_PORT": str(self.port),
            "COMPACTOR_HOST": "127.0.0.1",
            "COMPACTOR_BROKER_SERVICE_PORT": str(self.broker_port),
            **self.defaults,
            **self.extra_env,
        }
        wal = os.environ.get(WAL_ENV)
        if wal and "COMPACTOR_WAL" not in self.extra_env:  # the write-ahead mode of every test server
            env["COMPACTOR_WAL"] = wal
            env.setdefault("COMPACTOR_WAL_FLUSH_MS", os.environ.get(f"{WAL_ENV}_FLUSH_MS", "5"))
        if "COMPACTOR_DATABASE_URL" not in self.extra_env and not self.proc:
            url = fresh_database_url(f"srv{self.port}")
            if url:
                self.extra_env["COMPACTOR_DATABASE_URL"] = env["COMPACTOR_DATABASE_URL"] = url
        if "COMPACTOR_STORAGE_URL" not in self.extra_env and not self.proc:
            # Recorded like the database: a restarted server finds its ledgers again. Named
            # after the data dir: instances started on one data dir share their topics.
            digest = hashlib.sha256(str(self.data_dir.absolute()).encode()).hexdigest()[:16]
            storage = fresh_storage_env(f"srv-{digest}")
            self.extra_env.update(storage)
            env.update(storage)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [script, "serve", "--log-level", "warning"],
                env=env,
                stdout=log,
                stderr=log,
                preexec_fn=self._limit if self.max_open_files else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1, verify=self.verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not become healthy in {timeout:g} s:\n{self.log.read_text()}")

    def database_url(self) -> str:
        """The server's metadata database, as a test reads or damages its rows."""
        return self.extra_env.get("COMPACTOR_DATABASE_URL") or f"sqlite:///{self.data_dir / 'metadata.db'}"

    def ledger_root(self) -> StoragePath:
        """The root of the server's ledger storage (``ledgers/...`` under it), as a test reads,
        damages or lists its files: the data dir, or the server's prefix of the bucket."""
        url = self.extra_env.get("COMPACTOR_STORAGE_URL")
        if not url:
            return as_storage_path(self.data_dir)
        s3 = S3Settings(
            endpoint_url=self.extra_env.get("COMPACTOR_S3_ENDPOINT_URL"),
            region=self.extra_env.get("COMPACTOR_S3_REGION"),
        )
        return open_storage(url, s3).at()

    def create_namespaces(self, *names: str, token: str | None = None) -> None:
        """Make each ``tenant/namespace`` (and its tenant) unless it exists: topics are created
        only in a namespace that does."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with httpx.Client(base_url=self.url, headers=headers, verify=self.verify, timeout=30) as http:
            for name in names:
                tenant, _, namespace = name.partition("/")
                for path in (f"/admin/v2/tenants/{tenant}", f"/admin/v2/namespaces/{tenant}/{namespace}"):
                    r = http.put(path)
                    if r.status_code not in (204, 409):
                        raise RuntimeError(f"PUT {path}: {r.status_code} {r.text}")

    def compact(self, topic: str, timeout: float = 180) -> str:
        """Compact ``topic`` (``persistent://...``) through REST, as an operator does, and wait
        for the round's end; its final status (``SUCCESS`` or ``ERROR``)."""
        path = topic.removeprefix("persistent://")
        with httpx.Client(base_url=self.url, verify=self.verify, timeout=30) as http:
            r = http.put(f"/admin/v2/persistent/{path}/compaction")
            if r.status_code != 204:
                raise RuntimeError(f"compaction of {topic}: {r.status_code} {r.text}")
            deadline = time.monotonic() + timeout
            status_of = f"/admin/v2/persistent/{path}/compaction"
            while (status := http.get(status_of).json()["status"]) == "RUNNING":
                if time.monotonic() > deadline:
                    raise TimeoutError(f"compaction of {topic} still running after {timeout:g} s")
                time.sleep(0.2)
        return str(status)

    def _limit(self) -> None:
        """Runs in the child between fork and exec."""
        n = self.max_open_files
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    def open_descriptors(self) -> int:
        """How many descriptors the server process has open now (Linux)."""
        assert self.proc is not None
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def pause(self) -> None:
        """SIGSTOP: the process stands still (a long GC pause, a stalled VM) until ``resume``."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash or a power cut of the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM: a clean shutdown; killed if it takes more than 30 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
