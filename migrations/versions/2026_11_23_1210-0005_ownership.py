"""ownership: instances, topic leases with epochs, the epoch of each ledger

Several service instances on one PostgreSQL database (README, "Running several instances"):
each registers in ``instances`` with its advertised URL and a heartbeat; a topic is owned
through its row in ``topic_leases`` (the owner, an epoch raised by every takeover, and when the
lease lapses). Every ledger records the epoch of the owner that opened it. Existing topics get
a lease nobody holds (epoch 0, lapsed), and existing ledgers epoch 0.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 12:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "instances",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("url", sa.String(length=512), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger(), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "topic_leases",
        sa.Column("topic_id", _ID, nullable=False),
        sa.Column("instance_id", sa.BigInteger(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["topic_id"], ["topics.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("topic_id"),
    )
    op.create_index("ix_topic_leases_instance", "topic_leases", ["instance_id"])
    with op.batch_alter_table("ledgers") as batch:
        batch.add_column(sa.Column("epoch", sa.BigInteger(), nullable=False, server_default="0"))
    op.execute(
        "INSERT INTO topic_leases (topic_id, instance_id, epoch, expires_at) "
        "SELECT id, NULL, 0, 0 FROM topics"
    )


def downgrade() -> None:
    with op.batch_alter_table("ledgers") as batch:
        batch.drop_column("epoch")
    op.drop_index("ix_topic_leases_instance", table_name="topic_leases")
    op.drop_table("topic_leases")
    op.drop_table("instances")
