"""Pulsar's official Go client (``github.com/apache/pulsar-client-go`` 0.19.0), unchanged, against
a real ``compactor serve``.

The client is driven by a small Go module, ``tests/go``: one program whose scenarios (produce,
shared, keyshared, failover, redelivery, reader, seek, compacted, compression, schema,
partitions, lastid, http) run side by side and write what they saw as JSON; the tests here judge
it. The module's dependencies are pinned by its ``go.mod`` and ``go.sum`` and come through the
Go module proxy. The program is built once and cached under a key of the module's files and the
Go version (``~/.cache/topic-compactor/go-client/<key>``; Go's own caches are in ``~/go`` and
``~/.cache/go-build``), so a later run only starts it. Go is found on PATH, else at
``/usr/local/go/bin/go`` (where Go's own installer puts it); without Go the tests are skipped,
saying so.

What the Go client does differently from the Java and C++ clients, against Pulsar's broker as
against this service, and the tests take as given: ids of unbatched messages carry batch index 0
(``L:E:0``); a consumer's ``Seek(id)`` hands over the messages after that id (the service sends
from the id on, as Pulsar's broker does, and the client drops the one it sought to); an
unbatched producer writes no schema version into its messages; the ids ``GetLastMessageIDs``
gives carry no partition; and an unbatched message with
neither payload nor properties is dropped as corrupt (apache/pulsar-client-go#1482, after
0.19.0), so the tombstone below has a property.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server
from tests.e2e.client_programs import ProgramRun, backlog, cache_root, keep_built, run_program, value
from tests.e2e.test_pulsar_clients import rest_messages

# The first run on a machine builds the module (its downloads and compilation included).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

MODULE = Path(__file__).resolve().parents[1] / "go"
BINARY = "goclient"
SCENARIOS = (
    "produce",
    "shared",
    "keyshared",
    "failover",
    "redelivery",
    "reader",
    "seek",
    "compacted",
    "schema",
    "partitions",
    "lastid",
    "http",
    "compression",
    # Judged in test_go_java_client_facts.py.
    "encryption",
    "dlqinitial",
    "clientstats",
    # Judged in test_go_java_termination.py.
    "terminate",
    "quotas",
    # Judged in test_go_java_admin.py.
    "adminpartitions",
    "adminmessages",
    "adminlookup",
    # Judged in test_go_java_dispatch.py.
    "listener",
    "reseek",
    "nackdelay",
)
# The session's run, by the shared server's URL (see ``go``).
_RUNS: dict[str, ProgramRun] = {}
# Past the program's own limits (150 s for the longest scenario): a program that hangs anyway.
RUN_TIMEOUT_S = 240
# A first build compiles the client and its dependencies: minutes on a busy 2-core machine.
BUILD_TIMEOUT_S = 1100


def go_command() -> str | None:
    """The ``go`` command: on PATH, else where Go's own installer puts it."""
    found = shutil.which("go")
    if found is None and os.access("/usr/local/go/bin/go", os.X_OK):
        found = "/usr/local/go/bin/go"
    return found


def _module_key(go: str) -> str:
    """A digest of the module's files and of the Go version that builds them."""
    version = subprocess.run([go, "version"], capture_output=True, text=True, timeout=60, check=True).stdout
    digest = hashlib.sha256(version.encode())
    for path in sorted(p for p in MODULE.iterdir() if p.is_file() and p.name != BINARY):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


@pytest.fixture(scope="session")
def go_build() -> Path:
    """The built program, built once per change of the module's files or of Go."""
    go = go_command()
    if go is None:
        pytest.skip(
            "Go is not installed (`go` is not on PATH nor at /usr/local/go/bin/go): "
            "the Go client's tests need Go 1.24 or newer"
        )
    built = cache_root("go-client") / _module_key(go)
    if (built / BINARY).is_file():
        return built / BINARY
    built.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=built.parent, prefix="build-") as tmp:
        out = Path(tmp) / "out"
        # -mod=readonly: the pinned go.mod and go.sum as they are, never updated by the build.
        proc = subprocess.run(
            [go, "build", "-mod=readonly", "-buildvcs=false", "-o", str(out / BINARY), "."],
            cwd=MODULE,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
            pytest.fail(f"go build failed ({proc.returncode}):\n{tail}", pytrace=False)
        keep_built(out, built, BINARY)
    return built / BINARY


@pytest.fixture(scope="module")
def go(go_build: Path, shared_server: Server, tmp_path_factory: pytest.TempPathFactory) -> ProgramRun:
    """Every scenario, in one process, against the shared server: once a session, for every
    module that judges some of them (a fixture imported into a module is that module's own)."""
    run = _RUNS.get(shared_server.url)
    if run is None:
        out = tmp_path_factory.mktemp("go") / "results.json"
        cmd = [str(go_build), shared_server.pulsar_url, shared_server.url, str(out), *SCENARIOS]
        run = _RUNS[shared_server.url] = run_program(cmd, out, language="Go", timeout=RUN_TIMEOUT_S)
    return run


# ------------------------------------------------------------------ helpers


def entry(text: str) -> tuple[int, int]:
    """The ``(ledger, entry)`` of the program's ``ledger:entry:batchIndex:partition``."""
    ledger, entry_id, _, _ = (int(part) for part in text.split(":"))
    return ledger, entry_id


def order(text: str) -> tuple[int, ...]:
    """The program's id as numbers, in the order of the log."""
    return tuple(int(part) for part in text.split(":"))


def rest_id(m: dict[str, Any]) -> str:
    """The id REST gives a received message: ``"L:E:i"`` for a batch member, ``"L:E"`` otherwise."""
    ledger, entry_id, index, _ = (int(part) for part in m["id"].split(":"))
    return f"{ledger}:{entry_id}:{index}" if m["batchSize"] > 1 else f"{ledger}:{entry_id}"


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [m["id"] for m in messages]


# ------------------------------------------------------------------ producers and consumers


def test_unbatched_sends_reach_an_exclusive_consumer_and_rest_with_keys_and_properties(
    go: ProgramRun, shared_server: Server
) -> None:
    r = go.scenario("produce")
    sent = r["unbatchedSent"]
    assert len({entry(i) for i in sent}) == 6 and sorted(sent, key=entry) == sent
    got = r["unbatchedReceived"]
    assert ids(got) == sent
    assert [value(m) for m in got] == [f"u{i}".encode() for i in range(6)]
    assert [m["key"] for m in got] == [f"k{i % 3}" for i in range(6)]
    assert [m["properties"] for m in got] == [{"n": str(i)} for i in range(6)]
    assert [m["eventTime"] for m in got] == [1000 + i for i in range(6)]
    assert all(m["batchSize"] == 1 for m in got)
    assert r["unbatchedReceivedExtra"] is None
    rest = rest_messages(shared_server, r["unbatchedTopic"])
    assert [m["messageId"] for m in rest] == [rest_id(m) for m in got]
    assert [base64.b64decode(str(m["value"])) for m in rest] == [value(m) for m in got]
    assert backlog(shared_server, r["unbatchedTopic"], "s") == 0


def test_batched_sends_get_member_ids_that_the_consumer_and_rest_agree_on(
    go: ProgramRun, shared_server: Server
) -> None:
    r = go.scenario("produce")
    sent = r["batchedSent"]
    # A batch of five when the fifth was added, then three on the flush: members numbered from 0.
    assert [int(i.split(":")[2]) for i in sent] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert len({entry(i) for i in sent[:5]}) == 1 and len({entry(i) for i in sent[5:]}) == 1
    got = r["batchedReceived"]
    assert ids(got) == sent
    assert [m["batchSize"] for m in got] == [5] * 5 + [3] * 3
    assert [value(m) for m in got] == [f"b{i}".encode() for i in range(8)]
    assert [m["key"] for m in got] == [f"k{i % 3}" for i in range(8)]
    assert [m["properties"] for m in got] == [{"n": str(i)} for i in range(8)]
    assert [m["eventTime"] for m in got] == [2000 + i for i in range(8)]
    assert r["batchedReceivedExtra"] is None
    rest = rest_messages(shared_server, r["batchedTopic"])
    assert [m["messageId"] for m in rest] == [rest_id(m) for m in got]


def test_a_shared_subscription_gives_each_message_to_one_of_its_consumers(
    go: ProgramRun, shared_server: Server
) -> None:
    r = go.scenario("shared")
    got = r["received"]
    values = got["first"] + got["second"]
    expected = [f"u{i}" for i in range(10)] + [f"b{i}" for i in range(10)]
    assert sorted(values) == sorted(expected)  # every one, none twice
    assert got["first"] and got["second"]  # both consumers had work
    assert "firstExtra" not in got and "secondExtra" not in got
    assert backlog(shared_server, r["topic"], "workers") == 0


def test_a_key_shared_subscription_gives_each_key_to_one_consumer_in_order(go: ProgramRun) -> None:
    r = go.scenario("keyshared")
    got = r["received"]
    assert sorted(int(value(m)) for ms in got.values() for m in ms) == list(range(20))
    owners: dict[str, set[str]] = {}
    for who, ms in got.items():
        for m in ms:
            owners.setdefault(m["key"], set()).add(who)
        for key in {m["key"] for m in ms}:  # each key's messages in the order sent
            mine = [int(value(m)) for m in ms if m["key"] == key]
            assert mine == sorted(mine)
    assert all(len(who) == 1 for who in owners.values()), owners
    assert len(owners) == 4


def test_a_failover_subscription_has_one_active_consumer_and_the_other_takes_over(go: ProgramRun) -> None:
    r = go.scenario("failover")
    active = r["active"]
    standby = "second" if active == "first" else "first"
    assert [value(m) for m in r["before"][active]] == [b"before0", b"before1", b"before2"]
    assert r["before"][standby] == []
    assert [value(m) for m in r["after"][standby]] == [b"after0", b"after1", b"after2"]


def test_what_was_not_acknowledged_is_redelivered_after_a_reconnection_and_a_nack(
    go: ProgramRun, shared_server: Server
) -> None:
    r = go.scenario("redelivery")
    sent = r["sent"]
    assert r["firstReceived"] == sent
    # Acknowledged one by one but the 4th and the 8th, by a client that went away: the next
    # consumer gets exactly those two; the one it negatively acknowledged comes back again.
    again = r["redelivered"]
    assert ids(again) == [sent[3], sent[7], sent[3]]
    assert [value(m) for m in again] == [b"a3", b"a7", b"a3"]
    # (Redelivery counts are left alone: Pulsar's broker counts them on Shared and Key_Shared
    # subscriptions only, and this one is Exclusive, where the service counts them too.)
    assert r["extra"] is None
    assert backlog(shared_server, r["topic"], "s") == 0


def test_batch_index_acknowledgements_leave_only_the_members_not_acknowledged(
    go: ProgramRun, shared_server: Server
) -> None:
    r = go.scenario("redelivery")
    sent = r["batchedSent"]
    assert [int(i.split(":")[2]) for i in sent] == [0, 1, 2, 3, 4] * 2
    got = r["batchRedelivered"]
    assert ids(got) == sent[7:]
    assert [value(m) for m in got] == [b"b7", b"b8", b"b9"]
    assert r["batchExtra"] is None
    assert backlog(shared_server, r["batchedTopic"], "s") == 0


def test_a_cumulative_acknowledgement_acknowledges_everything_up_to_its_message(
    go: ProgramRun, shared_server: Server
) -> None:
    r = go.scenario("redelivery")
    sent = r["cumulativeSent"]
    assert ids(r["afterCumulative"]) == sent[3:]
    assert backlog(shared_server, r["cumulativeTopic"], "s") == 0


# ------------------------------------------------------------------ readers, seeks, last ids


def test_readers_start_at_the_earliest_at_a_message_id_and_at_the_latest(go: ProgramRun) -> None:
    r = go.scenario("reader")
    sent = r["sent"]  # six unbatched messages, then a batch of four
    assert [value(m) for m in r["earliest"]] == [f"m{i}".encode() for i in range(10)]
    assert ids(r["earliest"]) == sent
    assert ids(r["afterThird"]) == sent[3:]  # the start id excluded (the default)
    assert ids(r["fromThird"]) == sent[2:]  # StartMessageIDInclusive
    assert ids(r["afterBatchMember"]) == sent[8:]
    assert ids(r["fromBatchMember"]) == sent[7:]
    assert r["latest"] == []


def test_a_consumer_and_a_reader_seek_by_message_id_and_by_publish_time(go: ProgramRun) -> None:
    r = go.scenario("seek")
    sent = r["sent"]
    assert ids(r["received"]) == sent
    # Go's consumer hands over what follows the id it sought to (see the module's docstring),
    # each once: everything was acknowledged before, a seek delivers it again.
    assert ids(r["afterSeekById"]) == sent[3:]
    # By time: from the first message published at or after it, the 5th's publish time.
    assert r["seekTime"] == r["received"][4]["publishTime"]
    assert ids(r["afterSeekByTime"]) == sent[4:]  # and nothing more until it went quiet
    assert ids(r["readerAfterSeekById"]) == sent[4:]
    # HasNext after a seek by time asks for the reader's mark-delete position: it must not be
    # the end of what the service already sent ahead.
    assert ids(r["readerAfterSeekByTime"]) == sent[4:]


def test_the_last_message_id_of_an_empty_topic_after_sends_and_after_a_batch(go: ProgramRun) -> None:
    r = go.scenario("lastid")
    sent = r["sent"]  # three unbatched messages, then a batch of three
    topic = r["topic"]
    assert [m["topic"] for m in r["empty"]] == [topic]
    assert int(r["empty"][0]["id"].split(":")[1]) == -1  # no entry yet
    assert [m["id"] for m in r["afterUnbatched"]] == [sent[2]]
    assert [m["id"] for m in r["afterBatch"]] == [sent[5]]  # the batch's last member
    assert r["reader"] == sent[5]


# ------------------------------------------------------------------ compacted topics


def test_read_compacted_readers_and_consumers_see_the_latest_value_of_each_key(
    go: ProgramRun, shared_server: Server
) -> None:
    r = go.scenario("compacted")
    sent = r["sent"]
    before, after = sent[:-1], sent[-1:]
    latest: dict[str, dict[str, Any]] = {}
    for m in before:
        if m["key"] is not None:
            latest[m["key"]] = m
    # An empty value deletes its key, a keyless message is not kept; ids are the original ones.
    kept = sorted((m for m in latest.values() if value(m)), key=lambda m: order(m["id"]))
    expected = [(m["id"], m["key"], value(m)) for m in kept + after]
    assert [k for _, k, _ in expected] == ["k3", "k0", "k1", "k4", "k1"]
    assert [(m["id"], m["key"], value(m)) for m in r["compactedReader"]] == expected
    assert [(m["id"], m["key"], value(m)) for m in r["compactedConsumer"]] == expected
    assert r["compactedConsumerExtra"] is None
    # Without readCompacted, every message as sent, the tombstone included.
    assert [(m["id"], m["key"], value(m)) for m in r["fullReader"]] == [
        (m["id"], m["key"], value(m)) for m in sent
    ]
    rest = rest_messages(shared_server, r["topic"], readCompacted="true")
    assert [m["messageId"] for m in rest] == [rest_id(m) for m in r["compactedReader"]]
    # A TableView over it: the latest value of each key, the deleted key gone.
    assert r["tableView"] == {"k0": "b0", "k1": "after", "k3": "a3", "k4": "b4"}


def test_batches_compressed_by_the_go_codecs_are_read_and_compacted(
    go: ProgramRun, shared_server: Server
) -> None:
    r = go.scenario("compression")
    sent = r["sent"]  # LZ4, ZLIB and ZSTD batches, then an LZ4-compressed unbatched message
    assert [(m["id"], m["key"], value(m)) for m in r["fullReader"]] == [
        (m["id"], m["key"], value(m)) for m in sent
    ]
    latest = {m["key"]: m for m in sent}
    expected = sorted(latest.values(), key=lambda m: order(m["id"]))
    assert [(m["id"], value(m)) for m in r["compactedReader"]] == [(m["id"], value(m)) for m in expected]
    assert [value(m).split(b"-")[0] for m in expected] == [b"lz4", b"zlib", b"zlib", b"zstd", b"single"]
    rest = rest_messages(shared_server, r["topic"], readCompacted="true")
    assert [base64.b64decode(str(m["value"])) for m in rest] == [value(m) for m in expected]


# ------------------------------------------------------------------ schemas


@pytest.mark.parametrize("kind", ["json", "avro"])
def test_a_schema_producer_and_a_consumer_with_the_same_schema(go: ProgramRun, kind: str) -> None:
    r = go.scenario("schema")
    got = r[kind]
    assert [(m["key"], m["id"], m["qty"]) for m in got] == [("o1", "o1", 3), ("o2", "o2", 5)]
    registered = r[f"{kind}Registered"]
    assert registered["type"] == kind.upper()
    fields = json.loads(registered["data"])["fields"]
    assert [(f["name"], f["type"]) for f in fields] == [("id", "string"), ("qty", "int")]
    # Each message carries the version the topic registered, as 8 bytes (Pulsar's long).
    version = int(registered["version"]).to_bytes(8, "big").hex()
    assert [m["schemaVersion"] for m in got] == [version, version]


# ------------------------------------------------------------------ partitioned topics


def test_a_partitioned_topic_routes_consumes_and_names_each_partition(go: ProgramRun) -> None:
    r = go.scenario("partitions")
    topic = r["topic"]
    names = [f"{topic}-partition-{i}" for i in range(3)]
    assert r["partitions"] == names
    sent = r["sent"]
    partition = {v: int(i.split(":")[3]) for v, i in sent.items()}
    assert partition["pinned4"] == partition["pinned5"] == 2  # the custom router's choice
    received = r["received"]
    assert set(received) == set(sent)
    for v, m in received.items():
        assert m["id"] == sent[v]  # the partition index included
        assert m["topic"] == names[partition[v]]
    assert r["extra"] is None
    # The last message id of each partition: the last sent to it (Go's client keeps the
    # partition of these ids by their topic, not in the id).
    last_sent: dict[str, tuple[int, ...]] = {}
    for i in sorted(sent.values(), key=order):
        last_sent[names[int(i.split(":")[3])]] = order(i)[:3]
    assert {t: order(i)[:3] for t, i in r["last"].items()} == last_sent


# ------------------------------------------------------------------ an HTTP service URL


def test_a_client_given_the_http_url_looks_topics_up_over_rest_and_works(go: ProgramRun) -> None:
    r = go.scenario("http")
    got = r["received"]
    assert ids(got) == [r["sent"]]
    assert [(m["key"], value(m)) for m in got] == [("k", b"over http")]
