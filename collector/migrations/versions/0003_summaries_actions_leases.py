"""Per-group summaries over time, remediation actions, and job leases.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "group_summaries",
        sa.Column("job_id", sa.String(256), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("gid", sa.String(256), primary_key=True),
        sa.Column("window_start", sa.Float, primary_key=True),
        sa.Column("window_s", sa.Float, nullable=False),
        sa.Column("ops", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("ranks", sa.Integer, nullable=False),
        sa.Column("seq_first", sa.BigInteger, nullable=False),
        sa.Column("seq_last", sa.BigInteger, nullable=False),
        sa.Column("time_sum_s", sa.Float, nullable=False),
        sa.Column("time_min_ms", sa.Float, nullable=False),
        sa.Column("time_p50_ms", sa.Float, nullable=False),
        sa.Column("time_p99_ms", sa.Float, nullable=False),
        sa.Column("time_max_ms", sa.Float, nullable=False),
        sa.Column("kinds", sa.JSON, nullable=False),
        sa.Column("hist", sa.JSON, nullable=False),
        sa.Column("writer", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_group_summaries_window_start", "group_summaries", ["window_start"])
    op.create_table(
        "actions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(256), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column(
            "suspect_id", sa.Integer, sa.ForeignKey("suspects.id", ondelete="SET NULL"), nullable=True, index=True
        ),
        sa.Column("node", sa.String(256), nullable=True),
        sa.Column("ranks", sa.JSON, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("state", sa.String(32), nullable=False, index=True),
        sa.Column("steps", sa.JSON, nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.Column("key", sa.String(256), nullable=True, unique=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False, index=True),
        sa.Column("updated_at", sa.Float, nullable=False, index=True),
        sa.Column("finished_at", sa.Float, nullable=True),
    )
    op.create_table(
        "job_leases",
        sa.Column("job_id", sa.String(256), primary_key=True),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("holder_url", sa.String(512), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False, index=True),
    )


def downgrade() -> None:
    op.drop_table("job_leases")
    op.drop_table("actions")
    op.drop_index("ix_group_summaries_window_start", table_name="group_summaries")
    op.drop_table("group_summaries")
