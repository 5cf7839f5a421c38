"""Finding a Java that can run Spark: where Spark's launcher looks, and which versions."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from compactor.java import JavaUnavailable, find_java, java_command


def fake_java(directory: Path, version: str) -> Path:
    """A ``java`` that answers ``-version`` as a JDK of that version does (on stderr)."""
    (directory / "bin").mkdir(parents=True, exist_ok=True)
    java = directory / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2024-01-16' >&2\n", encoding="utf-8")
    java.chmod(0o755)
    return java


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
def test_the_machines_java_is_found() -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    java = find_java(env)
    assert java.version in (17, 21)


def test_no_java_names_what_to_install(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}  # an empty directory: no java anywhere
    assert java_command(env) is None
    with pytest.raises(JavaUnavailable) as e:
        find_java(env)
    message = str(e.value)
    assert "\n" not in message
    assert "Java 17 or 21" in message and "openjdk-17-jre-headless" in message
    assert "JAVA_HOME unset" in message


def test_java_home_wins_over_path_as_in_spark_class(tmp_path: Path) -> None:
    fake_java(tmp_path / "on-path", "11.0.2")
    home = tmp_path / "jdk21"
    fake_java(home, "21.0.2")
    env = {"PATH": str(tmp_path / "on-path" / "bin"), "JAVA_HOME": str(home)}
    assert find_java(env).version == 21
    with pytest.raises(JavaUnavailable, match="is Java 11"):
        find_java({"PATH": env["PATH"]})


@pytest.mark.parametrize(("version", "major"), [("1.8.0_402", 8), ("11.0.2", 11), ("25", 25)])
def test_other_versions_are_refused_with_their_number(tmp_path: Path, version: str, major: int) -> None:
    fake_java(tmp_path, version)
    with pytest.raises(JavaUnavailable, match=f"is Java {major}: install"):
        find_java({"PATH": str(tmp_path / "bin")})


def test_java_home_without_a_java(tmp_path: Path) -> None:
    with pytest.raises(JavaUnavailable, match="has no runnable bin/java"):
        find_java({"PATH": "", "JAVA_HOME": str(tmp_path)})


# ------------------------------------------------------------ .ci/java, run by make run / make test

CI_JAVA = Path(__file__).resolve().parents[2] / ".ci" / "java"


def run_ci_java(env: dict[str, str], *prefix: str) -> subprocess.CompletedProcess[str]:
    command = [*prefix, "bash", str(CI_JAVA)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
def test_ci_java_is_a_quiet_no_op_with_java_present() -> None:
    done = run_ci_java({k: v for k, v in os.environ.items() if k != "JAVA_HOME"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_ci_java_refuses_a_java_home_of_another_version_in_one_line(tmp_path: Path) -> None:
    fake_java(tmp_path, "11.0.2")
    done = run_ci_java({**os.environ, "JAVA_HOME": str(tmp_path)})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"Spark needs Java 17 or 21 and JAVA_HOME={tmp_path} is Java 11: "
        "point JAVA_HOME at Java 17 or 21, or unset it"
    ]


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None, reason="as root it would install Java"
)
def test_ci_java_without_java_and_without_root_names_what_to_install(tmp_path: Path) -> None:
    from tests.e2e.test_no_java import path_without_java

    env = {"PATH": path_without_java(tmp_path / "bin"), "HOME": str(tmp_path)}
    # As root this would install Java: run it as an unprivileged user, as a new user would.
    prefix = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups") if os.geteuid() == 0 else ()
    done = run_ci_java(env, *prefix)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "Spark needs Java 17 or 21 and none was found: install one (Debian/Ubuntu: apt-get install "
        "openjdk-17-jre-headless; macOS: brew install openjdk@17) or set JAVA_HOME to it"
    ]
