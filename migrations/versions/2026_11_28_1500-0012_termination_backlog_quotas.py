"""topic termination and backlog quotas: a topic's terminated position (Pulsar's terminate: the
last message id it will ever have), and the backlog quotas of namespaces and topics (Pulsar's
BacklogQuota, one row per scope and quota type)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.add_column(sa.Column("terminated_ledger", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("terminated_entry", sa.BigInteger(), nullable=True))
    op.create_table(
        "backlog_quotas",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
        ),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("namespace", sa.String(length=128), nullable=False),
        sa.Column("topic", sa.String(length=128), nullable=False, server_default=""),
        sa.Column("quota_type", sa.String(length=32), nullable=False),
        sa.Column("limit_size", sa.BigInteger(), nullable=False),
        sa.Column("limit_time", sa.BigInteger(), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.UniqueConstraint("tenant", "namespace", "topic", "quota_type", name="uq_backlog_quotas_scope"),
    )


def downgrade() -> None:
    op.drop_table("backlog_quotas")
    with op.batch_alter_table("topics") as batch:
        batch.drop_column("terminated_entry")
        batch.drop_column("terminated_ledger")
