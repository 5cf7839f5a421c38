"""Which consumer gets what, as Pulsar's Go (v0.19.0) and Java (4.0.7) clients see it against a
real ``compactor serve``: a Shared subscription's priority levels (Java: the Go client has no
such option), Failover's active consumer as their event listeners hear it (per partition in
Go), consumers reconnected by seeks, and negative acknowledgements redelivered after the
client's delay.

The scenarios are ``tests/go/dispatch.go`` and ``tests/java/.../DispatchScenarios.java``; they run
with the others of their program, in the ``go`` and ``java`` fixtures of ``test_go_client.py``
and ``test_java_client.py``. Each outcome below is also what a Pulsar 4.0.7 broker gave the same
scenario.
"""

from __future__ import annotations

import pytest

from tests.e2e.client_programs import ProgramRun
from tests.e2e.test_go_client import go, go_build  # noqa: F401 - the fixtures, shared
from tests.e2e.test_java_client import java, java_build  # noqa: F401 - the fixtures, shared

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def test_java_a_shared_subscription_serves_the_higher_priority_level_up_to_its_permits(
    java: ProgramRun,  # noqa: F811 - the fixture
) -> None:
    r = java.scenario("priority")
    # The level-0 consumer's queue holds 5: it takes 5 (and then has no permits); level 1 the rest.
    assert (r["high"], r["low"]) == (5, 15)
    assert r["negative"].startswith("refused by the client")  # the Java client's own check


def test_java_failover_listeners_hear_who_is_active(java: ProgramRun) -> None:  # noqa: F811
    r = java.scenario("activelistener")
    assert r["standbyAlone"] == ["active"]
    # A consumer of a higher level (lower number) takes over: each hears it.
    assert r["standbyBeside"] == ["active", "inactive"]
    assert r["primary"] == ["active"]
    # It leaves: the standby is active again.
    assert r["standbyAfter"][-1] == "active"


def test_go_failover_listeners_hear_each_partitions_active_consumer(go: ProgramRun) -> None:  # noqa: F811
    r = go.scenario("listener")
    # Two partitions, consumers "a" and "b": partition i goes to the i-th by name.
    assert r["before"] == {"a": {"0": "active", "1": "inactive"}, "b": {"0": "inactive", "1": "active"}}
    # "a" closes: "b" becomes active on partition 0 too.
    assert r["after"] == {"0": "active", "1": "active"}


def test_go_a_consumer_seeks_again_and_again_without_losing_its_subscription(
    go: ProgramRun,  # noqa: F811
) -> None:
    r = go.scenario("reseek")
    # Each seek closes the consumer from the broker's side and the client subscribes again with
    # the same consumer id; a seek to a message id starts after it (the Go client's default).
    assert r["firsts"] == ["m0", "m1", "m1", "m1"]
    assert "ConsumerBusy" not in go.said()


@pytest.mark.parametrize("language", ["go", "java"])
def test_negatively_acknowledged_messages_come_back_once_the_client_asks(
    language: str,
    go: ProgramRun,  # noqa: F811
    java: ProgramRun,  # noqa: F811
) -> None:
    run = go if language == "go" else java
    delays = run.scenario("nackdelay")["delaysMs"]
    # Each of five messages came back with a redelivery count of 1 (checked by the scenario).
    # The delay is the client's to keep: Java's waits its 100 ms; Go v0.19.0's tracker redelivers
    # on a tick of a third of the delay, from about 30 ms (as against Pulsar 4.0.7 too).
    assert len(delays) == 5
    if language == "java":
        assert min(delays) >= 100
