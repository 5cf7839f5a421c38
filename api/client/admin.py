"""Administration, as ``pulsar-admin``: ``Admin`` and ``AsyncAdmin`` (``tenants``, ``namespaces`` and
``topics``), and the topic verbs (compaction and its status, thresholds, subscriptions,
permissions); each verb once, run by the sync and the async admin. Tenants and namespaces are in
``tenancy``."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeAlias

from api.client._core import (
    _C,
    _AsyncRunner,
    _Call,
    _namespace,
    _Op,
    _position,
    _q,
    _seek_body,
    _Sleep,
    _SyncRunner,
    _Topic,
)
from api.client.errors import Timeout
from api.client.message import MessageIdLike
from api.client.tenancy import (
    AsyncNamespacesAdmin,
    AsyncTenantsAdmin,
    NamespacesAdmin,
    TenantsAdmin,
    _actions,
    _op_threshold,
)


@dataclass(frozen=True, slots=True)
class CompactionProgress:
    """How far a running compaction is: its ``phase`` (``phase-one``, ``phase-two``,
    ``commit``), the phase's share of the input read, and the round's ``percent``."""

    phase: str
    entries_read: int
    entries_total: int
    bytes_read: int
    bytes_total: int
    percent: float
    started_at: int  # epoch ms
    elapsed_ms: int

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> CompactionProgress:
        return cls(
            phase=body["phase"],
            entries_read=body["entriesRead"],
            entries_total=body["entriesTotal"],
            bytes_read=body["bytesRead"],
            bytes_total=body["bytesTotal"],
            percent=body["percent"],
            started_at=body["startedAt"],
            elapsed_ms=body["elapsedMs"],
        )


@dataclass(frozen=True, slots=True)
class TableStatus:
    """A topic's Iceberg table (docs/tables.md): whether its policy asks for one, the snapshot
    its last committed round made, the rounds compacted since then (its lag), the last failed
    commit's error."""

    enabled: bool
    snapshot_id: int | None = None
    lag_rounds: int = 0
    last_error: str | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> TableStatus:
        return cls(
            enabled=body["enabled"],
            snapshot_id=body.get("snapshotId"),
            lag_rounds=body.get("lagRounds", 0),
            last_error=body.get("lastError"),
        )


@dataclass(frozen=True, slots=True)
class CompactionStatus:
    """A topic's compaction status: ``NOT_RUN``, ``RUNNING``, ``SUCCESS`` or ``ERROR``; while
    it is ``RUNNING``, its ``progress``; ``table``, for a topic with an Iceberg table (or whose
    policy asks for one)."""

    status: str
    last_error: str | None = None
    progress: CompactionProgress | None = None
    table: TableStatus | None = None

    NOT_RUN: ClassVar[str] = "NOT_RUN"
    RUNNING: ClassVar[str] = "RUNNING"
    SUCCESS: ClassVar[str] = "SUCCESS"
    ERROR: ClassVar[str] = "ERROR"

    @property
    def running(self) -> bool:
        return self.status == self.RUNNING


#: ``on_progress(status, elapsed_seconds)`` of ``wait_for_compaction``, called after every poll.
ProgressCallback: TypeAlias = Callable[[CompactionStatus, float], None]


# --------------------------------------------------- the operations, once for both sides


class _TopicsBase(Generic[_C]):
    """Every topic admin verb, once: the request and the parsing of its answer."""

    def __init__(self, client: _C) -> None:
        self._client = client

    def _op_create(self, topic: str) -> _Op[None]:
        yield _Call("PUT", _Topic.parse(topic).admin)

    def _op_delete(self, topic: str) -> _Op[None]:
        yield _Call("DELETE", _Topic.parse(topic).admin)

    def _op_list(self, namespace: str) -> _Op[list[str]]:
        body = yield _Call("GET", f"/admin/v2/persistent/{_namespace(namespace)}")
        return [str(t) for t in body]

    def _op_get(self, topic: str, what: str) -> _Op[dict[str, Any]]:
        return dict((yield _Call("GET", f"{_Topic.parse(topic).admin}/{what}")))

    def _op_lookup(self, topic: str) -> _Op[str]:
        t = _Topic.parse(topic)
        body = yield _Call("GET", f"/lookup/v2/topic/persistent/{t._parts}")
        url = str(body["httpUrl"]).rstrip("/")
        self._client._owners[t._parts] = url
        return url

    def _op_compact(self, topic: str) -> _Op[None]:
        yield _Call("PUT", f"{_Topic.parse(topic).admin}/compaction")

    def _op_compaction_status(self, topic: str) -> _Op[CompactionStatus]:
        body = yield _Call("GET", f"{_Topic.parse(topic).admin}/compaction")
        progress, table = body.get("progress"), body.get("table")
        return CompactionStatus(
            status=body["status"],
            last_error=body.get("lastError"),
            progress=CompactionProgress.from_json(progress) if progress else None,
            table=TableStatus.from_json(table) if table else None,
        )

    def _op_wait_for_compaction(
        self, topic: str, timeout: float | None, poll_interval: float, on_progress: ProgressCallback | None
    ) -> _Op[CompactionStatus]:
        started = time.monotonic()
        while True:
            status = yield from self._op_compaction_status(topic)
            elapsed = time.monotonic() - started
            if on_progress is not None:
                on_progress(status, elapsed)
            if not status.running:
                return status
            if timeout is not None and elapsed >= timeout:
                raise Timeout(f"the compaction of {topic} is still running after {timeout:g} s")
            pause = poll_interval if timeout is None else max(0.0, min(poll_interval, timeout - elapsed))
            yield _Sleep(pause)

    def _op_scrub(self, topic: str) -> _Op[dict[str, Any]]:
        return dict((yield _Call("POST", f"{_Topic.parse(topic).admin}/scrub")))

    def _op_scrub_runs(self, topic: str, limit: int) -> _Op[list[dict[str, Any]]]:
        body = yield _Call("GET", f"{_Topic.parse(topic).admin}/scrubRuns", {"limit": limit})
        return [dict(r) for r in body]

    def _op_skip_damaged(self, topic: str, ledger_id: int) -> _Op[dict[str, Any]]:
        return dict(
            (yield _Call("POST", f"{_Topic.parse(topic).admin}/ledgers/{int(ledger_id)}/skip-damaged"))
        )

    def _op_subscriptions(self, topic: str) -> _Op[list[str]]:
        return [str(s) for s in (yield _Call("GET", f"{_Topic.parse(topic).admin}/subscriptions"))]

    def _op_create_subscription(
        self, topic: str, subscription: str, initial_position: MessageIdLike
    ) -> _Op[None]:
        params: dict[str, str | int | bool] = {"initialPosition": _position(initial_position)}
        yield _Call("PUT", _Topic.parse(topic).subscription(subscription), params)

    def _op_delete_subscription(self, topic: str, subscription: str) -> _Op[None]:
        yield _Call("DELETE", _Topic.parse(topic).subscription(subscription))

    def _op_reset_cursor(self, topic: str, subscription: str, target: MessageIdLike | int) -> _Op[None]:
        path = f"{_Topic.parse(topic).subscription(subscription)}/resetcursor"
        body = _seek_body(target)
        if "publishTime" in body:
            yield _Call("POST", f"{path}/{body['publishTime']}")
        else:
            yield _Call("POST", path, body=body)

    def _op_threshold(self, topic: str, method: str, value: int | None = None) -> _Op[int | None]:
        return (yield from _op_threshold(f"{_Topic.parse(topic).admin}/compactionThreshold", method, value))

    def _op_permissions(self, topic: str) -> _Op[dict[str, list[str]]]:
        return dict((yield _Call("GET", f"{_Topic.parse(topic).admin}/permissions")))

    def _op_grant(self, topic: str, role: str, actions: Iterable[str]) -> _Op[None]:
        yield _Call("POST", f"{_Topic.parse(topic).admin}/permissions/{_q(role)}", body=_actions(actions))

    def _op_revoke(self, topic: str, role: str) -> _Op[None]:
        yield _Call("DELETE", f"{_Topic.parse(topic).admin}/permissions/{_q(role)}")


# --------------------------------------------------------------------------------- sync


class TopicsAdmin(_TopicsBase[_SyncRunner]):
    """``client.admin.topics``: pulsar-admin's topic verbs."""

    def create(self, topic: str) -> None:
        """Create a topic; ``Conflict`` if it exists."""
        self._client._run(self._op_create(topic))

    def delete(self, topic: str) -> None:
        """Delete a topic and all its data; ``Conflict`` while it is being compacted."""
        self._client._run(self._op_delete(topic))

    def list(self, namespace: str) -> list[str]:
        """The full names of the topics in ``"tenant/namespace"``."""
        return self._client._run(self._op_list(namespace))

    def lookup(self, topic: str) -> str:
        """The URL of the instance that serves the topic (Pulsar's lookup); later requests
        for the topic go there."""
        return self._client._run(self._op_lookup(topic))

    def stats(self, topic: str) -> dict[str, Any]:
        """Counters and, per subscription, backlog and consumers: the server's JSON."""
        return self._client._run(self._op_get(topic, "stats"))

    def internal_stats(self, topic: str) -> dict[str, Any]:
        """Ledgers, cursors, the compacted ledger and the horizon: the server's JSON."""
        return self._client._run(self._op_get(topic, "internalStats"))

    def compact(self, topic: str) -> None:
        """Start a compaction in the background; ``Conflict`` if one is running."""
        self._client._run(self._op_compact(topic))

    def compaction_status(self, topic: str) -> CompactionStatus:
        """The status of the topic's last compaction."""
        return self._client._run(self._op_compaction_status(topic))

    def scrub(self, topic: str) -> dict[str, Any]:
        """Verify every file of the topic against its recorded checksum now; the report
        (``status`` CLEAN, DAMAGED or ERROR, ``findings`` one line per damaged file)."""
        return self._client._run(self._op_scrub(topic))

    def scrub_runs(self, topic: str, limit: int = 100) -> builtins.list[dict[str, Any]]:
        """The topic's scrubs, newest first."""
        return self._client._run(self._op_scrub_runs(topic, limit))

    def skip_damaged(self, topic: str, ledger_id: int) -> dict[str, Any]:
        """Accept losing a damaged ledger's unreadable entries, so that reads and compaction go
        on without them; ``Conflict`` unless the ledger is known damaged."""
        return self._client._run(self._op_skip_damaged(topic, ledger_id))

    def wait_for_compaction(
        self,
        topic: str,
        *,
        timeout: float | None = 300.0,
        poll_interval: float = 0.25,
        on_progress: ProgressCallback | None = None,
    ) -> CompactionStatus:
        """Poll the status until it is not RUNNING and return it (look at ``status`` for
        ``ERROR``); ``Timeout`` after ``timeout`` seconds. ``on_progress(status, elapsed)`` is
        called after every poll."""
        return self._client._run(self._op_wait_for_compaction(topic, timeout, poll_interval, on_progress))

    def get_compaction_threshold(self, topic: str) -> int | None:
        """The topic's own threshold in bytes; ``None`` when it takes its namespace's."""
        return self._client._run(self._op_threshold(topic, "GET"))

    def set_compaction_threshold(self, topic: str, threshold: int) -> None:
        """Compact automatically once the compaction cursor's backlog passes ``threshold``
        bytes (0: never)."""
        self._client._run(self._op_threshold(topic, "POST", threshold))

    def remove_compaction_threshold(self, topic: str) -> None:
        """Fall back to the namespace's threshold (then the service's)."""
        self._client._run(self._op_threshold(topic, "DELETE"))

    def subscriptions(self, topic: str) -> builtins.list[str]:  # (``list`` is a method here)
        """The names of the topic's subscriptions."""
        return self._client._run(self._op_subscriptions(topic))

    def create_subscription(
        self,
        topic: str,
        subscription: str,
        *,
        initial_position: MessageIdLike = "latest",
    ) -> None:
        """Create a durable subscription at ``earliest`` or ``latest``; ``Conflict`` if it exists.
        As in Pulsar it has no ``read_compacted``: each consumer chooses when it subscribes."""
        self._client._run(self._op_create_subscription(topic, subscription, initial_position))

    def delete_subscription(self, topic: str, subscription: str) -> None:
        self._client._run(self._op_delete_subscription(topic, subscription))

    def reset_cursor(self, topic: str, subscription: str, target: MessageIdLike | int) -> None:
        """Move a subscription to a message id or (an ``int``) to a publish time in ms."""
        self._client._run(self._op_reset_cursor(topic, subscription, target))

    def permissions(self, topic: str) -> dict[str, builtins.list[str]]:
        """role -> actions granted on the topic, its own and its namespace's."""
        return self._client._run(self._op_permissions(topic))

    def grant_permission(self, topic: str, role: str, actions: Iterable[str]) -> None:
        """Set the role's actions (``"produce"``, ``"consume"``) on the topic."""
        self._client._run(self._op_grant(topic, role, actions))

    def revoke_permission(self, topic: str, role: str) -> None:
        self._client._run(self._op_revoke(topic, role))


class Admin:
    """``client.admin``: ``tenants``, ``namespaces`` and ``topics``, as ``pulsar-admin``."""

    def __init__(self, client: _SyncRunner) -> None:
        self.tenants = TenantsAdmin(client)
        self.topics = TopicsAdmin(client)
        self.namespaces = NamespacesAdmin(client)


# -------------------------------------------------------------------------------- async


class AsyncTopicsAdmin(_TopicsBase[_AsyncRunner]):
    """See ``TopicsAdmin``."""

    async def create(self, topic: str) -> None:
        await self._client._run(self._op_create(topic))

    async def delete(self, topic: str) -> None:
        await self._client._run(self._op_delete(topic))

    async def list(self, namespace: str) -> list[str]:
        return await self._client._run(self._op_list(namespace))

    async def lookup(self, topic: str) -> str:
        return await self._client._run(self._op_lookup(topic))

    async def stats(self, topic: str) -> dict[str, Any]:
        return await self._client._run(self._op_get(topic, "stats"))

    async def internal_stats(self, topic: str) -> dict[str, Any]:
        return await self._client._run(self._op_get(topic, "internalStats"))

    async def compact(self, topic: str) -> None:
        await self._client._run(self._op_compact(topic))

    async def compaction_status(self, topic: str) -> CompactionStatus:
        return await self._client._run(self._op_compaction_status(topic))

    async def scrub(self, topic: str) -> dict[str, Any]:
        return await self._client._run(self._op_scrub(topic))

    async def scrub_runs(self, topic: str, limit: int = 100) -> builtins.list[dict[str, Any]]:
        return await self._client._run(self._op_scrub_runs(topic, limit))

    async def skip_damaged(self, topic: str, ledger_id: int) -> dict[str, Any]:
        return await self._client._run(self._op_skip_damaged(topic, ledger_id))

    async def wait_for_compaction(
        self,
        topic: str,
        *,
        timeout: float | None = 300.0,
        poll_interval: float = 0.25,
        on_progress: ProgressCallback | None = None,
    ) -> CompactionStatus:
        return await self._client._run(
            self._op_wait_for_compaction(topic, timeout, poll_interval, on_progress)
        )

    async def get_compaction_threshold(self, topic: str) -> int | None:
        return await self._client._run(self._op_threshold(topic, "GET"))

    async def set_compaction_threshold(self, topic: str, threshold: int) -> None:
        await self._client._run(self._op_threshold(topic, "POST", threshold))

    async def remove_compaction_threshold(self, topic: str) -> None:
        await self._client._run(self._op_threshold(topic, "DELETE"))

    async def subscriptions(self, topic: str) -> builtins.list[str]:
        return await self._client._run(self._op_subscriptions(topic))

    async def create_subscription(
        self,
        topic: str,
        subscription: str,
        *,
        initial_position: MessageIdLike = "latest",
    ) -> None:
        await self._client._run(self._op_create_subscription(topic, subscription, initial_position))

    async def delete_subscription(self, topic: str, subscription: str) -> None:
        await self._client._run(self._op_delete_subscription(topic, subscription))

    async def reset_cursor(self, topic: str, subscription: str, target: MessageIdLike | int) -> None:
        await self._client._run(self._op_reset_cursor(topic, subscription, target))

    async def permissions(self, topic: str) -> dict[str, builtins.list[str]]:
        return await self._client._run(self._op_permissions(topic))

    async def grant_permission(self, topic: str, role: str, actions: Iterable[str]) -> None:
        await self._client._run(self._op_grant(topic, role, actions))

    async def revoke_permission(self, topic: str, role: str) -> None:
        await self._client._run(self._op_revoke(topic, role))


class AsyncAdmin:
    """``AsyncClient.admin``: ``tenants``, ``namespaces`` and ``topics`` with ``async def``."""

    def __init__(self, client: _AsyncRunner) -> None:
        self.tenants = AsyncTenantsAdmin(client)
        self.topics = AsyncTopicsAdmin(client)
        self.namespaces = AsyncNamespacesAdmin(client)
