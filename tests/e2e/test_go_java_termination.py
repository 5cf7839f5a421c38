"""Topic termination and backlog quotas through Pulsar's Go and Java clients and their admin
clients (Go's ``pulsaradmin`` v0.19.0, Java's ``PulsarAdmin`` 4.0.7), against a real
``compactor serve``: the ``terminate`` and ``quotas`` scenarios of ``tests/go/termination.go`` and
``tests/java/.../Termination.java``, run here on their own (the full runs of
test_go_client.py and test_java_client.py include them too).

What each client can see differs: Java's consumers and readers have ``hasReachedEndOfTopic``
(the service sends them REACHED_END_OF_TOPIC once they consumed everything); the Go client
v0.19.0 knows no such command (it would close its connection on it, so the service does not send
it to Go), and its consumer simply has nothing more to receive.
"""

from __future__ import annotations

import pytest

from tests.e2e.client_programs import ProgramRun
from tests.e2e.test_go_client import go, go_build  # noqa: F401 - the fixtures (the session's run)
from tests.e2e.test_java_client import java, java_build  # noqa: F401 - the fixtures (the session's run)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def _entry(text: str) -> str:
    """``ledger:entry`` of a program's id (``L:E:batch[:partition]``)."""
    return ":".join(text.split(":")[:2])


# ------------------------------------------------------------------ termination


def test_go_admin_terminates_and_the_go_client_is_refused_but_reads_everything(go: ProgramRun) -> None:  # noqa: F811 - the fixture
    r = go.scenario("terminate")
    assert r["terminated"] == _entry(r["sent"][-1])  # the last message's id, as pulsaradmin parses it
    assert r["terminatedAgain"] == r["terminated"]
    # The send fails with the refusal of the producer's reconnection, or, once the Go client has
    # closed the producer on that refusal, with ProducerClosed: which one is the send's timing.
    assert "TopicTerminated" in r["sendAfter"] or "ProducerClosed" in r["sendAfter"]
    assert "TopicTerminated" in r["newProducer"]
    assert r["received"] == ["t0", "t1", "t2"] and r["receivedExtra"] is None
    assert [m["id"] for m in r["read"]] == r["sent"]


def test_java_admin_terminates_and_java_consumers_and_readers_reach_the_end(java: ProgramRun) -> None:  # noqa: F811 - the fixture
    r = java.scenario("terminate")
    assert r["terminated"] == _entry(r["sent"][-1])
    assert r["endBeforeReading"] is False  # not before it read (and acknowledged) everything
    assert "TopicTerminated" in r["sendAfter"]
    assert "TopicTerminated" in r["newProducer"]
    assert r["received"] == ["t0", "t1", "t2"]
    assert r["consumerReachedEnd"] is True
    assert [m["id"] for m in r["read"]] == r["sent"]
    assert r["readerReachedEnd"] is True


# ------------------------------------------------------------------ backlog quotas


def test_go_admin_backlog_quota_calls_and_what_a_go_producer_hears(go: ProgramRun) -> None:  # noqa: F811 - the fixture
    r = go.scenario("quotas")
    assert r["namespaceBefore"] == {}
    assert r["namespaceSet"] == {
        "destination_storage": {"limitSize": 1000, "limitTime": -1, "policy": "producer_exception"},
        "message_age": {"limitSize": -1, "limitTime": 3600, "policy": "consumer_backlog_eviction"},
    }
    assert list(r["namespaceRemoved"]) == ["message_age"]  # RemoveBacklogQuota: destination_storage
    assert r["topicSet"] == {
        "destination_storage": {"limitSize": 500, "limitTime": -1, "policy": "producer_exception"}
    }
    assert "ProducerBlockedQuotaExceededException" in r["refusedException"]
    assert "ProducerBlockedQuotaExceededError" in r["refusedHold"]
    assert r["afterCatchingUp"] is None  # under the quota again: welcome
    applied = r["topicApplied"]  # the topic's removed: its namespace's, else the default (none)
    assert applied["message_age"]["limitTime"] == 3600
    assert applied["destination_storage"]["limitSize"] == -1


def test_java_admin_backlog_quota_calls_and_what_a_java_producer_hears(java: ProgramRun) -> None:  # noqa: F811 - the fixture
    r = java.scenario("quotas")
    assert r["namespaceBefore"] == 0
    quota = r["namespaceSet"]["destination_storage"]
    assert quota["limitSize"] == 1000 and quota["policy"] == "producer_exception"
    assert r["namespaceRemoved"] == 0
    assert r["topicSet"]["destination_storage"]["limitSize"] == 500
    assert "ProducerBlockedQuotaExceeded" in r["refused"]
    assert r["afterRemove"] is None
