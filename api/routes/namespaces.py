"""Namespaces at Pulsar's paths: ``/admin/v2/namespaces/{tenant}[/{namespace}]``."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api.deps import TenantAdmin, TenantsDep
from api.schemas import NamespaceOut
from service.names import check_part

router = APIRouter(prefix="/admin/v2/namespaces", tags=["namespaces"], dependencies=[TenantAdmin])


@router.get("/{tenant}", response_model=list[str])
def list_namespaces(tenant: str, tenants: TenantsDep) -> list[str]:
    """The tenant's namespaces as ``tenant/namespace``."""
    return tenants.namespaces(tenant=tenant)


@router.put("/{tenant}/{namespace}", status_code=204, response_class=Response)
def create_namespace(tenant: str, namespace: str, tenants: TenantsDep) -> Response:
    """Create a namespace in a tenant that exists (404 otherwise; 409 if it exists)."""
    tenants.create_namespace(tenant=tenant, namespace=namespace)
    return Response(status_code=204)


@router.get("/{tenant}/{namespace}", response_model=NamespaceOut)
def get_namespace(tenant: str, namespace: str, tenants: TenantsDep) -> NamespaceOut:
    perms = tenants.permissions(
        tenant=check_part("tenant", tenant), namespace=check_part("namespace", namespace)
    )
    return NamespaceOut(name=f"{tenant}/{namespace}", permissions=perms)


@router.delete("/{tenant}/{namespace}", status_code=204, response_class=Response)
def delete_namespace(tenant: str, namespace: str, tenants: TenantsDep) -> Response:
    """Delete a namespace without topics (409 while it has some), with its grants and policies."""
    tenants.delete_namespace(
        tenant=check_part("tenant", tenant), namespace=check_part("namespace", namespace)
    )
    return Response(status_code=204)
