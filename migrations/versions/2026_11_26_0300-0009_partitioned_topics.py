"""partitioned topics: Pulsar's partitioned-topic metadata (the partition count of each)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 03:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "partitioned_topics",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("namespace", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("partitions", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "namespace", "name"),
    )


def downgrade() -> None:
    op.drop_table("partitioned_topics")
