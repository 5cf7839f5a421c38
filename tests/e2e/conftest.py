"""Fixtures of the end-to-end tests that drive Pulsar's official client."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest

from tests.conftest import Server
from tests.server import POSTGRES_ENV

ROOT = Path(__file__).resolve().parents[2]

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@pytest.fixture
def client(shared_server: Server) -> Iterator[pulsar.Client]:
    """The official client, connected to the session's shared server over the binary protocol."""
    c = pulsar.Client(shared_server.pulsar_url, operation_timeout_seconds=15, logger=QUIET)
    yield c
    c.close()


@pytest.fixture
def http(shared_server: Server) -> Iterator[httpx.Client]:
    """An HTTP client of the session's shared server (REST and Pulsar's admin paths)."""
    with httpx.Client(base_url=shared_server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def postgres_admin() -> str:
    """An admin URL of a PostgreSQL server: the CI's, else one ``.ci/postgres`` starts."""
    url = os.environ.get(POSTGRES_ENV)
    if url:
        return url
    try:
        out = subprocess.run(
            [str(ROOT / ".ci" / "postgres")], capture_output=True, text=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"several instances need PostgreSQL, and .ci/postgres failed: {e}")
    if out.returncode != 0 or not out.stdout.strip():
        lines = (out.stderr or "").strip().splitlines()
        pytest.skip(f"several instances need PostgreSQL, which cannot be had here: {lines[-1:]}")
    return out.stdout.strip().splitlines()[-1]
