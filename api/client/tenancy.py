"""Tenants and namespaces, as ``pulsar-admin tenants`` and ``namespaces`` (``client.admin.tenants``,
``client.admin.namespaces``): each verb once, run by the sync and the async admin."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from typing import Generic

from api.client._core import _C, _AsyncRunner, _Call, _namespace, _Op, _q, _SyncRunner


def _actions(actions: Iterable[str]) -> list[str]:
    if isinstance(actions, str):
        raise TypeError('actions are a list, such as ["produce", "consume"]')
    return list(actions)


def _op_threshold(path: str, method: str, value: int | None) -> _Op[int | None]:
    """GET (a bare JSON number, or null when not set at this level), POST, DELETE."""
    if method == "POST" and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError("a compaction threshold is an int number of bytes")
    body = yield _Call(method, path, body=value)
    return None if body is None else int(body)


class _NamespacesBase(Generic[_C]):
    def __init__(self, client: _C) -> None:
        self._client = client

    def _op_threshold(self, namespace: str, method: str, value: int | None = None) -> _Op[int | None]:
        path = f"/admin/v2/namespaces/{_namespace(namespace)}/compactionThreshold"
        return (yield from _op_threshold(path, method, value))

    def _op_create(self, namespace: str) -> _Op[None]:
        yield _Call("PUT", f"/admin/v2/namespaces/{_namespace(namespace)}")

    def _op_delete(self, namespace: str) -> _Op[None]:
        yield _Call("DELETE", f"/admin/v2/namespaces/{_namespace(namespace)}")

    def _op_list(self, tenant: str) -> _Op[list[str]]:
        return [str(n) for n in (yield _Call("GET", f"/admin/v2/namespaces/{_q(tenant)}"))]

    def _op_permissions(self, namespace: str) -> _Op[dict[str, list[str]]]:
        return dict((yield _Call("GET", f"/admin/v2/namespaces/{_namespace(namespace)}/permissions")))

    def _op_grant(self, namespace: str, role: str, actions: Iterable[str]) -> _Op[None]:
        path = f"/admin/v2/namespaces/{_namespace(namespace)}/permissions/{_q(role)}"
        yield _Call("POST", path, body=_actions(actions))

    def _op_revoke(self, namespace: str, role: str) -> _Op[None]:
        yield _Call("DELETE", f"/admin/v2/namespaces/{_namespace(namespace)}/permissions/{_q(role)}")


class _TenantsBase(Generic[_C]):
    def __init__(self, client: _C) -> None:
        self._client = client

    def _op_list(self) -> _Op[list[str]]:
        return [str(t) for t in (yield _Call("GET", "/admin/v2/tenants"))]

    def _op_get(self, tenant: str) -> _Op[dict[str, list[str]]]:
        return dict((yield _Call("GET", f"/admin/v2/tenants/{_q(tenant)}")))

    def _op_put(
        self, method: str, tenant: str, admin_roles: Iterable[str], allowed_clusters: Iterable[str]
    ) -> _Op[None]:
        body = {"adminRoles": list(admin_roles), "allowedClusters": list(allowed_clusters)}
        yield _Call(method, f"/admin/v2/tenants/{_q(tenant)}", body=body)

    def _op_delete(self, tenant: str) -> _Op[None]:
        yield _Call("DELETE", f"/admin/v2/tenants/{_q(tenant)}")


# --------------------------------------------------------------------------------- sync


class NamespacesAdmin(_NamespacesBase[_SyncRunner]):
    """``client.admin.namespaces``: policies of a ``"tenant/namespace"``."""

    def get_compaction_threshold(self, namespace: str) -> int | None:
        """The namespace's threshold in bytes; ``None`` when it takes the service's."""
        return self._client._run(self._op_threshold(namespace, "GET"))

    def set_compaction_threshold(self, namespace: str, threshold: int) -> None:
        self._client._run(self._op_threshold(namespace, "POST", threshold))

    def remove_compaction_threshold(self, namespace: str) -> None:
        self._client._run(self._op_threshold(namespace, "DELETE"))

    def create(self, namespace: str) -> None:
        """Create ``"tenant/namespace"``; ``NotFound`` without the tenant, ``Conflict`` if it exists."""
        self._client._run(self._op_create(namespace))

    def delete(self, namespace: str) -> None:
        """``Conflict`` while it has topics."""
        self._client._run(self._op_delete(namespace))

    def list(self, tenant: str) -> builtins.list[str]:
        """The tenant's namespaces as ``"tenant/namespace"``."""
        return self._client._run(self._op_list(tenant))

    def permissions(self, namespace: str) -> dict[str, builtins.list[str]]:
        """role -> actions granted on the namespace."""
        return self._client._run(self._op_permissions(namespace))

    def grant_permission(self, namespace: str, role: str, actions: Iterable[str]) -> None:
        """Set the role's actions (``"produce"``, ``"consume"``) on every topic of the namespace."""
        self._client._run(self._op_grant(namespace, role, actions))

    def revoke_permission(self, namespace: str, role: str) -> None:
        self._client._run(self._op_revoke(namespace, role))


class TenantsAdmin(_TenantsBase[_SyncRunner]):
    """``client.admin.tenants``: pulsar-admin's tenant verbs (a superuser's)."""

    def list(self) -> builtins.list[str]:
        return self._client._run(self._op_list())

    def get(self, tenant: str) -> dict[str, builtins.list[str]]:
        """``{"adminRoles": [...], "allowedClusters": [...]}``."""
        return self._client._run(self._op_get(tenant))

    def create(
        self, tenant: str, admin_roles: Iterable[str] = (), allowed_clusters: Iterable[str] = ()
    ) -> None:
        self._client._run(self._op_put("PUT", tenant, admin_roles, allowed_clusters))

    def update(
        self, tenant: str, admin_roles: Iterable[str] = (), allowed_clusters: Iterable[str] = ()
    ) -> None:
        self._client._run(self._op_put("POST", tenant, admin_roles, allowed_clusters))

    def delete(self, tenant: str) -> None:
        """``Conflict`` while it has namespaces."""
        self._client._run(self._op_delete(tenant))


# -------------------------------------------------------------------------------- async


class AsyncNamespacesAdmin(_NamespacesBase[_AsyncRunner]):
    """See ``NamespacesAdmin``."""

    async def get_compaction_threshold(self, namespace: str) -> int | None:
        return await self._client._run(self._op_threshold(namespace, "GET"))

    async def set_compaction_threshold(self, namespace: str, threshold: int) -> None:
        await self._client._run(self._op_threshold(namespace, "POST", threshold))

    async def remove_compaction_threshold(self, namespace: str) -> None:
        await self._client._run(self._op_threshold(namespace, "DELETE"))

    async def create(self, namespace: str) -> None:
        await self._client._run(self._op_create(namespace))

    async def delete(self, namespace: str) -> None:
        await self._client._run(self._op_delete(namespace))

    async def list(self, tenant: str) -> builtins.list[str]:
        return await self._client._run(self._op_list(tenant))

    async def permissions(self, namespace: str) -> dict[str, builtins.list[str]]:
        return await self._client._run(self._op_permissions(namespace))

    async def grant_permission(self, namespace: str, role: str, actions: Iterable[str]) -> None:
        await self._client._run(self._op_grant(namespace, role, actions))

    async def revoke_permission(self, namespace: str, role: str) -> None:
        await self._client._run(self._op_revoke(namespace, role))


class AsyncTenantsAdmin(_TenantsBase[_AsyncRunner]):
    """See ``TenantsAdmin``."""

    async def list(self) -> builtins.list[str]:
        return await self._client._run(self._op_list())

    async def get(self, tenant: str) -> dict[str, builtins.list[str]]:
        return await self._client._run(self._op_get(tenant))

    async def create(
        self, tenant: str, admin_roles: Iterable[str] = (), allowed_clusters: Iterable[str] = ()
    ) -> None:
        await self._client._run(self._op_put("PUT", tenant, admin_roles, allowed_clusters))

    async def update(
        self, tenant: str, admin_roles: Iterable[str] = (), allowed_clusters: Iterable[str] = ()
    ) -> None:
        await self._client._run(self._op_put("POST", tenant, admin_roles, allowed_clusters))

    async def delete(self, tenant: str) -> None:
        await self._client._run(self._op_delete(tenant))
