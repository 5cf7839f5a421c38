"""What the tests of Pulsar's other official clients share (``test_java_client.py``,
``test_go_client.py``): each builds a small program of its own once and caches it, runs every
scenario of it in one process against the shared server, and judges the JSON it writes; and the
helpers their assertions use."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Server


def cache_root(client: str) -> Path:
    """Where a client's built program is kept between runs, under a key of its sources."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "topic-compactor" / client


def keep_built(out: Path, built: Path, marker: str) -> None:
    """Move a finished build ``out`` to ``built``, whole or not at all (another run may have got
    there first: then its ``marker`` file is there)."""
    try:
        out.rename(built)
    except OSError:
        if not (built / marker).is_file():
            raise


@dataclass(frozen=True)
class ProgramRun:
    """What a client's program saw, per scenario, and what it printed."""

    language: str  # "Java", "Go": for the messages
    results: dict[str, dict[str, Any]]
    log: str  # the program's output: the client's warnings and errors
    # Which lines of the log are the client's warnings and errors (all, when None).
    warnings: Callable[[str], bool] | None = None

    def scenario(self, name: str) -> dict[str, Any]:
        """What scenario ``name`` saw; a failure with the program's error when it failed."""
        result = self.results.get(name)
        if result is None:
            pytest.fail(
                f"the {self.language} program reported nothing for {name!r}:\n{self.log[-4000:]}",
                pytrace=False,
            )
        if "error" in result:
            pytest.fail(
                f"the {self.language} scenario {name!r} failed: {result['error']}\n"
                f"it saw: {json.dumps(result)[:3000]}\nthe client said:\n{self.said()}",
                pytrace=False,
            )
        return result

    def said(self, limit: int = 20) -> str:
        """The client's distinct warnings and errors, first ones first (one line per kind, not
        per address or time)."""
        lines: list[str] = []
        for line in self.log.splitlines():
            if self.warnings is not None and not self.warnings(line):
                continue
            text = re.sub(r"^time=\S+ ", "", re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "*", line))
            if text not in lines:
                lines.append(text)
        return "\n".join(lines[:limit]) or self.log[-4000:] or "(nothing)"


def run_program(
    cmd: list[str], out: Path, *, language: str, timeout: float, warnings: Callable[[str], bool] | None = None
) -> ProgramRun:
    """Run a client's program (``cmd``, which writes its results to ``out``) to its end, or stop it
    after ``timeout`` seconds."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:  # its output comes as bytes, whatever ``text`` says
        said = b"".join(o if isinstance(o, bytes) else (o or "").encode() for o in (e.stdout, e.stderr))
        log = f"the program was stopped after {timeout} s\n{said.decode(errors='replace')}"
    results = json.loads(out.read_text()) if out.is_file() else {}
    return ProgramRun(language, results, log, warnings)


def value(m: dict[str, Any]) -> bytes:
    """A received message's value (the programs write it in base64)."""
    return base64.b64decode(m["value"])


def backlog(server: Server, topic: str, subscription: str) -> int:
    """The subscription's backlog once acknowledgements have settled (a few seconds at most)."""
    path = topic.removeprefix("persistent://")
    deadline = time.monotonic() + 10
    while True:
        stats = httpx.get(f"{server.url}/admin/v2/persistent/{path}/stats").json()
        left = int(stats["subscriptions"][subscription]["msgBacklog"])
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
