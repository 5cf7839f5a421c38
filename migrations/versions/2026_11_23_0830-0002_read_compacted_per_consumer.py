"""readCompacted belongs to the consumer: drop the subscription-level flag

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 08:30:00

As in Pulsar, each consumer chooses ``readCompacted`` when it attaches; a subscription holds
only its position and acknowledgements. Existing subscriptions keep their position and acks;
their consumers now say what they read.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cursors") as batch:
        batch.drop_column("read_compacted")


def downgrade() -> None:
    with op.batch_alter_table("cursors") as batch:
        batch.add_column(sa.Column("read_compacted", sa.Boolean(), nullable=False, server_default=sa.false()))
