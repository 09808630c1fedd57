"""Suspects, their history, and the events outbox.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "suspects",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(256), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("key", sa.String(512), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False, index=True),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("ranks", sa.JSON, nullable=False),
        sa.Column("nodes", sa.JSON, nullable=False),
        sa.Column("link", sa.JSON, nullable=True),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("detected_at", sa.Float, nullable=False, index=True),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("resolved_at", sa.Float, nullable=True),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("slowdown", sa.Float, nullable=True),
        sa.Column("peak_slowdown", sa.Float, nullable=True),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("flight_recorder", sa.JSON, nullable=True),
    )
    op.create_table(
        "suspect_history",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "suspect_id", sa.Integer, sa.ForeignKey("suspects.id", ondelete="CASCADE"), nullable=False, index=True
        ),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("slowdown", sa.Float, nullable=True),
        sa.Column("note", sa.Text, nullable=True),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False, index=True),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False, index=True),
        sa.Column("suspect_id", sa.Integer, nullable=True),
        sa.Column("action_id", sa.Integer, nullable=True),
        sa.Column("payload", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("suspect_history")
    op.drop_table("suspects")
