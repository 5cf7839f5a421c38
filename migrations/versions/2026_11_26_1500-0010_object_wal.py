"""object storage: write-ahead chunks (COMPACTOR_WAL=object) and the sealer's epoch of a ledger

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

IdType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "wal_chunks",
        sa.Column("id", IdType, primary_key=True, autoincrement=True),
        sa.Column("ledger_id", IdType, sa.ForeignKey("ledgers.id", ondelete="CASCADE"), nullable=False),
        sa.Column("first_entry", sa.BigInteger(), nullable=False),
        sa.Column("entries", sa.BigInteger(), nullable=False),
        sa.Column("object_key", sa.String(length=512), nullable=False),
        sa.Column("byte_offset", sa.BigInteger(), nullable=False),
        sa.Column("byte_length", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_wal_chunks_ledger", "wal_chunks", ["ledger_id", "first_entry"])
    op.create_index("ix_wal_chunks_object", "wal_chunks", ["object_key"])
    with op.batch_alter_table("ledgers") as batch:
        batch.add_column(sa.Column("sealed_epoch", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("ledgers") as batch:
        batch.drop_column("sealed_epoch")
    op.drop_index("ix_wal_chunks_object", table_name="wal_chunks")
    op.drop_index("ix_wal_chunks_ledger", table_name="wal_chunks")
    op.drop_table("wal_chunks")
