"""topic tables: compacted topics as Iceberg tables (the catalog's rows, each topic's commit
state) and the compaction policy's ``table`` field

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.add_column(sa.Column("table_enabled", sa.Boolean(), nullable=True))
    op.create_table(
        "topic_tables",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("namespace", sa.String(128), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("metadata_location", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "table_commit_states",
        sa.Column(
            "topic_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.ForeignKey("topics.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("lag_rounds", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=True),
        sa.Column("ledger_id", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("table_commit_states")
    op.drop_table("topic_tables")
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("table_enabled")
