"""tenants, namespaces and permissions

Tenants and namespaces become objects, as in Pulsar; ``public`` and ``public/default`` exist
from the start, and every tenant and namespace that existing topics or policies name is
carried over, so no topic is left in a namespace that does not exist.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 08:30:00
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tenants = op.create_table(
        "tenants",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("admin_roles", sa.Text(), nullable=False),
        sa.Column("allowed_clusters", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    namespaces = op.create_table(
        "namespaces",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant", "name"),
    )
    op.create_table(
        "permissions",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("namespace", sa.String(length=128), nullable=False),
        sa.Column("topic", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=256), nullable=False),
        sa.Column("actions", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "namespace", "topic", "role"),
    )

    conn = op.get_bind()
    pairs = {("public", "default")}
    for table in ("topics", "policies"):
        rows = conn.execute(sa.text(f"SELECT DISTINCT tenant, namespace FROM {table}"))
        pairs.update((str(t), str(n)) for t, n in rows)
    now = int(time.time() * 1000)
    names = sorted({t for t, _ in pairs})
    op.bulk_insert(
        tenants,
        [{"name": t, "admin_roles": "[]", "allowed_clusters": "[]", "created_at": now} for t in names],
    )
    op.bulk_insert(namespaces, [{"tenant": t, "name": n, "created_at": now} for t, n in sorted(pairs)])


def downgrade() -> None:
    op.drop_table("permissions")
    op.drop_table("namespaces")
    op.drop_table("tenants")
