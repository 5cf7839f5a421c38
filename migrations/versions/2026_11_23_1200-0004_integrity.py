"""integrity: checksums and damage of ledgers, scrub runs

Every ledger row gets the CRC32C of its file (a sealed ledger: the Parquet file; a compacted
ledger: its manifest, which carries its parts' checksums), what damage was found in it, when
an operator accepted losing the damaged entries (``skip-damaged``) and which entries those
are, the checksum of the copy of its intact rows that compactions read from then, and when
the scrubber last verified it. Rows written before this revision have no checksum: the
scrubber computes one on its first pass (README, "Integrity and repair").

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

IdType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("ledgers") as batch:
        batch.add_column(sa.Column("checksum", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("damage", sa.Text(), nullable=True))
        batch.add_column(sa.Column("damaged_at", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("damage_accepted_at", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("lost_entries", sa.Text(), nullable=True))
        batch.add_column(sa.Column("salvage_checksum", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("verified_at", sa.BigInteger(), nullable=True))
    op.create_table(
        "scrub_runs",
        sa.Column("id", IdType, autoincrement=True, nullable=False),
        sa.Column("topic_id", IdType, nullable=False),
        sa.Column("trigger", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("finished_at", sa.BigInteger(), nullable=True),
        sa.Column("files_checked", sa.BigInteger(), nullable=False),
        sa.Column("bytes_checked", sa.BigInteger(), nullable=False),
        sa.Column("damaged_files", sa.BigInteger(), nullable=False),
        sa.Column("checksums_recorded", sa.BigInteger(), nullable=False),
        sa.Column("findings", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["topic_id"], ["topics.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_scrub_runs_topic", "scrub_runs", ["topic_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_scrub_runs_topic", table_name="scrub_runs")
    op.drop_table("scrub_runs")
    with op.batch_alter_table("ledgers") as batch:
        for name in (
            "verified_at",
            "salvage_checksum",
            "lost_entries",
            "damage_accepted_at",
            "damaged_at",
            "damage",
            "checksum",
        ):
            batch.drop_column(name)
