"""partitioned topic properties: the properties a partitioned topic was created with (Pulsar's
PartitionedTopicMetadata.properties, which its admin clients send and read back)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("partitioned_topics") as batch:
        batch.add_column(sa.Column("properties", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("partitioned_topics") as batch:
        batch.drop_column("properties")
