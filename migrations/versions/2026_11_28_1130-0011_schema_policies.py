"""schema policies: a topic's or namespace's schema compatibility strategy, auto-update and
validation switches (Pulsar's schemaCompatibilityStrategy, isAllowAutoUpdateSchema,
schemaValidationEnforced)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.add_column(sa.Column("schema_compatibility_strategy", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("is_allow_auto_update_schema", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("schema_validation_enforced", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("schema_validation_enforced")
        batch.drop_column("is_allow_auto_update_schema")
        batch.drop_column("schema_compatibility_strategy")
