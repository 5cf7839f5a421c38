"""Finding a Java that can run Spark, before Spark tries and fails with a gateway traceback.

Spark's launcher runs ``$JAVA_HOME/bin/java`` when ``JAVA_HOME`` is set, else ``java`` from
``PATH``; :func:`find_java` looks where it will look and asks that ``java`` its version.
Spark 4 runs on Java 17 and 21. Without one, PySpark reports only
``[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number``; the
service says instead, in one line, what is missing and what to install (``.ci/java`` is the
same check for ``make run`` and ``make test``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_VERSIONS = (17, 21)
NEEDS = "Spark needs Java 17 or 21"
INSTALL_HINT = "install Java 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or 21"

# `java -version` prints e.g. `openjdk version "17.0.15" 2025-04-15` (Java 8: "1.8.0_402").
_VERSION = re.compile(r'version "(?:1\.)?(\d+)')


class JavaUnavailable(RuntimeError):
    """No Java that can run Spark; the message is one line saying what to install."""


@dataclass(frozen=True)
class Java:
    path: str
    version: int


def java_command(env: Mapping[str, str] | None = None) -> str | None:
    """The ``java`` Spark's launcher would run (None: there is none)."""
    env = os.environ if env is None else env
    home = env.get("JAVA_HOME")
    if home:
        return str(Path(home) / "bin" / "java")
    return shutil.which("java", path=env.get("PATH", os.defpath))


def find_java(env: Mapping[str, str] | None = None, *, timeout: float = 30.0) -> Java:
    """The Java Spark will run, checked to be 17 or 21; raises :class:`JavaUnavailable`."""
    env = os.environ if env is None else env
    java = java_command(env)
    if java is None:
        raise JavaUnavailable(
            f"{NEEDS} and none was found (no java on PATH, JAVA_HOME unset): {INSTALL_HINT}"
        )
    where = f"JAVA_HOME={env['JAVA_HOME']}" if env.get("JAVA_HOME") else java
    if not os.access(java, os.X_OK):
        raise JavaUnavailable(f"{NEEDS} and {where} has no runnable bin/java: {INSTALL_HINT}")
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=timeout, env=dict(env), check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JavaUnavailable(f"{NEEDS} and `{java} -version` failed ({e}): {INSTALL_HINT}") from e
    m = _VERSION.search(done.stderr + done.stdout)
    if done.returncode != 0 or m is None:
        raise JavaUnavailable(f"{NEEDS} and `{java} -version` did not say its version: {INSTALL_HINT}")
    version = int(m.group(1))
    if version not in SUPPORTED_VERSIONS:
        raise JavaUnavailable(f"{NEEDS} and {where} is Java {version}: {INSTALL_HINT}")
    return Java(java, version)
