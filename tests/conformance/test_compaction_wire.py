"""Pulsar's ``CompactionTest`` scenarios again, through the official ``pulsar-client`` over
Pulsar's binary protocol: the same scenario functions as ``test_compaction``, given a client
that speaks the wire for producing and consuming (admin calls stay REST, as Pulsar's admin is).

Each scenario runs twice, as Pulsar's ``batching`` data provider does: with producers that send
each message alone, and with batching producers (``send_many`` hands the messages to the client
asynchronously, so that they travel in batches of several; every id a scenario compares is then
a batch member's ``(ledger, entry, index)``).

Left out, each for a reason of the client's: the scenarios that send null values (the Python
client has no way to send one), the one whose acknowledgements must reach the service before
its next line (the client groups acknowledgements for 100 ms and the Python client cannot turn
that off), and the restart of the shared server.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from api.client import Client
from api.client import MessageId as RestMessageId
from tests.conformance import test_compaction as scenarios

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

LEFT_OUT = {
    "test_batch_message_with_null_value": "sends null values",
    "test_acknowledge_with_reconnection": "needs acknowledgements sent at once",
    "test_broker_restart_after_compaction": "restarts the shared server",
}
SCENARIOS = sorted(n for n in dir(scenarios) if n.startswith("test_") and n not in LEFT_OUT)


def _wire_id(target: Any) -> Any:
    """The scenarios' ``MessageId.earliest`` / ``latest`` as the official client's."""
    if isinstance(target, RestMessageId):
        if target == RestMessageId.earliest:
            return pulsar.MessageId.earliest
        if target == RestMessageId.latest:
            return pulsar.MessageId.latest
        raise ValueError(f"no wire id for {target}")
    return target


class _Message:
    def __init__(self, m: pulsar.Message) -> None:
        self._m = m

    def key(self) -> str | None:
        return self._m.partition_key() or None

    def value(self) -> bytes:
        return self._m.data()

    def message_id(self) -> pulsar.MessageId:
        return self._m.message_id()


class _Consumer:
    def __init__(self, c: pulsar.Consumer | pulsar.Reader) -> None:
        self._c = c

    def receive(self, timeout_millis: int | None = None) -> _Message:
        return _Message(self._c.receive(timeout_millis))  # type: ignore[union-attr]

    def read_next(self, timeout_millis: int | None = None) -> _Message:
        return _Message(self._c.read_next(timeout_millis))  # type: ignore[union-attr]

    def batch_receive(self, max_messages: int = 100, timeout_millis: int = 0) -> list[_Message]:
        out: list[_Message] = []
        wait = max(timeout_millis, 1)
        while len(out) < max_messages:
            try:
                out.append(self.receive(wait))
            except pulsar.Timeout:
                break
            wait = 20  # what is already there, as a batch receive returns it
        return out

    def acknowledge(self, m: _Message) -> None:
        self._c.acknowledge(m._m)  # type: ignore[union-attr]

    def acknowledge_cumulative(self, m: _Message) -> None:
        self._c.acknowledge_cumulative(m._m)  # type: ignore[union-attr]

    def seek(self, target: Any) -> None:
        self._c.seek(_wire_id(target))

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> _Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Producer:
    def __init__(self, p: pulsar.Producer, *, batching: bool) -> None:
        self._p = p
        self._batching = batching

    def send(self, value: bytes, key: str | None = None) -> pulsar.MessageId:
        return self._p.send(value, partition_key=key) if key is not None else self._p.send(value)

    def send_many(self, pairs: list[tuple[str | None, bytes]]) -> list[pulsar.MessageId]:
        if not self._batching:
            return [self.send(v, key=k) for k, v in pairs]
        ids: list[pulsar.MessageId | None] = [None] * len(pairs)
        done = threading.Event()
        left = [len(pairs)]
        lock = threading.Lock()

        def receipt(i: int) -> Any:
            def callback(result: pulsar.Result, mid: pulsar.MessageId) -> None:
                assert result == pulsar.Result.Ok, result
                with lock:
                    ids[i] = mid
                    left[0] -= 1
                    if not left[0]:
                        done.set()

            return callback

        for i, (key, value) in enumerate(pairs):
            kwargs = {"partition_key": key} if key is not None else {}
            self._p.send_async(value, receipt(i), **kwargs)
        self._p.flush()
        assert done.wait(30) or not pairs, "receipts missing"
        return [m for m in ids if m is not None]


class WireClient:
    """The part of ``api.client.Client`` the scenarios use, over Pulsar's binary protocol."""

    def __init__(self, pulsar_url: str, rest: Client, *, batching: bool = False) -> None:
        self._c = pulsar.Client(pulsar_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        self.admin = rest.admin
        self.batching = batching

    def create_producer(self, topic: str) -> _Producer:
        producer = self._c.create_producer(
            topic,
            batching_enabled=self.batching,
            batching_max_messages=4,  # several batches, and batches of several, in a scenario
            batching_max_publish_delay_ms=50,
        )
        return _Producer(producer, batching=self.batching)

    def subscribe(
        self,
        topic: str,
        subscription: str,
        *,
        read_compacted: bool = False,
        initial_position: str = "latest",
        receiver_queue_size: int = 1000,
        **_: object,
    ) -> _Consumer:
        start = (
            pulsar.InitialPosition.Earliest
            if initial_position == "earliest"
            else pulsar.InitialPosition.Latest
        )
        return _Consumer(
            self._c.subscribe(
                topic,
                subscription,
                is_read_compacted=read_compacted,
                initial_position=start,
                receiver_queue_size=receiver_queue_size,
            )
        )

    def create_reader(
        self, topic: str, start: Any, *, read_compacted: bool = False, **_: object
    ) -> _Consumer:
        return _Consumer(self._c.create_reader(topic, _wire_id(start), is_read_compacted=read_compacted))

    def close(self) -> None:
        self._c.close()


@pytest.fixture(params=[False, True], ids=["unbatched", "batched"])
def wire_client(pulsar_server: Any, client: Client, request: pytest.FixtureRequest) -> Iterator[WireClient]:
    c = WireClient(pulsar_server.pulsar_url, client, batching=request.param)
    yield c
    c.close()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_over_the_wire(
    scenario: str, wire_client: WireClient, topic: str, pulsar_server: Any, request: pytest.FixtureRequest
) -> None:
    play = getattr(scenarios, scenario)
    wanted = inspect.signature(play).parameters
    if "retain_null_key" in wanted:
        for retain in (True, False):  # each on a topic of its own
            name = f"{topic}-{'retain' if retain else 'drop'}"
            wire_client.admin.topics.create(name)
            play(client=wire_client, topic=name, pulsar_server=pulsar_server, retain_null_key=retain)
        return
    kwargs: dict[str, Any] = {"client": wire_client, "topic": topic}
    if "pulsar_server" in wanted:
        kwargs["pulsar_server"] = pulsar_server
    play(**kwargs)
