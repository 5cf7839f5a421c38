"""Pulsar's official Java client (``pulsar-client-original`` 4.0.7, the client inside pulsar-perf),
unchanged, against a real ``compactor serve``.

The client is driven by a small Maven project, ``tests/java``: one program whose scenarios
(produce, consume, compacted, schema, partitions, seek) run side by side in one JVM and write what
they saw as JSON; the tests here judge it. The project is built once and cached under a key of its files
(``~/.cache/topic-compactor/java-client/<key>``; Maven's downloads go to ``~/.m2``), so a later
run only starts the JVM. The Java client reads some reply fields without asking whether they are
set (LightProto throws on an unset optional field without a default), and retries forever when
one is missing: the tests on raw frames below pin those fields, and need no Java.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from tests.conftest import Server
from tests.e2e.client_programs import ProgramRun, backlog, cache_root, keep_built, run_program, value
from tests.e2e.raw_wire import connect, raw, read_frame
from tests.e2e.test_pulsar_clients import fresh, rest_messages

# The first run builds the project (Maven's downloads on a fresh machine included).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROJECT = Path(__file__).resolve().parents[1] / "java"
JAR = "java-client-e2e.jar"
SCENARIOS = (
    "produce",
    "consume",
    "compacted",
    "schema",
    "partitions",
    "seek",
    # Judged in test_go_java_client_facts.py.
    "encryption",
    "dlqinitial",
    "clientstats",
    "reconnect",
    # Judged in test_go_java_termination.py.
    "terminate",
    "quotas",
    # Judged in test_go_java_admin.py.
    "adminpartitions",
    "adminmessages",
    "adminlookup",
    # Judged in test_go_java_dispatch.py.
    "priority",
    "activelistener",
    "nackdelay",
)
# Past the program's own limits (150 s for the longest scenario): a JVM that hangs anyway.
RUN_TIMEOUT_S = 240
# The session's run, by the shared server's URL (see ``java``).
_RUNS: dict[str, ProgramRun] = {}
_WARNING = re.compile(r"\b(WARN|ERROR)\b")


def _tool(name: str) -> str:
    """A command the Java tests need; a failure that says so when it is missing (never a skip:
    CI has both)."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"`{name}` is not on PATH: the Java client's tests need Maven and a JDK 17 or newer "
            "(Debian: apt-get install maven openjdk-17-jdk-headless)",
            pytrace=False,
        )
    return found


def _project_key() -> str:
    """A digest of every file of the project (the pom and the sources)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in PROJECT.rglob("*") if p.is_file() and "target" not in p.parts):
        digest.update(str(path.relative_to(PROJECT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def _maven(mvn: str, *args: str, cwd: Path) -> str:
    out = subprocess.run(
        [mvn, "-q", "-B", *args], cwd=cwd, capture_output=True, text=True, timeout=900, check=False
    )
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-40:])
        pytest.fail(f"mvn {' '.join(args)} failed ({out.returncode}):\n{tail}", pytrace=False)
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout).strip()


def _settings_file(mvn: str, where: Path) -> Path:
    """Maven settings that send every request to Maven's own central repository: Pulsar's poms
    name other repositories, which cannot be reached here."""
    central = _maven(
        mvn, "help:evaluate", "-Dexpression=project.repositories[0].url", "-DforceStdout", cwd=where
    )
    settings = where / "settings.xml"
    settings.write_text(
        "<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>"
        f"<url>{central}</url></mirror></mirrors></settings>\n"
    )
    return settings


@pytest.fixture(scope="session")
def java_build() -> Path:
    """The built project: a directory with the program's jar and ``lib/`` (the client and its
    dependencies), built once per change of the project's files."""
    mvn, _ = _tool("mvn"), _tool("java")
    built = cache_root("java-client") / _project_key()
    if (built / JAR).is_file():
        return built
    built.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=built.parent, prefix="build-") as tmp:
        work = Path(tmp)
        settings = _settings_file(mvn, work)
        out = work / "out"
        _maven(
            mvn,
            "-s",
            str(settings),
            "-f",
            str(PROJECT / "pom.xml"),
            "package",
            f"-Dcompactor.build.dir={out}",
            cwd=work,
        )
        keep_built(out, built, JAR)
    return built


@pytest.fixture(scope="module")
def java(java_build: Path, shared_server: Server, tmp_path_factory: pytest.TempPathFactory) -> ProgramRun:
    """Every scenario, in one JVM, against the shared server: once a session, for every module
    that judges some of them (a fixture imported into a module is that module's own)."""
    run = _RUNS.get(shared_server.url)
    if run is not None:
        return run
    out = tmp_path_factory.mktemp("java") / "results.json"
    classpath = os.pathsep.join([str(java_build / JAR), str(java_build / "lib" / "*")])
    cmd = [
        _tool("java"),
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        classpath,
        "compactor.e2e.Scenarios",
        shared_server.pulsar_url,
        shared_server.url,
        str(out),
        *SCENARIOS,
    ]
    # The client's warnings and errors, not their stack traces.
    run = _RUNS[shared_server.url] = run_program(
        cmd, out, language="Java", timeout=RUN_TIMEOUT_S, warnings=lambda line: bool(_WARNING.search(line))
    )
    return run


# ------------------------------------------------------------------ helpers


def parse_id(text: str) -> tuple[int, int, int]:
    """The program's ``ledger:entry:batchIndex`` (-1 for a message outside a batch)."""
    ledger, entry, index = (int(part) for part in text.split(":"))
    return ledger, entry, index


def rest_id(text: str) -> str:
    """The id REST gives the same message: ``"L:E:i"`` for a batch member, ``"L:E"`` otherwise."""
    ledger, entry, index = parse_id(text)
    return f"{ledger}:{entry}:{index}" if index >= 0 else f"{ledger}:{entry}"


# ------------------------------------------------------------------ producers and consumers


def test_unbatched_sends_get_ids_that_a_consumer_and_rest_see_with_the_same_content(
    java: ProgramRun, shared_server: Server
) -> None:
    r = java.scenario("produce")
    sent = r["unbatchedSent"]
    assert [parse_id(i)[2] for i in sent] == [-1] * 6  # not batch members
    assert len(set(sent)) == 6 and sorted(sent, key=parse_id) == sent
    got = r["unbatchedReceived"]
    assert [m["id"] for m in got] == sent
    assert [value(m) for m in got] == [f"u{i}".encode() for i in range(6)]
    assert [m["key"] for m in got] == [f"k{i % 3}" for i in range(6)]
    assert [m["properties"] for m in got] == [{"n": str(i)} for i in range(6)]
    assert [m["eventTime"] for m in got] == [1000 + i for i in range(6)]
    rest = rest_messages(shared_server, r["unbatchedTopic"])
    assert [m["messageId"] for m in rest] == [rest_id(i) for i in sent]
    assert [base64.b64decode(str(m["value"])) for m in rest] == [value(m) for m in got]


def test_batched_sends_get_batch_member_ids_that_consumers_readers_and_rest_agree_on(
    java: ProgramRun, shared_server: Server
) -> None:
    r = java.scenario("produce")
    sent = [parse_id(i) for i in r["batchedSent"]]
    # A batch of five, then the three the flush sent: one entry each, members numbered from 0.
    assert len({(lid, eid) for lid, eid, _ in sent[:5]}) == 1
    assert len({(lid, eid) for lid, eid, _ in sent[5:]}) == 1
    assert [index for _, _, index in sent] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert sent[5][:2] > sent[0][:2]
    got = r["batchedReceived"]
    assert [m["id"] for m in got] == r["batchedSent"]
    assert [value(m) for m in got] == [f"b{i}".encode() for i in range(8)]
    assert [m["key"] for m in got] == [f"k{i % 3}" for i in range(8)]
    assert [m["properties"] for m in got] == [{"n": str(i)} for i in range(8)]
    assert [m["eventTime"] for m in got] == [2000 + i for i in range(8)]
    # A reader reads the same ids, and again after seeking back to the earliest.
    assert [m["id"] for m in r["readerFirst"]] == r["batchedSent"]
    assert [m["id"] for m in r["readerAfterSeek"]] == r["batchedSent"]
    rest = rest_messages(shared_server, r["batchedTopic"])
    assert [m["messageId"] for m in rest] == [rest_id(i) for i in r["batchedSent"]]
    assert [base64.b64decode(str(m["value"])) for m in rest] == [value(m) for m in got]


def test_a_durable_subscription_redelivers_only_what_was_not_acknowledged(
    java: ProgramRun, shared_server: Server
) -> None:
    r = java.scenario("consume")
    sent = r["unbatchedSent"]
    assert r["firstReceived"] == sent
    # Acknowledged one by one except the 4th and the 8th: the next consumer gets exactly those.
    assert r["redelivered"] == [sent[3], sent[7]]
    assert r["extra"] is None
    assert backlog(shared_server, r["unbatchedTopic"], "s") == 0


def test_batch_index_acknowledgements_leave_only_the_unacknowledged_members(
    java: ProgramRun, shared_server: Server
) -> None:
    r = java.scenario("consume")
    sent = r["batchedSent"]
    assert [parse_id(i)[2] for i in sent] == [0, 1, 2, 3, 4] * 2
    # The first batch acknowledged whole, the second's first two members by index.
    got = r["batchRedelivered"]
    assert [m["id"] for m in got] == sent[7:]
    assert [value(m) for m in got] == [b"b7", b"b8", b"b9"]
    assert r["batchExtra"] is None
    assert backlog(shared_server, r["batchedTopic"], "s") == 0


# ------------------------------------------------------------------ compacted topics


def test_a_read_compacted_reader_and_consumer_see_the_latest_value_of_each_key(
    java: ProgramRun, shared_server: Server
) -> None:
    r = java.scenario("compacted")
    sent = r["sent"]
    before, after = sent[:-1], sent[-1:]
    latest: dict[str, dict[str, Any]] = {}
    for m in before:
        if m["key"] is not None:
            latest[m["key"]] = m
    # An empty value deletes its key, a keyless message is not kept; ids are the original ones.
    kept = sorted((m for m in latest.values() if m["value"]), key=lambda m: parse_id(m["id"]))
    expected = [(m["id"], m["key"], value(m)) for m in kept + after]
    assert [k for _, k, _ in expected] == ["k3", "k0", "k1", "k4", "k1"]
    assert [(m["id"], m["key"], value(m)) for m in r["compactedReader"]] == expected
    assert [(m["id"], m["key"], value(m)) for m in r["compactedConsumer"]] == expected
    assert r["compactedConsumerExtra"] is None
    # Without readCompacted, every message as sent.
    assert [(m["id"], m["key"], value(m)) for m in r["fullReader"]] == [
        (m["id"], m["key"], value(m)) for m in sent
    ]
    # REST's compacted view is the same messages.
    rest = rest_messages(shared_server, r["topic"], readCompacted="true")
    assert [m["messageId"] for m in rest] == [rest_id(i) for i, _, _ in expected]


# ------------------------------------------------------------------ partitioned topics


def test_a_partitioned_topics_ids_name_the_partition_the_router_chose(java: ProgramRun) -> None:
    """The Java client names a message's partition itself (its consumer of each partition knows
    it); what the service sends must agree: a reader of one partition ends where the last message
    id of that partition, which names it, says, and reads it again after a seek."""
    r = java.scenario("partitions")
    routed = {"hello-0": 0, "hello-1": 0, "world-0": 1, "world-1": 1}
    assert {v: m["partition"] for v, m in r["sent"].items()} == routed
    got = r["received"]
    assert {v: m["partition"] for v, m in got.items()} == routed
    assert {v: m["id"] for v, m in got.items()} == {v: m["id"] for v, m in r["sent"].items()}
    assert all(m["topic"] == f"{r['topic']}-partition-{m['partition']}" for m in got.values())
    for read in (r["readerFirst"], r["readerAfterSeek"]):
        assert [(m["value"], m["partition"]) for m in read] == [("world-0", 1), ("world-1", 1)]
        assert [m["id"] for m in read] == [r["sent"][v]["id"] for v in ("world-0", "world-1")]


# ------------------------------------------------------------------ seeks


def _ids_and_values(got: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    return [(m["id"], value(m)) for m in got]


def test_a_consumer_seeks_its_subscription_back_by_message_id_and_by_publish_time(
    java: ProgramRun, shared_server: Server
) -> None:
    """A durable subscription that acknowledged everything is reset. By id the service delivers
    from that message on; the Java client drops the message sought to itself (it becomes the
    consumer's start, which is exclusive) unless the consumer is startMessageIdInclusive. By time,
    from the first message published after the time. Nothing else arrives after either."""
    r = java.scenario("seek")
    sent = list(zip(r["sent"], [f"v{i}".encode() for i in range(7)], strict=True))
    first = r["consumerFirst"]
    assert _ids_and_values(first) == sent[:6]
    # The mark lies between the third and the fourth message's publish times.
    times = [m["publishTime"] for m in first]
    assert times == sorted(times) and times[2] < r["mark"] < times[3]
    assert _ids_and_values(r["consumerAfterSeekId"]) == sent[2:6]
    assert _ids_and_values(r["consumerAfterSeekTime"]) == sent[3:6]
    assert _ids_and_values(r["inclusiveFirst"]) == sent[:6]
    assert _ids_and_values(r["inclusiveAfterSeekId"]) == sent[1:6]
    # Both acknowledged all six (the reader's later seventh message is their backlog).
    path = r["topic"].removeprefix("persistent://")
    stats = httpx.get(f"{shared_server.url}/admin/v2/persistent/{path}/stats").json()["subscriptions"]
    assert {name: stats[name]["markDeletePosition"] for name in ("s", "inclusive")} == {
        "s": rest_id(r["sent"][5]),
        "inclusive": rest_id(r["sent"][5]),
    }


def test_a_reader_seeks_by_message_id_by_publish_time_and_to_the_latest_and_earliest(
    java: ProgramRun,
) -> None:
    """A reader's seek by id reads on after that message (a reader's start is exclusive), by time
    from the first message not published before it; at the latest nothing is left, and the next
    message sent is the next one read; at the earliest everything is read again."""
    r = java.scenario("seek")
    sent = list(zip(r["sent"], [f"v{i}".encode() for i in range(7)], strict=True))
    assert _ids_and_values(r["readerFirst"]) == sent[:6]
    assert _ids_and_values(r["readerAfterSeekId"]) == sent[3:6]
    assert _ids_and_values(r["readerAfterSeekTime"]) == sent[3:6]
    # A time that is a message's publish time exactly includes that message.
    assert r["consumerFirst"][4]["publishTime"] > r["consumerFirst"][3]["publishTime"]
    assert _ids_and_values(r["readerAfterSeekExactTime"]) == sent[4:6]
    assert r["readerAfterSeekLatest"] == []
    assert r["readerAfterLatestNext"] is not None
    assert _ids_and_values([r["readerAfterLatestNext"]]) == sent[6:]
    assert _ids_and_values(r["readerAfterSeekEarliest"]) == sent


def test_a_consumer_and_a_reader_seek_to_a_member_of_a_batch(java: ProgramRun) -> None:
    """A seek to a batch member: the messages after it, the rest of its batch first (the
    Java client drops the members up to the one sought to, as it does the message sought to)."""
    r = java.scenario("seek")
    sent = list(zip(r["batchedSent"], [f"b{i}".encode() for i in range(8)], strict=True))
    assert [parse_id(i)[2] for i, _ in sent] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert _ids_and_values(r["batchedConsumerFirst"]) == sent
    assert _ids_and_values(r["batchedConsumerAfterSeekId"]) == sent[3:]
    assert _ids_and_values(r["batchedReaderFirst"]) == sent
    assert _ids_and_values(r["batchedReaderAfterSeekId"]) == sent[7:]


# ------------------------------------------------------------------ schemas


def test_a_string_producer_and_consumer_and_raw_bytes_beside_them(
    java: ProgramRun, shared_server: Server
) -> None:
    r = java.scenario("schema")
    got = r["strings"]
    assert [m["value"] for m in got] == ["s0", "s1", "raw"]
    # The typed messages carry the topic's schema version, the raw one none.
    assert got[0]["schemaVersion"] is not None and got[1]["schemaVersion"] == got[0]["schemaVersion"]
    assert got[2]["schemaVersion"] is None
    path = r["stringTopic"].removeprefix("persistent://")
    schema = httpx.get(f"{shared_server.url}/admin/v2/schemas/{path}/schema").json()
    assert schema["type"] == "STRING"


def test_a_json_producer_a_typed_consumer_and_an_auto_consume_consumer_agree(java: ProgramRun) -> None:
    r = java.scenario("schema")
    expected = [{"id": "o1", "qty": 3}, {"id": "o2", "qty": 5}]
    assert [{"id": m["id"], "qty": m["qty"]} for m in r["orders"]] == expected
    assert [m["key"] for m in r["orders"]] == ["o1", "o2"]
    assert all(m["schemaVersion"] is not None for m in r["orders"])
    # AUTO_CONSUME asks the service for the topic's schema and decodes with it.
    assert [{"id": m["id"], "qty": m["qty"]} for m in r["autoConsumed"]] == expected
    assert {m["schemaType"] for m in r["autoConsumed"]} == {"JSON"}


# ------------------------------------------------------------------ the fields, on raw frames


def test_producer_success_always_has_a_schema_version_empty_without_a_schema(shared_server: Server) -> None:
    # ClientCnx.handleProducerSuccess reads schema_version unguarded, as Pulsar's broker sets it.
    with raw(shared_server) as s:
        connect(s)
        s.sendall(
            encode(command(pb.BaseCommand.PRODUCER, topic=fresh("java-raw"), producer_id=1, request_id=1))
        )
        reply = read_frame(s)
        assert reply.type == pb.BaseCommand.PRODUCER_SUCCESS
        assert reply.producer_success.HasField("schema_version")
        assert reply.producer_success.schema_version == b""
        string = pb.Schema(name="s", schema_data=b"", type=pb.Schema.String)
        s.sendall(
            encode(
                command(
                    pb.BaseCommand.PRODUCER,
                    topic=fresh("java-raw"),
                    producer_id=2,
                    request_id=2,
                    schema=string,
                )
            )
        )
        reply = read_frame(s)
        assert reply.type == pb.BaseCommand.PRODUCER_SUCCESS
        assert len(reply.producer_success.schema_version) == 8


def test_get_or_create_schema_of_raw_bytes_answers_an_empty_version(shared_server: Server) -> None:
    # A Java producer registers raw bytes (Schema.BYTES, sent as type None) before sending a
    # message of them, and reads schema_version unguarded: empty means "no schema".
    with raw(shared_server) as s:
        connect(s)
        bytes_schema = pb.Schema(name="b", schema_data=b"", type=pb.Schema.Type.Value("None"))
        s.sendall(
            encode(
                command(
                    pb.BaseCommand.GET_OR_CREATE_SCHEMA,
                    request_id=1,
                    topic=fresh("java-raw"),
                    schema=bytes_schema,
                )
            )
        )
        reply = read_frame(s)
        assert reply.type == pb.BaseCommand.GET_OR_CREATE_SCHEMA_RESPONSE
        answer = reply.getOrCreateSchemaResponse
        assert not answer.HasField("error_code")
        assert answer.HasField("schema_version") and answer.schema_version == b""
