"""Tenants at Pulsar's paths: ``/admin/v2/tenants[/{tenant}]`` with ``TenantInfo`` bodies."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api.deps import Superuser, TenantAdmin, TenantsDep
from api.schemas import TenantInfoBody
from service.tenants import TenantInfo

router = APIRouter(prefix="/admin/v2/tenants", tags=["tenants"])


@router.get("", response_model=list[str], dependencies=[Superuser])
def list_tenants(tenants: TenantsDep) -> list[str]:
    return tenants.tenants()


@router.get("/{tenant}", response_model=TenantInfoBody, dependencies=[TenantAdmin])
def get_tenant(tenant: str, tenants: TenantsDep) -> TenantInfoBody:
    info = tenants.tenant(tenant=tenant)
    return TenantInfoBody(adminRoles=info.admin_roles, allowedClusters=info.allowed_clusters)


@router.put("/{tenant}", status_code=204, response_class=Response, dependencies=[Superuser])
def create_tenant(tenant: str, tenants: TenantsDep, body: TenantInfoBody | None = None) -> Response:
    """Create a tenant (409 if it exists)."""
    body = body or TenantInfoBody()
    tenants.create_tenant(tenant=tenant, info=TenantInfo(body.adminRoles, body.allowedClusters))
    return Response(status_code=204)


@router.post("/{tenant}", status_code=204, response_class=Response, dependencies=[Superuser])
def update_tenant(tenant: str, tenants: TenantsDep, body: TenantInfoBody) -> Response:
    """Replace a tenant's admin roles and allowed clusters."""
    tenants.update_tenant(tenant=tenant, info=TenantInfo(body.adminRoles, body.allowedClusters))
    return Response(status_code=204)


@router.delete("/{tenant}", status_code=204, response_class=Response, dependencies=[Superuser])
def delete_tenant(tenant: str, tenants: TenantsDep) -> Response:
    """Delete a tenant without namespaces (409 while it has some)."""
    tenants.delete_tenant(tenant=tenant)
    return Response(status_code=204)
