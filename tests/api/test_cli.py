"""``compactor topics ...`` (the console script's app) against a real server."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner, Result

from api.client import Client
from api.main import app
from tests.conftest import Server
from tests.server import free_port

pytestmark = pytest.mark.e2e

TOPIC = "public/cli/cli"


@pytest.fixture
def srv(shared_server: Server) -> Server:
    return shared_server


def run(srv: Server, *args: str, url_after: bool = False) -> Result:
    """``compactor topics --url URL ARGS`` (or with ``--url`` after the command)."""
    argv = ["topics", *args, "--url", srv.url] if url_after else ["topics", "--url", srv.url, *args]
    return CliRunner().invoke(app, argv)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result.stdout


@pytest.mark.spark
def test_create_produce_compact_consume_and_stats(srv: Server) -> None:
    assert "created" in ok(run(srv, "create", TOPIC))
    assert ok(run(srv, "list", "public/cli")).splitlines() == [f"persistent://{TOPIC}"]
    out = ok(run(srv, "produce", TOPIC, "-k", "a", "-m", "a1", "-m", "a2", "-n", "2"))
    assert out.startswith("4 messages produced: ")
    ok(run(srv, "produce", TOPIC, "-k", "b", "-m", "b1", "-p", "origin=cli", url_after=True))
    ok(run(srv, "produce", TOPIC, "-k", "c", "-m", "c1"))
    ok(run(srv, "produce", TOPIC, "-k", "c", "--tombstone"))
    ok(run(srv, "produce", TOPIC, "-m", "keyless"))
    with Client(srv.url) as client:
        client.create_producer(TOPIC).send(b"\xff\x00binary", key="bin")

    assert "NOT_RUN" in ok(run(srv, "compaction-status", TOPIC))
    out = ok(run(srv, "compact", TOPIC, "--wait"))
    assert out.strip().endswith("SUCCESS")
    # Not a terminal: a plain line per change of phase or percent while it runs, then the outcome.
    *progress, last = out.strip().splitlines()
    assert last == f"compaction of {TOPIC}: SUCCESS"
    assert progress, out
    shape = rf"compacting {TOPIC}: RUNNING( (phase-one|phase-two|commit) \d+\.\d% \([\d,]+/[\d,]+ entries\))?"
    for line in progress:
        assert re.fullmatch(shape, line), line
    assert len(set(progress)) == len(progress)
    assert ok(run(srv, "compaction-status", TOPIC, "--wait")).strip() == f"compaction of {TOPIC}: SUCCESS"

    # The compacted topic: the latest of a, b and bin; c was deleted, keyless dropped.
    result = run(
        srv,
        "consume",
        TOPIC,
        "-s",
        "sub",
        "--read-compacted",
        "--initial-position",
        "earliest",
        "-n",
        "0",
        "--timeout",
        "0.5",
    )
    lines = ok(result).splitlines()
    assert [line.split("  ")[1:3] for line in lines] == [
        ["key=a", "value=a2"],
        ["key=b", "value=b1"],
        ["key=bin", "value=base64:/wBiaW5hcnk="],
    ]
    assert 'properties={"origin": "cli"}' in lines[1]
    assert "3 messages consumed" in result.stderr

    # The full log through a second subscription, one message at a time.
    out = ok(run(srv, "consume", TOPIC, "-s", "all", "--initial-position", "earliest", "-n", "2"))
    assert [line.split("  ")[1:3] for line in out.splitlines()] == [
        ["key=a", "value=a1"],
        ["key=a", "value=a2"],
    ]

    stats = json.loads(ok(run(srv, "stats", TOPIC)))
    assert stats["subscriptions"]["sub"]["msgBacklog"] == 0
    assert stats["subscriptions"]["all"]["msgBacklog"] == 7
    internal = json.loads(ok(run(srv, "internal-stats", TOPIC)))
    assert internal["compactedLedger"]["ledgerId"] != -1 and internal["compactedLedger"]["entries"] == 3

    assert "deleted" in ok(run(srv, "delete", TOPIC))
    assert ok(run(srv, "list", "public/cli")) == ""


def test_errors_exit_1_with_the_reason(srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    ok(run(srv, "create", "public/cli/dup"))
    result = run(srv, "create", "public/cli/dup")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: topic persistent://public/cli/dup already exists"
    assert "Traceback" not in result.output

    result = run(srv, "stats", "public/cli/missing")
    assert result.exit_code == 1 and result.stderr.startswith("error: ") and "not found" in result.stderr
    result = run(srv, "create", "not-a-topic")
    assert result.exit_code == 1 and "invalid topic name" in result.stderr
    result = run(srv, "produce", "public/cli/dup")  # neither -m nor --tombstone
    assert result.exit_code == 2

    # The URL from the environment; a closed port is a transport error.
    monkeypatch.setenv("COMPACTOR_URL", f"http://127.0.0.1:{free_port()}")
    result = CliRunner().invoke(app, ["topics", "list", "public/cli"])
    assert result.exit_code == 1 and result.stderr.startswith("error: ConnectError")
    monkeypatch.setenv("COMPACTOR_URL", srv.url)
    assert "persistent://public/cli/dup" in ok(CliRunner().invoke(app, ["topics", "list", "public/cli"]))


def test_consume_as_two_shared_consumers_takes_each_message_once(srv: Server) -> None:
    topic = "public/cli/shared"
    ok(run(srv, "create", topic))
    ok(run(srv, "produce", topic, "-k", "k", "-m", "m", "-n", "6"))
    args = ("consume", topic, "-s", "workers", "--initial-position", "earliest")
    args = (*args, "--subscription-type", "Shared")
    # The first takes three and leaves; with it gone, the second Shared consumer gets the rest.
    first = ok(run(srv, *args, "-n", "3", "--consumer-name", "a"))
    second = ok(run(srv, *args, "-n", "0", "--timeout", "1", "--consumer-name", "b"))
    ids = [line.split("  ")[0] for line in (first + second).splitlines()]
    assert len(ids) == 6 and len(set(ids)) == 6
    refused = run(srv, "consume", topic, "-s", "workers", "--subscription-type", "Nope")
    assert refused.exit_code == 2  # typer refuses a type Pulsar does not have
    stats = json.loads(ok(run(srv, "stats", topic)))
    assert stats["subscriptions"]["workers"]["msgBacklog"] == 0
    ok(run(srv, "delete", topic))
