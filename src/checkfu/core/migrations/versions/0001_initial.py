"""The journal as it was before versioned migrations: runs, leases, allocations, events, enrollments.

Exactly the schema ``metadata.create_all`` made up to and including commit 1129d89. A journal
written then has no ``alembic_version``; it is brought here by this same revision, which creates
each table and index only when it is missing (all are present in such a journal, or some of them
when a crash cut its creation short), and upgraded onwards from here.

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def _missing(name: str) -> bool:
    return not sa.inspect(op.get_bind()).has_table(name)


def _index(name: str, table: str, columns: list[str]) -> None:
    if name not in {i["name"] for i in sa.inspect(op.get_bind()).get_indexes(table)}:
        op.create_index(name, table, columns)


def upgrade() -> None:
    if _missing("runs"):
        _runs()
    if _missing("leases"):
        _leases()
    if _missing("allocations"):
        _allocations()
    _index("ix_allocations_run_id", "allocations", ["run_id"])
    _index("ix_allocations_runner_tag", "allocations", ["runner_tag"])
    _index("ix_allocations_state", "allocations", ["state"])
    if _missing("events"):
        _events()
    _index("ix_events_run_id", "events", ["run_id"])
    if _missing("enrollments"):
        _enrollments()
    _index("ix_enrollments_provider", "enrollments", ["provider"])


def _runs() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("runner_tag", sa.String(128), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("profile_digest", sa.String(80), nullable=True),
        sa.Column("command", sa.Text, nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("summary", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
    )


def _leases() -> None:
    op.create_table(
        "leases",
        sa.Column("lease_id", sa.String(128), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("ended", sa.Boolean, nullable=False),
    )


def _allocations() -> None:
    op.create_table(
        "allocations",
        sa.Column("allocation_key", sa.String(128), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("runner_tag", sa.String(128), nullable=False),
        sa.Column("lease_id", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("object_id", sa.String(256), nullable=True),
        sa.Column("parent_key", sa.String(128), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def _events() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("member", sa.String(32), nullable=False),
        sa.Column("allocation_key", sa.String(128), nullable=True),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("duration_ms", sa.Float, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("detail", sa.Text, nullable=True),
    )


def _enrollments() -> None:
    op.create_table(
        "enrollments",
        sa.Column("target", sa.Text, primary_key=True),
        sa.Column("provider", sa.String(256), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("envelope_digest", sa.String(80), nullable=False),
        sa.Column("envelope", sa.Text, nullable=False),
        sa.Column("ceiling", sa.Text, nullable=False),
        sa.Column("evidence", sa.Text, nullable=True),
        sa.Column("credential_path", sa.Text, nullable=True),
        sa.Column("credential_fingerprint", sa.String(80), nullable=True),
        sa.Column("enrolled_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("enrollments", "events", "allocations", "leases", "runs"):
        op.drop_table(table)
