"""Consume throughput of 4 Shared consumers against 1 Exclusive consumer, on a real server.

One topic of ``messages`` keyed messages (``value_bytes`` random bytes each) is produced once.
Then, ``runs`` times, back to back so that other load on the machine falls on both alike:

- Exclusive: one consumer subscribes from the earliest message, receives pages of ``page``
  (``batch_receive``) and acknowledges each page cumulatively, until it has every message,
  then closes (sending its last grouped acknowledgement);
- Shared: ``consumers`` threads, each with its own ``Client``, attach to one Shared subscription
  made at the earliest message, receive pages of ``page`` and acknowledge them individually
  (``acknowledge_many``: Shared has no cumulative acks), until together they have every message;
  then each closes.

Reported: messages/s of each (median), from subscribing to the last consumer closed; each run
checks that every message came exactly once (no consumer crashed, so none comes twice) and
that the subscription's backlog is empty. Clients and server share the machine's cores (and
the client threads share one Python interpreter).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tests.benchmarks.measure import median
from tests.benchmarks.report import Table, f_int, f_x
from tests.benchmarks.serving import ServerProcess, _messages

if TYPE_CHECKING:  # imported when used, as the serving section does
    from api.client import Client

TENANT, NAMESPACE = "bench", "shared"


@dataclass(frozen=True)
class SharedParams:
    messages: int = 200_000
    keys: int = 10_000
    value_bytes: int = 100
    consumers: int = 4
    page: int = 1000
    runs: int = 3

    @classmethod
    def quick(cls, runs: int = 2) -> SharedParams:
        return cls(messages=50_000, runs=runs)


@dataclass
class SharedResult:
    params: SharedParams
    exclusive: list[float] = field(default_factory=list)  # messages/s
    shared: list[float] = field(default_factory=list)  # messages/s
    spread: list[list[int]] = field(default_factory=list)  # messages per Shared consumer, per run


class SharedBench:
    def __init__(self, work_dir: Path, params: SharedParams, log: Callable[[str], None] = print) -> None:
        self.params = params
        self.log = log
        self.server = ServerProcess(Path(work_dir) / "shared" / "data")
        self.topic = f"{TENANT}/{NAMESPACE}/work"

    def run(self) -> SharedResult:
        from api.client import Client, Conflict

        result = SharedResult(self.params)
        self.server.start()
        try:
            with Client(self.server.url, timeout=120.0) as client:
                with contextlib.suppress(Conflict):
                    client.admin.tenants.create(TENANT, admin_roles=[])
                with contextlib.suppress(Conflict):
                    client.admin.namespaces.create(f"{TENANT}/{NAMESPACE}")
                client.admin.topics.create(self.topic)
                p = self.params
                rng = np.random.default_rng(19)
                batch = _messages(rng, p.messages, p.keys, p.value_bytes)
                client.create_producer(self.topic).send_many(batch)
                for i in range(p.runs):
                    result.exclusive.append(self._exclusive(client, f"exclusive-{i}"))
                    rate, spread = self._shared(client, f"shared-{i}")
                    result.shared.append(rate)
                    result.spread.append(spread)
                    self.log(
                        f"shared run {i + 1}: 1 Exclusive {result.exclusive[-1]:,.0f}/s, "
                        f"{p.consumers} Shared {rate:,.0f}/s (per consumer {spread})"
                    )
        finally:
            self.server.stop()
        return result

    def _check(self, client: Client, sub: str) -> None:
        backlog = client.admin.topics.stats(self.topic)["subscriptions"][sub]["msgBacklog"]
        if backlog:
            raise AssertionError(f"{sub}: {backlog} messages left unacknowledged")
        client.admin.topics.delete_subscription(self.topic, sub)

    def _exclusive(self, client: Client, sub: str) -> float:
        p = self.params
        got = 0
        t0 = time.perf_counter()
        consumer = client.subscribe(self.topic, sub, initial_position="earliest")
        while got < p.messages:
            msgs = consumer.batch_receive(max_messages=p.page, timeout_millis=10_000)
            if not msgs:
                raise RuntimeError(f"{sub}: stalled after {got} of {p.messages}")
            got += len(msgs)
            consumer.acknowledge_cumulative(msgs[-1])
        consumer.close()
        seconds = time.perf_counter() - t0
        if got != p.messages:
            raise AssertionError(f"{sub}: {got} messages, expected {p.messages}")
        self._check(client, sub)
        return p.messages / seconds

    def _shared(self, client: Client, sub: str) -> tuple[float, list[int]]:
        from api.client import Client, ConsumerType  # noqa: F811

        p = self.params
        client.admin.topics.create_subscription(self.topic, sub, initial_position="earliest")
        clients = [Client(self.server.url, timeout=120.0) for _ in range(p.consumers)]
        seen: list[set[tuple[int, int]]] = [set() for _ in range(p.consumers)]
        lock = threading.Lock()
        total = [0]
        done = threading.Event()
        errors: list[BaseException] = []
        start = threading.Barrier(p.consumers + 1)

        def work(i: int) -> None:
            try:
                start.wait()
                consumer = clients[i].subscribe(
                    self.topic, sub, subscription_type=ConsumerType.Shared, consumer_name=f"c{i}"
                )
                while not done.is_set():
                    msgs = consumer.batch_receive(max_messages=p.page, timeout_millis=200)
                    if not msgs:
                        continue
                    seen[i].update((m.message_id().ledger_id, m.message_id().entry_id) for m in msgs)
                    consumer.acknowledge_many(msgs)
                    with lock:
                        total[0] += len(msgs)
                        if total[0] >= p.messages:
                            done.set()
                consumer.close()
            except BaseException as e:  # reported below
                errors.append(e)
                done.set()

        pool = [threading.Thread(target=work, args=(i,)) for i in range(p.consumers)]
        for t in pool:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        seconds = time.perf_counter() - t0
        for c in clients:
            c.close()
        if errors:
            raise errors[0]
        union = set().union(*seen)
        if len(union) != p.messages or total[0] != p.messages:
            raise AssertionError(
                f"{sub}: {total[0]} deliveries of {len(union)} messages, expected {p.messages}"
            )
        self._check(client, sub)
        return p.messages / seconds, [len(s) for s in seen]


def shared_table(r: SharedResult) -> Table:
    p = r.params
    t = Table(
        f"Consume: {p.consumers} Shared consumers against 1 Exclusive ({p.messages:,} messages of "
        f"{p.value_bytes} B, pages of {p.page}, median of {len(r.exclusive)} runs, back to back)",
        ["subscription", "consumers", "acknowledgements", "messages/s", "vs Exclusive", "runs (messages/s)"],
    )
    ex = median(r.exclusive)
    t.rows.append(
        ["Exclusive", "1", "cumulative, per page", f_int(ex), "1.00x", ", ".join(map(f_int, r.exclusive))]
    )
    t.rows.append(
        [
            "Shared",
            str(p.consumers),
            "individual, grouped per 100 ms",
            f_int(median(r.shared)),
            f_x(median(r.shared) / ex),
            ", ".join(f_int(x) for x in r.shared),
        ]
    )
    return t
