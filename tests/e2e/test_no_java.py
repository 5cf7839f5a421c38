"""The service on a machine without Java: it serves, and says in one line why it cannot compact."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from api.client import Client

pytestmark = pytest.mark.e2e


def path_without_java(farm: Path) -> str:
    """A PATH with everything the current one has but ``java``: one directory of symlinks."""
    farm.mkdir(parents=True, exist_ok=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            link = farm / name
            if name != "java" and not link.exists() and not link.is_symlink():
                link.symlink_to(Path(directory) / name)
    return str(farm)


def wait_for_health(url: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = httpx.get(f"{url}/health", timeout=5).json()
        if body["compaction"] != "starting" or time.monotonic() > deadline:
            return body  # type: ignore[no-any-return]
        time.sleep(0.1)


@pytest.mark.parametrize("warmup", ["true", "false"])
def test_without_java_health_and_last_error_say_to_install_it(
    server_factory, tmp_path: Path, warmup: str
) -> None:
    srv = server_factory(
        tmp_path / "data",
        env={"PATH": path_without_java(tmp_path / "bin"), "COMPACTOR_SPARK_WARMUP": warmup},
        unset=("JAVA_HOME",),
    )
    srv.start()
    health = wait_for_health(srv.url)
    assert health["status"] == "ok"
    compaction = health["compaction"]
    assert compaction.startswith("unavailable: ") and "\n" not in compaction
    reason = compaction.removeprefix("unavailable: ")
    assert "Java 17 or 21" in reason and "openjdk-17-jre-headless" in reason

    with Client(srv.url) as client:
        topic = "public/default/orders"
        client.admin.topics.create(topic)
        client.create_producer(topic).send_many([("a", b"1"), ("b", b"2"), ("a", b"3")])  # produce works
        for _ in range(2):  # every round says it, not only the first
            client.admin.topics.compact(topic)
            status = client.admin.topics.wait_for_compaction(topic, timeout=60)
            assert status.status == "ERROR"
            assert status.last_error == f"compaction unavailable: {reason}"
        assert [m.value() for m in client.create_reader(topic, "earliest")] == [b"1", b"2", b"3"]
    log = srv.log.read_text()
    assert log.count("compaction is unavailable") == 1  # once, in one line, not per round
    assert "JAVA_GATEWAY_EXITED" not in log and "Traceback" not in log
