"""Alembic revisions of the journal, oldest first (Alembic skips this file)."""
