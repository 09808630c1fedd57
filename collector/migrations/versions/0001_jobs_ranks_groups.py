"""Jobs, their ranks and their process groups.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(256), primary_key=True),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False, index=True),
        sa.Column("world", sa.Integer, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("policy", sa.JSON, nullable=True),
        sa.Column("meta", sa.JSON, nullable=True),
    )
    op.create_table(
        "ranks",
        sa.Column("job_id", sa.String(256), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("node", sa.String(256), nullable=False, index=True),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("incarnation", sa.String(256), nullable=False),
        sa.Column("restart", sa.Integer, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
        sa.Column("ops", sa.BigInteger, nullable=False),
        sa.Column("drops", sa.BigInteger, nullable=False),
        sa.Column("batches", sa.BigInteger, nullable=False),
        sa.Column("last_batch", sa.BigInteger, nullable=False),
        sa.Column("end_reason", sa.Text, nullable=True),
        sa.Column("meta", sa.JSON, nullable=True),
    )
    op.create_table(
        "groups",
        sa.Column("job_id", sa.String(256), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("gid", sa.String(256), primary_key=True),
        sa.Column("desc", sa.String(256), nullable=True),
        sa.Column("members", sa.JSON, nullable=True),
        sa.Column("size", sa.Integer, nullable=True),
        sa.Column("backend", sa.String(64), nullable=True),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("ops", sa.BigInteger, nullable=False),
        sa.Column("op_counts", sa.JSON, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("groups")
    op.drop_table("ranks")
    op.drop_table("jobs")
