"""A fleet on one database: queued Runs, runners and their heartbeats, kept output, sites.

- ``runs``: ``target`` may be NULL (a submitted Run has none until a runner selects its adapter);
  ``request`` (what a submitted Run asks for; NULL for a Run started in place),
  ``attempt`` (attempts claimed so far), ``lease_id`` (the current attempt's lease),
  ``runner_id`` (the runner holding it), ``site`` (the adapter placement it landed on),
  ``claimed_at``; an index over ``(status, created_at)`` for the claim.
- ``allocations``: ``site`` (where the allocation lives: one Docker engine among several)
  and ``lease_epoch`` (the attempt that journaled it).
- ``leases``: an index over ``owner``, for a runner's heartbeat.
- ``runners``: one row per runner process, with its heartbeat.
- ``run_output``: a Run's output as its runner streamed it, by attempt.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # SQLite cannot relax NOT NULL in place: the batch copies ``runs`` into a new table (within the
    # migrating transaction, so a crash leaves the old one whole).
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("target", existing_type=sa.Text, nullable=True)
        batch.add_column(sa.Column("request", sa.Text, nullable=True))
        batch.add_column(sa.Column("attempt", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("lease_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("runner_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("site", sa.String(256), nullable=True))
        batch.add_column(sa.Column("claimed_at", sa.Float, nullable=True))
    op.create_index("ix_runs_status_created_at", "runs", ["status", "created_at"])
    op.add_column("allocations", sa.Column("site", sa.String(256), nullable=True))
    op.add_column("allocations", sa.Column("lease_epoch", sa.BigInteger, nullable=True))
    op.create_index("ix_leases_owner", "leases", ["owner"])
    op.create_table(
        "runners",
        sa.Column("runner_id", sa.String(128), primary_key=True),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("runner_tag", sa.String(128), nullable=False),
        sa.Column("concurrency", sa.Integer, nullable=False),
        sa.Column("lease_ttl", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("stopped_at", sa.Float, nullable=True),
    )
    op.create_table(
        "run_output",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("stream", sa.String(8), nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("ix_run_output_run_id", "run_output", ["run_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_run_output_run_id", "run_output")
    op.drop_table("run_output")
    op.drop_table("runners")
    op.drop_index("ix_leases_owner", "leases")
    op.drop_index("ix_runs_status_created_at", "runs")
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("lease_epoch")
        batch.drop_column("site")
    op.execute("DELETE FROM runs WHERE target IS NULL")  # queued Runs have no place in the old schema
    with op.batch_alter_table("runs") as batch:
        for column in ("claimed_at", "site", "runner_id", "lease_id", "attempt", "request"):
            batch.drop_column(column)
        batch.alter_column("target", existing_type=sa.Text, nullable=False)
