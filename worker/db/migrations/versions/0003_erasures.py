"""The erasure record: one row per ``memworker forget`` (ids, times and counts, no content).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25

``worker.db.models.Erasure`` says what a row covers; the consolidator, the replays and the
indexer skip what it covers.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "erasures",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("project_id", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=True),
        sa.Column("before", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cutoff", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "forgotten_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "counts",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_erasures")),
    )
    op.create_index(
        op.f("ix_erasures_project_id_session_id"),
        "erasures",
        ["project_id", "session_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_erasures_project_id_session_id"), table_name="erasures")
    op.drop_table("erasures")
