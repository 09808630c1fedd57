"""The standby pool.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "standby_nodes",
        sa.Column("cluster", sa.String(128), primary_key=True),
        sa.Column("node", sa.String(256), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=True),
        sa.Column("added_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("standby_nodes")
