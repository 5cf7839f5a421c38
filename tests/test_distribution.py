"""The light install: ``pip install topic-compactor`` without extras is the client and
``compactor topics``, with no Spark and no server; it talks to a server of the full install.

The wheel is built from this tree and installed in a fresh virtualenv (its few dependencies from
pip's cache or the index), once for the module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Server

pytestmark = [pytest.mark.wheel, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parent.parent
#: Installed by the server extra and never by the base install.
SOURCE_IGNORED = (".git", ".venv*", "build", "data", "site", "tests", "*.egg-info", "__pycache__", ".*_cache")
SERVER_DISTRIBUTIONS = ("pyspark", "pandas", "pyarrow", "numpy", "fastapi", "uvicorn", "sqlalchemy", "pyjwt")


@dataclass(frozen=True)
class LightInstall:
    venv: Path
    cwd: Path  # not this tree: nothing may be imported from it by accident

    def env(self) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "COMPACTOR_"))
        }
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, cwd=self.cwd, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )

    def compactor(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "compactor"), *args)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "python"), "-c", textwrap.dedent(code))


def _check(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"{result.args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LightInstall]:
    tmp = tmp_path_factory.mktemp("light")
    wheels = tmp / "wheels"
    # Built from a copy: setuptools builds in the source tree and keeps what it copied there
    # before (a module since removed would ride along), and the test leaves this tree alone.
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*SOURCE_IGNORED))
    _check(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--wheel-dir",
                str(wheels),
                str(source),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    )
    (wheel,) = wheels.glob("topic_compactor-*.whl")
    venv = tmp / "venv"
    _check(
        subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, check=False)
    )
    install = LightInstall(venv, tmp)
    _check(install.run(str(venv / "bin" / "pip"), "install", "--quiet", str(wheel), timeout=300))
    yield install


def test_the_base_install_has_no_server_dependencies(light: LightInstall) -> None:
    out = _check(
        light.python(
            """
            import importlib.metadata as md, json
            print(json.dumps(sorted(d.metadata["Name"].lower() for d in md.distributions())))
            """
        )
    ).stdout
    installed = set(json.loads(out))
    assert {"topic-compactor", "httpx", "orjson", "typer", "rich"} <= installed
    assert not installed & set(SERVER_DISTRIBUTIONS), installed & set(SERVER_DISTRIBUTIONS)


def test_the_client_imports_unchanged_and_typed(light: LightInstall) -> None:
    out = _check(
        light.python(
            """
            import importlib.resources, json, sys
            from api.client import AsyncClient, Client, ClientError, MessageId, NotFound
            import api.cli
            assert MessageId.parse("1:2") == MessageId(1, 2)
            server = [m for m in sys.modules
                      if m.split(".")[0] in ("service", "compactor", "ledger", "migrations",
                                             "fastapi", "sqlalchemy", "pyspark", "pydantic")]
            typed = importlib.resources.files("api").joinpath("py.typed").is_file()
            print(json.dumps({"server": server, "typed": typed}))
            """
        )
    ).stdout
    assert json.loads(out) == {"server": [], "typed": True}


def test_topics_help_and_server_commands_name_the_extra(light: LightInstall) -> None:
    help_ = _check(light.compactor("topics", "--help")).stdout
    assert "produce" in help_ and "consume" in help_ and "compact" in help_
    for command in (["serve"], ["db", "upgrade"], ["tokens", "show", "x.y.z"]):
        result = light.compactor(*command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "pip install 'topic-compactor[server]'" in lines[0], result.stderr


def test_produce_and_consume_against_a_server_of_the_full_install(
    light: LightInstall, server: Server
) -> None:
    topic = f"public/default/light-{uuid.uuid4().hex[:8]}"
    url = ["--url", server.url]
    _check(light.compactor("topics", "create", topic, *url))
    produced = _check(
        light.compactor("topics", "produce", topic, "-k", "apple", "-m", "1.00", "-m", "1.25", *url)
    )
    assert produced.stdout.startswith("2 messages produced")
    consumed = _check(
        light.compactor(
            "topics", "consume", topic, "-s", "light", "--initial-position", "earliest", "-n", "2", *url
        )
    )
    assert [line.split("  ")[1:] for line in consumed.stdout.splitlines()] == [
        ["key=apple", "value=1.00"],
        ["key=apple", "value=1.25"],
    ]
    # And the library, from the light interpreter.
    out = _check(
        light.python(
            f"""
            from api.client import Client, MessageId
            with Client({server.url!r}) as c:
                c.create_producer({topic!r}).send(b"3", key="pear")
                print(c.admin.topics.stats({topic!r})["subscriptions"]["light"]["msgBacklog"])
                print(",".join(m.key() for m in c.create_reader({topic!r}, MessageId.earliest)))
            """
        )
    ).stdout
    assert out.split() == ["1", "apple,apple,pear"]
