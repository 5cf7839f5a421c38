"""Issue 51 with Pulsar's official Go and Java clients against a real ``compactor serve``: end-to-end
encryption passed through (a consumer with the key decrypts, those without it act as their
crypto-failure action says, compaction and readCompacted of encrypted messages), a dead letter
policy's initial subscription, topic stats as each client's admin types parse them, and (Java:
Go 0.19.0 has no ExclusiveWithFencing) a fenced producer registering again on its connection.

The scenarios are the programs' own (``tests/go/clientfacts.go``,
``tests/java/.../ClientFacts.java``); this module runs only those, in one process per client,
with the builds and harness of ``test_go_client.py`` and ``test_java_client.py``. Each was also
run against a real Pulsar 4.0.7 (``../shared/real-pulsar``) while written: the same messages,
ids apart (an entry of this service's log is a batch member's position), and the same stats."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.conftest import Server
from tests.e2e.client_programs import ProgramRun, backlog, value

# The builds are those modules' session fixtures, asked for by name below.
from tests.e2e.test_go_client import go, go_build  # noqa: F401 - the fixtures (the session's run)
from tests.e2e.test_java_client import java, java_build  # noqa: F401 - the fixtures (the session's run)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# What the encrypting producers sent, in order (the scenarios' own values).
SENT = [
    ("k1", b"secret-1a"),
    ("k2", b"secret-2a"),
    ("k1", b"secret-1b"),
    ("k2", b"secret-2b"),
    ("k3", b"secret-3"),
]


@pytest.fixture(scope="module", params=["Go", "Java"])
def run(request: pytest.FixtureRequest) -> ProgramRun:
    """Each client's run (the same assertions judge both)."""
    return request.getfixturevalue("go" if request.param == "Go" else "java")  # type: ignore[no-any-return]


def _stats(server: Server, topic: str) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/admin/v2/persistent/{topic.removeprefix('persistent://')}/stats")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# ------------------------------------------------------------------ encryption


def test_a_consumer_with_the_key_decrypts_every_message_encrypted_batches_too(run: ProgramRun) -> None:
    got = run.scenario("encryption")
    assert [(m["key"], value(m)) for m in got["withKey"]] == SENT
    assert [m["id"] for m in got["withKey"]] == [m["id"] for m in got["sent"]]
    assert got.get("withKeyMore") is None


def test_consumers_without_the_key_act_as_their_crypto_failure_action_says(
    run: ProgramRun, shared_server: Server
) -> None:
    got = run.scenario("encryption")
    # CONSUME: each stored entry undecrypted (the batch as one message), with its context.
    consumed = got["consume"]
    assert [m["key"] for m in consumed] == ["k1", "k2", "k3"]
    for m, plain in zip(consumed, (b"secret-1a", b"secret-2b", b"secret-3"), strict=True):
        assert m["encryption"]["keys"] == [f"{run.language.lower()}-rsa"]
        assert plain not in value(m)
    assert consumed[0]["encryption"]["batchSize"] == 3
    # FAIL: nothing delivered, nothing acknowledged; DISCARD: nothing delivered, all acknowledged.
    assert got["fail"] is None and got["discard"] is None
    topic = got["topic"]
    assert backlog(shared_server, topic, "discard") == 0
    assert _stats(shared_server, topic)["subscriptions"]["fail"]["msgBacklog"] == len(SENT)


def test_read_compacted_keeps_the_latest_of_each_key_and_an_encrypted_batch_whole(run: ProgramRun) -> None:
    got = run.scenario("encryption")
    # The batch (k1, k2, k1) is one message to the compactor, under its first key, k1: it is the
    # latest k1 and stays whole (its k2 member with it, as Pulsar's compactor keeps it); the later
    # single k2 and k3 are the latest of theirs. Real Pulsar 4.0.7 gives the same five.
    assert [(m["key"], value(m)) for m in got["compactedReader"]] == SENT


# ------------------------------------------------------------------ dead letter topics


def test_a_dead_letter_topic_keeps_its_messages_for_the_initial_subscription(run: ProgramRun) -> None:
    got = run.scenario("dlqinitial")
    assert got["deliveries"] == 4  # each message twice, then given up
    assert sorted(value(m) for m in got["kept"]) == [b"poison-1", b"poison-2"]
    assert {m["properties"]["REAL_TOPIC"] for m in got["kept"]} == {got["topic"]}


# ------------------------------------------------------------------ stats


def _iso(text: str) -> datetime:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_stats_parse_in_the_clients_admin_types_with_each_clients_facts(run: ProgramRun) -> None:
    got = run.scenario("clientstats")
    lang = run.language.lower()
    version = {"go": "Pulsar-Go-v0.19.0", "java": "Pulsar-Java-v4.0.7"}[lang]
    (p,) = got["publishers"]
    assert p["producerName"] == f"{lang}-stats-producer" and p["accessMode"] == "Shared"
    assert p["metadata"] == {"app": lang} and p["clientVersion"] == version
    assert re.fullmatch(r"/127\.0\.0\.1:\d+", p["address"])
    (c,) = got["consumers"]
    assert c["consumerName"] == f"{lang}-stats-consumer" and c["metadata"] == {"team": lang}
    assert c["clientVersion"] == version and c["address"] == p["address"]  # one connection
    assert _iso(p["connectedSince"]) <= _iso(c["connectedSince"]) <= datetime.now(UTC)


# ------------------------------------------------------------------ producers across reconnections


def test_a_fenced_java_producer_comes_back_on_its_connection(java: ProgramRun) -> None:  # noqa: F811 - the fixture
    got = java.scenario("reconnect")
    assert got["values"] == ["before", "fenced", "after"]
