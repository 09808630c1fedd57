"""Webhook subscriptions, their deliveries and attempts, and the outbox cursor.

Revision ID: 0004
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("description", sa.String(200), nullable=True),
        sa.Column("secret", sa.Text, nullable=True),
        sa.Column("routing_key", sa.Text, nullable=True),
        sa.Column("job_id", sa.String(256), nullable=True),
        sa.Column("kinds", sa.JSON, nullable=True),
        sa.Column("min_score", sa.Float, nullable=True),
        sa.Column("events", sa.JSON, nullable=False),
        sa.Column("after_event_id", sa.Integer, nullable=False, server_default="0"),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("disabled_at", sa.Float, nullable=True),
        sa.Column("disabled_reason", sa.Text, nullable=True),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "webhook_id", sa.Integer, sa.ForeignKey("webhooks.id", ondelete="CASCADE"), nullable=False, index=True
        ),
        sa.Column("event_id", sa.Integer, nullable=True),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("msg_id", sa.String(64), nullable=False, unique=True),
        sa.Column("order_key", sa.String(300), nullable=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=False, index=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("tries", sa.Integer, nullable=False, server_default="0"),
        sa.Column("delivered_at", sa.Float, nullable=True),
        sa.Column("last_status", sa.Integer, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.UniqueConstraint("webhook_id", "event_id"),
    )
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "delivery_id",
            sa.Integer,
            sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("duration_ms", sa.Float, nullable=False),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_table(
        "outbox_cursors",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("event_id", sa.Integer, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("outbox_cursors")
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhooks")
