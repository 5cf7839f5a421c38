"""The tenants migration carries existing topics' tenants and namespaces over."""

from __future__ import annotations

from sqlalchemy import text

from migrations import upgrade
from service.db import Database
from service.settings import Settings
from service.tenants import TenantService


def test_migration_makes_public_and_the_namespaces_topics_and_policies_use(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.database_url, "0001")
    db = Database(settings.database_url)
    try:
        with db.session() as s:
            s.execute(
                text(
                    "INSERT INTO topics (tenant, namespace, name, created_at) VALUES "
                    "('acme', 'orders', 't1', 0), ('acme', 'orders', 't2', 0), ('beta', 'ns', 't', 0)"
                )
            )
            s.execute(text("INSERT INTO policies (tenant, namespace, topic) VALUES ('gamma', 'ns', '')"))
        upgrade(settings.database_url)
        tenants = TenantService(db=db, topics_of=lambda t, n: [])
        assert tenants.tenants() == ["acme", "beta", "gamma", "public"]
        assert tenants.namespaces(tenant="acme") == ["acme/orders"]
        assert tenants.namespaces(tenant="public") == ["public/default"]
        tenants.require_namespace(tenant="beta", namespace="ns")
        assert tenants.tenant(tenant="acme").admin_roles == []
    finally:
        db.dispose()
