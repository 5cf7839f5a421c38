"""Pulsar's own admin clients against a real ``compactor serve`` (issue 51): Go's ``pulsaradmin``
(in pulsar-client-go 0.19.0, ``tests/go/admin.go``) and Java's ``pulsar-client-admin`` 4.0.7
(``tests/java/.../AdminScenarios.java``), unchanged, with the requests, bodies and content types
they send to Pulsar: partitioned topics created with properties and without, grown, listed and
deleted; a namespace's topics, of one that does not exist too; messages read by their ids (a
message sent alone and a batch, which the clients split); lookups that create the topic.

The programs and their builds are the Go and Java client tests' (``test_go_client.py``,
``test_java_client.py``); here each runs only these scenarios. What the clients themselves do
with a batch read by id, against Pulsar as here: every member gets the same map of properties
(the last member's win) and, in Java, no key.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Server
from tests.e2e.client_programs import ProgramRun
from tests.e2e.test_go_client import go, go_build
from tests.e2e.test_java_client import java, java_build

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

__all__ = ["go", "go_build", "java", "java_build"]  # the fixtures (the session's runs), by name


@pytest.fixture(params=["go", "java"])
def admin(request: pytest.FixtureRequest) -> ProgramRun:
    """Each client's run, one test per client."""
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def _partitions(server: Server, topic: str) -> dict[str, Any]:
    path = topic.removeprefix("persistent://")
    return httpx.get(f"{server.url}/admin/v2/persistent/{path}/partitions").json()


def test_partitioned_topics_are_created_grown_listed_and_deleted_as_the_clients_ask(
    admin: ProgramRun, shared_server: Server
) -> None:
    r = admin.scenario("adminpartitions")
    props, plain = r["withProperties"], r["plain"]
    owner = admin.language.lower()
    # Created with properties: kept, and read back as Pulsar answers them (the Java client reads them).
    assert r["metadataPartitions"] == 2
    assert r.get("metadataProperties", {"owner": owner, "tier": "gold"}) == {"owner": owner, "tier": "gold"}
    assert _partitions(shared_server, props) == {
        "partitions": 2,
        "properties": {"owner": owner, "tier": "gold"},
    }
    assert r["grownPartitions"] == 3
    assert "409" in r["createAgain"] and "already exists" in r["createAgain"]
    # The namespace is shared with the other scenarios of the run: these two are among its topics.
    assert {plain, props} <= set(r["partitionedListed"])
    listed = r.get("nonPartitionedListed", r.get("listed"))
    assert {f"{plain}-partition-{i}" for i in range(3)} | {f"{props}-partition-{i}" for i in range(2)} <= set(
        listed
    )
    assert {f"{props}-partition-{i}" for i in range(2)} <= set(r["namespaceTopics"])
    assert plain not in r["namespaceTopics"] and props not in r["namespaceTopics"]
    # A namespace that does not exist has no topics (Go gets an empty list; Java no error).
    assert r.get("missingNamespaceTopics") in ([], None)
    assert r.get("missingNamespaceError") is None
    # Deleted: gone with its partitions.
    assert props in r["partitionedAfterDelete"] and plain not in r["partitionedAfterDelete"]
    assert _partitions(shared_server, plain) == {"partitions": 0}


def test_messages_are_read_by_their_ids_alone_and_in_a_batch(admin: ProgramRun) -> None:
    r = admin.scenario("adminmessages")
    single = r["single"]
    ledger, entry = r["singleSent"].split(":")[:2]
    assert single["id"].split(":")[:2] == [ledger, entry]
    assert single["value"] == "alone"
    assert {k: v for k, v in single["properties"].items() if k in ("color", "Mixed-Case")} == {
        "color": "red",
        "Mixed-Case": "v",
    }
    if admin.language == "Java":
        assert single["key"] == "k1" and single["eventTime"] == 1234 and single["publishTime"] > 0
    batch = r["batch"]
    ledger, entry = r["batchSent"][0].split(":")[:2]
    assert [m["id"] for m in batch] == [f"{ledger}:{entry}:{i}" for i in range(3)]
    assert [m["value"] for m in batch] == ["member0", "member1", "member2"]
    assert all(m["properties"]["i"] in {"0", "1", "2"} for m in batch)
    missing = r.get("missingError", r.get("missing"))
    assert missing is not None and "404" in missing and "not found" in missing


def test_a_lookup_creates_the_topic_and_a_missing_namespace_is_not_found(
    admin: ProgramRun, shared_server: Server
) -> None:
    r = admin.scenario("adminlookup")
    assert r["brokerUrl"] == shared_server.pulsar_url
    # The topic looked up exists at once: its stats answer (no publisher yet).
    assert r.get("statsError") is None
    assert r.get("statsPublishers", r.get("publishers")) == 0
    missing = r.get("missingNamespaceError", r.get("missingNamespace"))
    assert missing is not None and "404" in missing and "does not exist" in missing
