"""The published API contract holds: schemathesis, every check, against a real server.

The server runs with authentication and authorization on, so that the document describes the
401 and 403 of every secured route (``ignored_auth`` sends requests without the token and
expects 401); the requests carry a superuser's token. The number of examples is bounded so the
run takes about a minute; ``COMPACTOR_CONTRACT_EXAMPLES`` raises it for a deeper run.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import jwt
import pytest

from tests.conftest import Server

pytestmark = pytest.mark.e2e

SECRET = b"contract-secret-contract-secret!"


def test_openapi_document_resolves_and_documents_errors(server_factory: type[Server], tmp_path: Path) -> None:
    server = _server(server_factory, tmp_path)
    doc = httpx.get(f"{server.url}/openapi.json").json()
    text = str(doc)
    assert "#/$defs/" not in text  # every reference resolves inside components
    for name in _refs(doc):
        assert name in doc["components"]["schemas"], name
    produce = doc["paths"]["/topics/persistent/{tenant}/{namespace}/{topic}"]["post"]
    assert {"400", "401", "403", "404", "413", "422"} <= set(produce["responses"])
    tenant = produce["parameters"][0]["schema"]
    assert tenant["maxLength"] == 128 and tenant["pattern"].startswith("^")
    assert doc["paths"]["/health"]["get"].get("security") is None
    # Each operation its own id (generators of clients name methods after them), a route
    # serving two methods included.
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    strategy = doc["paths"]["/admin/v2/persistent/{tenant}/{namespace}/{topic}/schemaCompatibilityStrategy"]
    assert {"get", "put", "post", "delete"} <= set(strategy)
    body = strategy["put"]["requestBody"]["content"]["application/json"]["schema"]
    assert "FULL_TRANSITIVE" in str(body) and "409" in strategy["put"]["responses"]


def test_schemathesis_finds_nothing(server_factory: type[Server], tmp_path: Path) -> None:
    server = _server(server_factory, tmp_path)
    token = jwt.encode({"sub": "admin"}, SECRET, algorithm="HS256")
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st is not None, "schemathesis is a test dependency (pip install -e '.[test]')"
    examples = os.environ.get("COMPACTOR_CONTRACT_EXAMPLES", "8")
    done = subprocess.run(
        [
            st,
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            examples,
            # One worker: hypothesis describes strategies by parsing source, which CPython's
            # parser does not allow from two threads at once (a "recursion depth mismatch").
            "--workers",
            "1",
            "--seed",
            "12",
            "--header",
            f"Authorization: Bearer {token}",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # schemathesis may write its cache here
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert " passed" in done.stdout
    assert "Traceback" not in server.log.read_text()  # no input made the service fail


def _server(server_factory: type[Server], tmp_path: Path) -> Server:
    server = server_factory(
        tmp_path / "data",
        env={
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_AUTHORIZATION_ENABLED": "true",
            "COMPACTOR_SUPERUSER_ROLES": "admin",
            "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(SECRET).decode(),
        },
    )
    server.start()
    return server


def _refs(node: object) -> set[str]:
    if isinstance(node, dict):
        out = {str(node["$ref"]).rsplit("/", 1)[1]} if "$ref" in node else set()
        for v in node.values():
            out |= _refs(v)
        return out
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()
