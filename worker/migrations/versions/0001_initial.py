"""Initial schema: lifecycle_events (every result) and episodes (long-term memory).

Revision ID: 0001
Revises:
Create Date: 2026-11-22

``episodes.search_vector`` is a stored generated column, so full-text search needs no trigger
and a replayed row can never disagree with its text.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "episodes",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("source_event_id", sa.Text(), nullable=False),
        sa.Column("project_id", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("agent_instance_id", sa.Text(), nullable=True),
        sa.Column("agent_type_id", sa.Text(), nullable=True),
        sa.Column("task_description", sa.Text(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column(
            "lessons_learned",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("context_summary", sa.Text(), nullable=False),
        sa.Column("snapshot", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("tokens_used", sa.BigInteger(), nullable=True),
        sa.Column("importance_score", sa.Double(), nullable=False),
        sa.Column("duration_seconds", sa.Double(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("announced_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "search_vector",
            postgresql.TSVECTOR(),
            sa.Computed(
                "setweight(to_tsvector('english'::regconfig, coalesce(task_description, '')), 'A')"
                " || setweight(jsonb_to_tsvector('english'::regconfig, lessons_learned,"
                " '[\"string\"]'::jsonb), 'B')"
                " || setweight(to_tsvector('english'::regconfig,"
                " left(coalesce(context_summary, ''), 1000)), 'C')",
                persisted=True,
            ),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episodes")),
        sa.UniqueConstraint(
            "project_id", "session_id", name=op.f("uq_episodes_project_id_session_id")
        ),
        sa.UniqueConstraint("source_event_id", name=op.f("uq_episodes_source_event_id")),
    )
    op.create_index(
        op.f("ix_episodes_project_id_occurred_at"),
        "episodes",
        ["project_id", "occurred_at"],
        unique=False,
    )
    op.create_index(
        "ix_episodes_search_vector",
        "episodes",
        ["search_vector"],
        unique=False,
        postgresql_using="gin",
    )
    op.create_table(
        "lifecycle_events",
        sa.Column("event_id", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("project_id", sa.Text(), nullable=True),
        sa.Column("session_id", sa.Text(), nullable=True),
        sa.Column("agent_instance_id", sa.Text(), nullable=True),
        sa.Column("causation_id", sa.Text(), nullable=False),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_lifecycle_events")),
    )
    op.create_index(
        op.f("ix_lifecycle_events_project_id_session_id_occurred_at"),
        "lifecycle_events",
        ["project_id", "session_id", "occurred_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(
        op.f("ix_lifecycle_events_project_id_session_id_occurred_at"), table_name="lifecycle_events"
    )
    op.drop_table("lifecycle_events")
    op.drop_index("ix_episodes_search_vector", table_name="episodes", postgresql_using="gin")
    op.drop_index(op.f("ix_episodes_project_id_occurred_at"), table_name="episodes")
    op.drop_table("episodes")
