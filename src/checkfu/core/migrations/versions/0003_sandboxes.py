"""Long-lived sandboxes and the snapshots taken of them.

- ``sandboxes``: one row per sandbox that outlives the command that made it
  (``checkfu sandbox create``, ``checkfu.Sandbox``): its Run, its instance's allocation key and id,
  its lease, its owner (a process, or none when detached), its time-to-live deadline and its state.
- ``sandbox_snapshots``: one row per snapshot taken of a sandbox, with the profile and mounts a
  resume needs, and its expiry when the provider reported one.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "sandboxes",
        sa.Column("sandbox_id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("runner_tag", sa.String(128), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("site", sa.String(256), nullable=True),
        sa.Column("allocation_key", sa.String(128), nullable=False),
        sa.Column("instance_id", sa.String(256), nullable=True),
        sa.Column("lease_id", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(256), nullable=True),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("mounts", sa.Text, nullable=False),
        sa.Column("origin", sa.String(128), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
    )
    op.create_index("ix_sandboxes_state", "sandboxes", ["state", "runner_tag"])
    op.create_table(
        "sandbox_snapshots",
        sa.Column("snapshot_ref", sa.String(64), primary_key=True),
        sa.Column("sandbox_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("runner_tag", sa.String(128), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("site", sa.String(256), nullable=True),
        sa.Column("allocation_key", sa.String(128), nullable=False),
        sa.Column("snapshot_id", sa.String(256), nullable=False),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("mounts", sa.Text, nullable=False),
        sa.Column("keep_seconds", sa.Float, nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("deleted_at", sa.Float, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("sandbox_snapshots")
    op.drop_index("ix_sandboxes_state", "sandboxes")
    op.drop_table("sandboxes")
