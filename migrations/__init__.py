"""Alembic environment and revisions: the only place the metadata schema is created."""
