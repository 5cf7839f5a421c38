"""``api.client`` as a package: what users import from it is unchanged, listed in ``__all__``,
and typed (``py.typed``; ``mypy --strict`` clean, so a user's strict checks see our types)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import api.client

ROOT = Path(__file__).resolve().parents[3]

#: What ``from api.client import ...`` gave when the client was one module (its ``__all__`` then,
#: and the names the CLI and the tests imported besides).
BEFORE = [
    "AlreadyClosed",
    "Admin",
    "AuthenticationError",
    "AuthenticationToken",
    "AuthorizationError",
    "AsyncAdmin",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncReader",
    "AsyncTableView",
    "BadRequest",
    "Client",
    "ClientError",
    "CompactionProgress",
    "CompactionStatus",
    "Conflict",
    "Consumer",
    "ConsumerBusy",
    "Message",
    "MessageId",
    "NotFound",
    "OutgoingMessage",
    "Producer",
    "Reader",
    "ServerError",
    "TableView",
    "Timeout",
    "TooLarge",
    "TransportError",
    "Unavailable",
    "DEFAULT_URL",
    "MAX_BATCH_MESSAGES",
    "MAX_BATCH_BYTES",
    "MAX_ACK_GROUP",
    "COMPACTION_SUBSCRIPTION",
    "TopicsAdmin",
    "NamespacesAdmin",
    "TenantsAdmin",
    "AsyncTopicsAdmin",
    "AsyncNamespacesAdmin",
    "AsyncTenantsAdmin",
    "MessageIdLike",
    "MessageLike",
    "ProgressCallback",
    "TableListener",
    "ConsumerType",
    "DeadLetterPolicy",
]


def test_every_name_imports_from_the_package_and_is_public() -> None:
    from api.client import AsyncClient, Client, MessageId  # noqa: F401 (the README's import)

    assert set(BEFORE) <= set(api.client.__all__)
    assert len(api.client.__all__) == len(set(api.client.__all__))
    namespace: dict[str, object] = {}
    exec("from api.client import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(api.client.__all__)


def test_the_exception_tree_and_the_design_are_at_the_top_of_the_package() -> None:
    doc = api.client.__doc__ or ""
    assert "ClientError" in doc and "└── Unavailable" in doc and "ConsumerBusy" in doc
    assert "generator that yields *effects*" in doc
    assert issubclass(api.client.ConsumerBusy, api.client.Conflict)
    assert issubclass(api.client.Unavailable, api.client.ServerError)


def test_the_client_is_typed_strictly() -> None:
    assert (ROOT / "api" / "py.typed").is_file()
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "api/client"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
