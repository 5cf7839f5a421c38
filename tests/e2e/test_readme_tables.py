"""The README's "Query compacted topics as tables" snippets, run as written (only the catalog's
URL and the token put in), against a real server with security on whose topic
``public/default/orders`` was compacted twice (a and b; then a's update and b's delete), so that
the snippets read what they say: pyiceberg's and DuckDB's
always, Spark's where ``COMPACTOR_TEST_SPARK41_PYTHON`` names a Python with pyspark 4.1 (no
Iceberg runtime loads with the project's Spark 4.3; docs/tables.md)."""

from __future__ import annotations

import base64
import contextlib
import io
import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import jwt
import pytest

from tests.conftest import Server
from tests.iceberg_readers import duckdb_connection

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Query compacted topics as tables"
URL, TOKEN = "http://localhost:8080/iceberg", "<token>"
SECRET = b"readme-tables-secret-readme-tabl"
SPARK41_ENV = "COMPACTOR_TEST_SPARK41_PYTHON"
TOPIC = "public/default/orders"


def snippets() -> dict[str, str]:
    """The section's code blocks: ``pyiceberg`` and ``spark`` (Python), ``duckdb`` (SQL)."""
    text = README.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.DOTALL)
    found = {}
    for lang, code in blocks:
        kind = "duckdb" if lang == "sql" else "spark" if "pyspark" in code else "pyiceberg"
        found[kind] = code
    assert set(found) == {"pyiceberg", "duckdb", "spark"}, found.keys()
    return found


def _filled(code: str, server: Server) -> str:
    token = jwt.encode({"sub": "admin"}, SECRET, algorithm="HS256")
    assert URL in code and TOKEN in code
    return code.replace(URL, f"{server.url}/iceberg").replace(TOKEN, token)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    s = Server(
        tmp_path_factory.mktemp("readme-tables") / "data",
        env={
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_AUTHORIZATION_ENABLED": "true",
            "COMPACTOR_SUPERUSER_ROLES": "admin",
            "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(SECRET).decode(),
        },
    )
    s.start()
    token = jwt.encode({"sub": "admin"}, SECRET, algorithm="HS256")
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=s.url, headers=headers, timeout=30) as http:
        assert http.put("/admin/v2/tenants/public", json={"adminRoles": []}).status_code in (204, 409)
        assert http.put("/admin/v2/namespaces/public/default").status_code in (204, 409)
        policy = http.post("/admin/v2/namespaces/public/default/compactionPolicy", json={"table": True})
        assert policy.status_code in (200, 204)
        assert http.put(f"/admin/v2/persistent/{TOPIC}").status_code == 204
        # Two rounds: a, b; then a's update and b's delete (the snippets' first and latest views).
        for messages in ([("a", "1"), ("b", "1")], [("a", "2"), ("b", None)]):
            batch = [
                {"key": k, "value": None if v is None else base64.b64encode(v.encode()).decode()}
                for k, v in messages
            ]
            assert http.post(f"/topics/persistent/{TOPIC}", json={"messages": batch}).status_code == 200
            assert http.put(f"/admin/v2/persistent/{TOPIC}/compaction").status_code == 204
            deadline = time.monotonic() + 240
            while (status := http.get(f"/admin/v2/persistent/{TOPIC}/compaction").json())[
                "status"
            ] == "RUNNING":
                assert time.monotonic() < deadline
                time.sleep(0.3)
            assert status["status"] == "SUCCESS" and status["table"]["lagRounds"] == 0, status
    yield s
    s.stop()


def test_the_pyiceberg_snippet(server: Server) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(_filled(snippets()["pyiceberg"], server), {})  # noqa: S102 - the README's own code
    printed = out.getvalue()
    # Key a's latest value (b"2", which pyarrow prints in hex), then the first round's a and b.
    latest, first = printed.split("pyarrow.Table")[1:]
    assert 'key: [["a"]]' in latest and "value: [[32]]" in latest, latest
    assert 'key: [["a","b"]]' in first, first


def test_the_duckdb_snippet(server: Server) -> None:
    con = duckdb_connection()
    rows = None
    for statement in _filled(snippets()["duckdb"], server).split(";"):
        if statement.strip():
            rows = con.execute(statement).fetchall()
    assert rows == [("a", b"2")]


def test_the_spark_snippet(server: Server, tmp_path: Path) -> None:
    python = os.environ.get(SPARK41_ENV)
    if not python:
        pytest.skip(
            f"{SPARK41_ENV} names no Python with pyspark 4.1: no Iceberg Spark runtime loads with "
            "the project's pyspark 4.3 (docs/tables.md)"
        )
    script = tmp_path / "spark_snippet.py"
    script.write_text(_filled(snippets()["spark"], server))
    env = {**os.environ, "PYSPARK_PYTHON": python}
    env.pop("SPARK_HOME", None)  # the snippet's Spark, not one of the project's environment
    done = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-5000:]
    assert re.search(r"\|\s*a\s*\|\s*\[32\]\s*\|", done.stdout), done.stdout
