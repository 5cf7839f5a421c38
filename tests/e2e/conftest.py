"""Fixtures of the end-to-end tests that drive Pulsar's official client."""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pytest

from tests.conftest import Server

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@pytest.fixture
def client(shared_server: Server) -> Iterator[pulsar.Client]:
    """The official client, connected to the session's shared server over the binary protocol."""
    c = pulsar.Client(shared_server.pulsar_url, operation_timeout_seconds=15, logger=QUIET)
    yield c
    c.close()
