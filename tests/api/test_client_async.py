"""The async client mirrors the sync one: the same operations, awaited, against a real server.

pytest-asyncio is not a dependency: each test runs its coroutine with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from api.client import (
    AlreadyClosed,
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    AsyncReader,
    AsyncTableView,
    BadRequest,
    CompactionStatus,
    Conflict,
    ConsumerBusy,
    MessageId,
    NotFound,
    Timeout,
    TransportError,
)
from tests.conftest import Server
from tests.server import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def srv(shared_server: Server) -> Server:
    return shared_server


def test_produce_read_and_table_view(srv: Server) -> None:
    async def main() -> None:
        async with AsyncClient(srv.url, timeout=20) as client:
            topic = "public/default/async-read"
            await client.admin.topics.create(topic)
            assert f"persistent://{topic}" in await client.admin.topics.list("public/default")
            producer = await client.create_producer(topic)
            assert isinstance(producer, AsyncProducer)
            first = await producer.send(b"v0", key="a", properties={"p": "q"})
            rest = await producer.send_many([(f"k{i % 7}", f"v{i}") for i in range(1, 1500)])
            ids = [first, *rest]
            assert ids == sorted(ids) and len(set(ids)) == 1500

            reader = await client.create_reader(topic, MessageId.earliest, receiver_queue_size=200)
            assert isinstance(reader, AsyncReader)
            got = [m async for m in reader]
            assert [m.message_id() for m in got] == ids
            assert (got[0].key(), got[0].value(), got[0].properties()) == ("a", b"v0", {"p": "q"})
            with pytest.raises(Timeout):
                await reader.read_next(timeout_millis=100)
            await reader.seek(ids[700])
            assert (await reader.read_next()).message_id() == ids[701]
            inclusive = await client.create_reader(topic, ids[1498], start_message_id_inclusive=True)
            assert [m.message_id() async for m in inclusive] == ids[1498:]

            # A read that waits while a message is produced concurrently.
            latest = await client.create_reader(topic, MessageId.latest)
            assert not await latest.has_message_available()
            waiting = asyncio.ensure_future(latest.read_next(timeout_millis=10_000))
            await asyncio.sleep(0.2)
            late = await producer.send("late", key="late")
            assert (await waiting).message_id() == late

            view = await client.create_table_view(topic, poll_interval=0.05)
            assert isinstance(view, AsyncTableView)
            model = {f"k{i % 7}": f"v{i}".encode() for i in range(1, 1500)} | {"a": b"v0", "late": b"late"}
            assert view.to_dict() == model
            await producer.send(None, key="k3")
            assert await view.refresh() == 1 and "k3" not in view
            updates: list[tuple[str, bytes | None]] = []
            view.listen(lambda k, v: updates.append((k, v)))
            view.start()
            await producer.send_many([("k4", None), ("new", b"n")])
            deadline = time.monotonic() + 10
            while len(updates) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert updates == [("k4", None), ("new", b"n")] and view.get("new") == b"n" and "k4" not in view
            await view.close()
            await producer.close()
            with pytest.raises(AlreadyClosed):
                await producer.send(b"x")

    asyncio.run(main())


def test_consumer_and_admin(srv: Server) -> None:
    async def main() -> None:
        async with AsyncClient(srv.url, timeout=20) as client:
            topic = "public/default/async-consume"
            admin = client.admin.topics
            await admin.create(topic)
            producer = await client.create_producer(topic)
            ids = await producer.send_many([(f"k{i}", f"v{i}") for i in range(4)])
            await asyncio.sleep(0.05)
            ids += await producer.send_many([(f"k{i}", f"v{i}") for i in range(4, 8)])

            consumer = await client.subscribe(
                topic, "s", initial_position="earliest", receiver_queue_size=3, ack_group_time_ms=0
            )
            assert isinstance(consumer, AsyncConsumer)
            got = [await consumer.receive(2000) for _ in range(8)]
            assert [m.message_id() for m in got] == ids
            with pytest.raises(Timeout):
                await consumer.receive(100)
            with pytest.raises(ConsumerBusy):
                await client.subscribe(topic, "s")
            await consumer.acknowledge(got[1])
            await consumer.acknowledge_cumulative(got[3])
            await consumer.redeliver_unacknowledged_messages()
            again = await consumer.batch_receive(10, timeout_millis=2000)
            assert [m.message_id() for m in again] == ids[4:]
            assert all(m.redelivery_count() >= 1 for m in again)
            await consumer.acknowledge_many(again)
            stats = await admin.stats(topic)
            assert stats["subscriptions"]["s"]["msgBacklog"] == 0
            with pytest.raises(BadRequest):
                await consumer.acknowledge("999:1")
            await consumer.seek(ids[2])
            assert (await consumer.receive(2000)).message_id() == ids[2]
            await consumer.seek(got[4].publish_timestamp())
            assert (await consumer.receive(2000)).message_id() == ids[4]
            await consumer.unsubscribe()
            assert await admin.subscriptions(topic) == []

            await admin.create_subscription(topic, "later", initial_position="latest")
            with pytest.raises(Conflict):
                await admin.create_subscription(topic, "later")
            await admin.reset_cursor(topic, "later", MessageId.earliest)
            later = await client.subscribe(topic, "later", read_compacted=True)
            assert later.read_compacted and (await later.receive(2000)).message_id() == ids[0]
            await later.close()
            await admin.delete_subscription(topic, "later")

            assert await admin.get_compaction_threshold(topic) is None
            await admin.set_compaction_threshold(topic, 4096)
            assert await admin.get_compaction_threshold(topic) == 4096
            await admin.remove_compaction_threshold(topic)
            assert await admin.get_compaction_threshold(topic) is None
            ns = client.admin.namespaces
            await ns.set_compaction_threshold("async/ns", 77)
            assert await ns.get_compaction_threshold("async/ns") == 77
            await ns.remove_compaction_threshold("async/ns")
            assert await ns.get_compaction_threshold("async/ns") is None

            with pytest.raises(NotFound):
                await admin.internal_stats("public/default/missing")
            with pytest.raises(Conflict):
                await admin.create(topic)
            await admin.delete(topic)
            with pytest.raises(NotFound):
                await client.create_producer(topic)

        async with AsyncClient(f"http://127.0.0.1:{free_port()}", timeout=2) as dead:
            with pytest.raises(TransportError) as down:
                await dead.admin.topics.list("public/default")
            assert isinstance(down.value.__cause__, httpx.TransportError)

    asyncio.run(main())


@pytest.mark.spark
def test_grouped_acknowledgements_are_sent_on_close(srv: Server) -> None:
    async def main() -> None:
        async with AsyncClient(srv.url, timeout=20) as client:
            topic = "public/default/async-grouped"
            await client.admin.topics.create(topic)
            await (await client.create_producer(topic)).send_many([("a", b"1"), ("b", b"2")])
            consumer = await client.subscribe(
                topic, "s", initial_position="earliest", ack_group_time_ms=60_000
            )
            got = await consumer.batch_receive(10, timeout_millis=2000)
            await consumer.acknowledge_cumulative(got[-1])
            stats = await client.admin.topics.stats(topic)
            assert stats["subscriptions"]["s"]["msgBacklog"] == 2  # held
            await consumer.close()
            stats = await client.admin.topics.stats(topic)
            assert stats["subscriptions"]["s"]["msgBacklog"] == 0

    asyncio.run(main())


def test_compaction_and_read_compacted(srv: Server) -> None:
    async def main() -> None:
        async with AsyncClient(srv.url, timeout=20) as client:
            topic = "public/default/async-compact"
            admin = client.admin.topics
            await admin.create(topic)
            producer = await client.create_producer(topic)
            ids = await producer.send_many([("a", "1"), ("b", "1"), ("a", "2"), ("b", None), ("c", "1")])
            await admin.compact(topic)
            polls: list[str] = []
            status = await admin.wait_for_compaction(
                topic, timeout=120, on_progress=lambda s, _: polls.append(s.status)
            )
            assert status == CompactionStatus("SUCCESS", None) and polls[-1] == "SUCCESS"
            assert (await admin.compaction_status(topic)).status == "SUCCESS"
            internal = await admin.internal_stats(topic)
            assert internal["compactedLedger"]["entries"] == 2 and internal["horizon"] == str(ids[-1])
            reader = await client.create_reader(topic, MessageId.earliest, read_compacted=True)
            assert [(m.key(), m.value()) async for m in reader] == [("a", b"2"), ("c", b"1")]
            consumer = await client.subscribe(topic, "c", read_compacted=True, initial_position="earliest")
            assert [(await consumer.receive(5000)).message_id() for _ in range(2)] == [ids[2], ids[4]]
            new = await producer.send("3", key="b")
            assert (await consumer.receive(5000)).message_id() == new

    asyncio.run(main())
