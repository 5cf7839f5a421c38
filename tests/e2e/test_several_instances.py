"""Several ``compactor serve`` processes on one PostgreSQL database and one storage root.

Real processes, a real PostgreSQL (from ``COMPACTOR_TEST_POSTGRES_URL``, else ``.ci/postgres``
sets one up), real files, real kill -9 and SIGSTOP. Every instance runs with authentication on,
so that every redirect in these tests also shows the token reaching the owner.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from api.client import AuthenticationToken, Client, ClientError, Conflict, DeadLetterPolicy, MessageId
from api.main import app
from tests.conftest import Server
from tests.server import ServerProcess, fresh_database_url

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"several-instances-test-secret-key-32b"
NS = "public/default"


def _token(role: str = "admin") -> str:
    import jwt

    return jwt.encode({"sub": role}, SECRET, algorithm="HS256")


HEADERS = {"Authorization": f"Bearer {_token()}"}
# Each instance's pulsar:// URL by its HTTP URL.
_PULSAR_URLS: dict[str, str] = {}


class Cluster:
    """``n`` instances sharing one fresh database and one storage root."""

    def __init__(self, tmp: Path, database_url: str, lease_ms: int) -> None:
        self.tmp = tmp
        self.database_url = database_url
        self.lease_ms = lease_ms
        self.servers: list[ServerProcess] = []

    def start(self, n: int, listeners: Callable[[ServerProcess], str] | None = None) -> list[ServerProcess]:
        """``listeners``: each instance's COMPACTOR_ADVERTISED_LISTENERS, given the instance."""
        env = {
            "COMPACTOR_DATABASE_URL": self.database_url,
            "COMPACTOR_OWNERSHIP_LEASE_MS": str(self.lease_ms),
            "COMPACTOR_AUTHENTICATION_ENABLED": "true",
            "COMPACTOR_AUTHORIZATION_ENABLED": "true",
            "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(SECRET).decode(),
            "COMPACTOR_SUPERUSER_ROLES": "admin",
        }
        started = []
        for _ in range(n):
            s = Server(self.tmp / "data", env=dict(env))
            if listeners is not None:
                s.extra_env["COMPACTOR_ADVERTISED_LISTENERS"] = listeners(s)
            s.start()
            self.servers.append(s)
            started.append(s)
            _PULSAR_URLS[s.url] = s.pulsar_url
        started[0].create_namespaces(NS, token=_token())
        return started

    def client(self, *servers: ServerProcess, retry_s: float = 60.0) -> Client:
        return Client(
            ",".join(s.url for s in servers),
            authentication=AuthenticationToken(_token()),
            retry_unavailable_s=retry_s,
        )

    def stop(self) -> None:
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                s.resume()  # a paused process takes SIGKILL too, but not its wait
            s.kill()


@pytest.fixture
def cluster(tmp_path: Path, postgres_admin: str, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    url = fresh_database_url(f"several_{request.node.name}", admin=postgres_admin)
    assert url is not None
    c = Cluster(tmp_path, url, lease_ms=int(getattr(request, "param", 2000)))
    yield c
    c.stop()


def _owner(server: ServerProcess, topic: str) -> str:
    r = httpx.get(f"{server.url}/lookup/v2/topic/persistent/{topic}", headers=HEADERS, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["brokerUrl"] == _PULSAR_URLS[body["httpUrl"]]  # where it serves Pulsar's protocol
    return str(body["httpUrl"])


def _read_all(client: Client, topic: str) -> list[tuple[str, bytes]]:
    reader = client.create_reader(topic, MessageId.earliest, start_message_id_inclusive=True)
    try:
        return [(str(m.message_id()), m.value()) for m in reader]
    finally:
        reader.close()


def test_topics_spread_and_every_instance_takes_produce(cluster: Cluster) -> None:
    a, b = cluster.start(2)
    topics = [f"{NS}/spread-{i}" for i in range(4)]
    with cluster.client(a) as admin:
        for t in topics:
            admin.admin.topics.create(t)
    # Assignment spreads topics over the live instances; both answer the same owner.
    owners = [_owner(a, t) for t in topics]
    assert owners == [_owner(b, t) for t in topics]
    assert sorted(owners) == sorted([a.url, b.url] * 2)

    # A request at the other instance is redirected to the owner, with Pulsar's 307.
    topic = topics[0]
    owner, other = (a, b) if owners[0] == a.url else (b, a)
    path = f"/topics/persistent/{topic}"
    body = {"messages": [{"key": "k", "value": base64.b64encode(b"x").decode()}]}
    r = httpx.post(other.url + path, json=body, headers=HEADERS)
    assert r.status_code == 307, r.text
    assert r.headers["location"] == owner.url + path
    assert "owned by" in r.json()["reason"]
    # ... after authentication, as every request is.
    assert httpx.post(other.url + path, json=body).status_code == 401

    # Producers at every instance: each message acknowledged once, in each producer's order.
    acked: dict[int, list[tuple[str, bytes]]] = {}
    errors: list[BaseException] = []

    def produce(i: int, server: ServerProcess) -> None:
        try:
            with cluster.client(server) as c:
                producer = c.create_producer(topic)
                acked[i] = [
                    (str(producer.send(f"{i}-{n}".encode(), key=str(i))), f"{i}-{n}".encode())
                    for n in range(150)
                ]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(i, s)) for i, s in enumerate([a, b, a, b])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with cluster.client(other) as c:
        log = _read_all(c, topic)
    assert len(log) == 4 * 150  # the raw message above was redirected, never stored
    stored = dict(log)
    for i, messages in acked.items():
        assert [stored[mid] for mid, _ in messages] == [v for _, v in messages]
        assert [mid for mid, _ in log if stored[mid].startswith(f"{i}-".encode())] == [m for m, _ in messages]

    # The CLI at the other instance: the lookup names the owner, a produce follows the redirect.
    cli = ["topics", "--url", other.url, "--auth-token", _token()]
    result = CliRunner().invoke(app, [*cli, "lookup", topic])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == owner.url
    result = CliRunner().invoke(app, [*cli, "produce", topic, "-k", "cli", "-m", "from-the-cli"])
    assert result.exit_code == 0, result.output
    with cluster.client(owner) as c:
        assert _read_all(c, topic)[-1][1] == b"from-the-cli"


def test_a_pulsar_client_at_any_instance_is_sent_to_the_owner(cluster: Cluster) -> None:
    """The binary protocol's lookup answers the owner's broker URL: the official client, given
    the instance that does not own the topic, produces and consumes at the owner."""
    import pulsar

    a, b = cluster.start(2)
    topics = [f"{NS}/wire-{i}" for i in range(4)]
    with cluster.client(a) as admin:
        for t in topics:
            admin.admin.topics.create(t)
    topic = next(t for t in topics if _owner(a, t) == a.url)  # a owns it; the client asks b
    client = pulsar.Client(
        b.pulsar_url,
        authentication=pulsar.AuthenticationToken(_token()),
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        producer = client.create_producer(f"persistent://{topic}", batching_enabled=False)
        consumer = client.subscribe(
            f"persistent://{topic}", "s", initial_position=pulsar.InitialPosition.Earliest
        )
        sent = [producer.send(f"v{i}".encode()) for i in range(3)]
        got = [consumer.receive(10_000) for _ in range(3)]
        assert [m.message_id() for m in got] == sent
    finally:
        client.close()
    # Written at the owner: its REST read has them.
    with cluster.client(a) as c:
        assert [v for _, v in _read_all(c, topic)] == [b"v0", b"v1", b"v2"]


def test_a_listener_named_at_an_instance_that_does_not_own_the_topic_is_the_owners(cluster: Cluster) -> None:
    """Only the owner knows its listeners' URLs: a lookup naming one at another instance is
    sent there (307 over HTTP, Pulsar's Redirect on the wire), and the owner answers its own."""
    import pulsar

    a, b = cluster.start(
        2, listeners=lambda s: f"internal:{s.pulsar_url},external:pulsar://localhost:{s.broker_port}"
    )
    topics = [f"{NS}/listener-{i}" for i in range(4)]
    with cluster.client(a) as admin:
        for t in topics:
            admin.admin.topics.create(t)
    topic = next(t for t in topics if _owner(a, t) == a.url)  # a owns it; the client asks b
    path = f"/lookup/v2/topic/persistent/{topic}?listenerName=external"
    r = httpx.get(b.url + path, headers=HEADERS, timeout=30)
    assert r.status_code == 307, r.text
    assert r.headers["location"] == a.url + path
    # Followed with the token (httpx drops it on a redirect to another origin).
    r = httpx.get(r.headers["location"], headers=HEADERS, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["brokerUrl"] == f"pulsar://localhost:{a.broker_port}"
    client = pulsar.Client(
        b.pulsar_url,
        authentication=pulsar.AuthenticationToken(_token()),
        listener_name="external",
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        producer = client.create_producer(f"persistent://{topic}", batching_enabled=False)
        producer.send(b"through-the-external-listener")
    finally:
        client.close()
    with cluster.client(a) as c:
        assert [v for _, v in _read_all(c, topic)] == [b"through-the-external-listener"]


def test_kill_9_of_the_owner_another_instance_serves_within_two_leases(cluster: Cluster) -> None:
    lease_s = cluster.lease_ms / 1000
    a, b = cluster.start(2)
    topic = f"{NS}/takeover"
    with cluster.client(a) as admin:
        admin.admin.topics.create(topic)
    owner, survivor = (a, b) if _owner(a, topic) == a.url else (b, a)

    acked: list[tuple[str, bytes]] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    received: set[str] = set()
    consuming = threading.Event()
    done_consuming = threading.Event()

    def consume() -> None:
        # Through the survivor too: after the takeover the new owner does not know the consumer
        # (404), and the client attaches again, as a Pulsar client reconnects; what was not
        # acknowledged is delivered again (at least once).
        with cluster.client(survivor) as c:
            consumer = c.subscribe(topic, "while-taken-over", initial_position="earliest")
            consuming.set()
            while not done_consuming.is_set():
                try:
                    msg = consumer.receive(timeout_millis=500)
                except ClientError:
                    continue
                received.add(str(msg.message_id()))
                with contextlib.suppress(ClientError):
                    consumer.acknowledge(msg)

    def produce(i: int) -> None:
        # Through the survivor: redirected to the owner, then back when the owner is gone.
        with cluster.client(survivor) as c:
            producer = c.create_producer(topic)
            n = 0
            while not stop.is_set():
                value = f"{i}-{n}".encode()
                try:
                    acked.append((str(producer.send(value, key=str(i))), value))
                    n += 1
                except ClientError as e:
                    errors.append(e)  # not acknowledged: sent again (at least once)

    reading = threading.Thread(target=consume)
    reading.start()
    assert consuming.wait(60)
    threads = [threading.Thread(target=produce, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    while len(acked) < 100:
        time.sleep(0.05)
    owner.kill()
    killed = time.monotonic()
    # The survivor takes the topic when the owner's lease lapses (at most a lease after the
    # kill) and recovers its files; until then it redirects to the dead owner.
    body = {"messages": [{"key": "probe", "value": base64.b64encode(b"probe").decode()}]}
    while True:
        r = httpx.post(f"{survivor.url}/topics/persistent/{topic}", json=body, headers=HEADERS, timeout=30)
        if r.status_code == 200:
            served_after = time.monotonic() - killed
            break
        assert r.status_code in (307, 503), r.text
        assert time.monotonic() - killed < 60, "the survivor never took the topic over"
        time.sleep(0.05)
    count = len(acked)
    while len(acked) < count + 100:  # the producers go on through the new owner
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    # The bound is two leases; the slack is for a loaded two-core CI machine, where the
    # survivor's renewal thread, PostgreSQL and this test's polling compete for the cores.
    assert served_after < 2 * lease_s + 3.0, f"served {served_after:.2f} s after kill -9"
    assert _owner(survivor, topic) == survivor.url
    with cluster.client(survivor) as c:
        stored = dict(_read_all(c, topic))
    lost = [(mid, v) for mid, v in acked if stored.get(mid) != v]
    assert not lost, f"{len(lost)} acknowledged messages lost or changed, e.g. {lost[:3]}"
    # The consumer went on across the takeover: every acknowledged message reached it.
    deadline = time.monotonic() + 60
    while not {mid for mid, _ in acked} <= received and time.monotonic() < deadline:
        time.sleep(0.1)
    done_consuming.set()
    reading.join()
    missed = {mid for mid, _ in acked} - received
    assert not missed, f"the consumer never received {len(missed)} acknowledged messages"


def test_a_paused_owner_cannot_acknowledge_after_its_lease_moved(cluster: Cluster) -> None:
    a, b = cluster.start(2)
    topic = f"{NS}/paused"
    with cluster.client(a) as admin:
        admin.admin.topics.create(topic)
    owner, other = (a, b) if _owner(a, topic) == a.url else (b, a)
    path = f"/topics/persistent/{topic}"

    def body(text: str) -> dict[str, object]:
        return {"messages": [{"key": "k", "value": base64.b64encode(text.encode()).decode()}]}

    before = httpx.post(owner.url + path, json=body("before"), headers=HEADERS)
    assert before.status_code == 200, before.text
    owner.pause()
    try:
        deadline = time.monotonic() + 60
        while True:  # the other instance takes the topic once the paused owner's lease lapses
            r = httpx.post(other.url + path, json=body("new-owner"), headers=HEADERS, timeout=30)
            if r.status_code == 200:
                break
            assert time.monotonic() < deadline, r.text
            time.sleep(0.1)
        # A request the paused owner has in its socket backlog when it wakes up.
        answers: list[httpx.Response] = []
        late = threading.Thread(
            target=lambda: answers.append(
                httpx.post(owner.url + path, json=body("stale"), headers=HEADERS, timeout=60)
            )
        )
        late.start()
        time.sleep(0.5)
    finally:
        owner.resume()
    late.join()
    assert answers[0].status_code in (307, 503), answers[0].text
    if answers[0].status_code == 503:
        assert "lease" in answers[0].json()["reason"]
    else:
        assert answers[0].headers["location"].startswith(other.url)
    # A client at the old owner is sent to the new one.
    with cluster.client(owner) as c:
        c.create_producer(topic).send(b"after", key="k")
        values = [v for _, v in _read_all(c, topic)]
    assert values == [b"before", b"new-owner", b"after"]


def test_two_instances_racing_to_compact_get_one_204_and_one_409(cluster: Cluster) -> None:
    a, b = cluster.start(2)
    topic = f"{NS}/race"
    with cluster.client(a) as c:
        c.admin.topics.create(topic)
        c.create_producer(topic).send_many([("k", b"1"), ("k", b"2"), ("j", b"3")])
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def trigger(server: ServerProcess) -> None:
        with cluster.client(server) as c:
            barrier.wait()
            try:
                c.admin.topics.compact(topic)
                outcomes.append("204")
            except Conflict:
                outcomes.append("409")

    threads = [threading.Thread(target=trigger, args=(s,)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["204", "409"]
    # The round ran on the owner; either instance reports it.
    with cluster.client(b) as c:
        assert c.admin.topics.wait_for_compaction(topic, timeout=300).status == "SUCCESS"
    with cluster.client(a) as c:
        assert c.admin.topics.compaction_status(topic).status == "SUCCESS"


def test_a_dead_letter_topic_owned_by_another_instance_does_not_break_receiving(cluster: Cluster) -> None:
    a, b = cluster.start(2)
    topic, dlq = f"{NS}/dlq-source", f"{NS}/dlq-source-work-DLQ"
    with cluster.client(a) as c:
        c.admin.topics.create(topic)
        c.admin.topics.create(dlq)  # new topics go to the instance with fewer: the other one
    assert _owner(a, topic) != _owner(a, dlq)
    with cluster.client(a, b) as c:
        c.create_producer(topic).send(b"poison", key="k")
        consumer = c.subscribe(
            topic,
            "work",
            initial_position="earliest",
            subscription_type="Shared",
            negative_ack_redelivery_delay_ms=50,
            dead_letter_policy=DeadLetterPolicy(max_redeliver_count=1),
        )
        # Delivered, redelivered once, then due for the dead letter topic, which this instance
        # cannot write: the receive still answers (no redirect to the other instance, no error)
        # and the message waits to be delivered again; nothing is lost.
        for _ in range(4):
            msg = consumer.receive(timeout_millis=10_000)
            assert msg.value() == b"poison"
            consumer.negative_acknowledge(msg)
        consumer.close()


def test_a_partitioned_topic_spread_over_two_instances_is_produced_compacted_and_described_by_either(
    cluster: Cluster,
) -> None:
    a, b = cluster.start(2)
    admin = f"/admin/v2/persistent/{NS}/orders"
    assert httpx.put(f"{a.url}{admin}/partitions", json=4, headers=HEADERS, timeout=30).status_code == 204
    owners = [_owner(b, f"{NS}/orders-partition-{i}") for i in range(4)]
    assert set(owners) == {a.url, b.url}  # the partitions are spread over both
    # REST produce through one instance: each partition's messages are stored by its owner.
    latest: dict[str, bytes] = {}
    messages = []
    for i in range(60):
        key, value = f"k{i % 13}", f"v{i}".encode()
        messages.append({"key": key, "value": base64.b64encode(value).decode()})
        latest[key] = value
    messages.append({"key": "k3", "value": None})  # a tombstone
    del latest["k3"]
    body = {"messages": messages}
    r = httpx.post(f"{a.url}/topics/persistent/{NS}/orders", json=body, headers=HEADERS, timeout=30)
    assert r.status_code == 200, r.text
    assert set(r.json()["partitions"]) == {0, 1, 2, 3}
    stats = httpx.get(f"{b.url}{admin}/partitioned-stats", headers=HEADERS, timeout=30).json()
    assert all("error" not in p for p in stats["partitions"].values())
    assert stats["msgInCounter"] == 61  # every partition's, summed, whoever owns it
    # Compacting through either instance compacts every partition, on its owner.
    assert httpx.put(f"{b.url}{admin}/compaction", headers=HEADERS, timeout=30).status_code == 204
    deadline = time.monotonic() + 300
    while (status := httpx.get(f"{a.url}{admin}/compaction", headers=HEADERS, timeout=30).json())[
        "status"
    ] in ("RUNNING", "NOT_RUN"):
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert status["status"] == "SUCCESS", status
    assert set(status["partitions"].values()) == {"SUCCESS"}
    with cluster.client(a) as c:
        consumer = c.subscribe(f"{NS}/orders", "compacted", read_compacted=True, initial_position="earliest")
        got: dict[str | None, bytes | None] = {}
        while True:
            try:
                m = consumer.receive(2_000)
            except ClientError:
                break
            got[m.key()] = m.value()
        consumer.close()
    assert got == latest


def test_a_second_instance_on_one_sqlite_store_is_refused(tmp_path: Path) -> None:
    first = Server(tmp_path / "data", env={"COMPACTOR_DATABASE_URL": ""})
    first.start()
    try:
        second = Server(tmp_path / "data", env={"COMPACTOR_DATABASE_URL": ""})
        with pytest.raises(RuntimeError, match="exited with 2") as e:
            second.start(timeout=60)
        assert "another instance is running on the SQLite metadata store" in str(e.value)
        assert "PostgreSQL" in str(e.value)
    finally:
        first.kill()
