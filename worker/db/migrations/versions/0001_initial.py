"""Initial schema: lifecycle_events (every result) and episodes (long-term memory).

Revision ID: 0001
Revises:
Create Date: 2026-11-22

``episodes.search_vector`` is a stored generated column, so full-text search needs no trigger
and a replayed row can never disagree with its text (``worker.db.models.SEARCH_VECTOR_SQL``
says what it reads). ``episodes`` leaves half of each page free: the UPDATE of
``announced_at`` every episode gets is then a HOT update (``EPISODES_FILLFACTOR``).

The large columns (a snapshot, a summary, a result) are compressed with lz4 where the server
has it (PostgreSQL 14 and later, built with lz4, as the official images are): pglz compressing
snapshots was the largest single cost of inserting an episode, lz4 does it several times
faster. Elsewhere they keep the server's default.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


LZ4_COLUMNS = (
    ("episodes", "snapshot"),
    ("episodes", "context_summary"),
    ("lifecycle_events", "payload"),
)


def _server_has_lz4() -> bool:
    if context.is_offline_mode():
        return False
    has = op.get_bind().execute(
        sa.text(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        )
    )
    return bool(has.scalar())


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
                " || setweight(to_tsvector('english'::regconfig, outcome || ' ' || substr("
                "context_summary,"
                " coalesce(nullif(strpos(context_summary, '\nTask state: '), 0),"
                " nullif(strpos(context_summary, '\nLast steps'), 0),"
                " length(context_summary) + 1),"
                " greatest(least("
                "coalesce(nullif(strpos(context_summary, '\nVariables ('), 0),"
                " length(context_summary) + 1)"
                " - coalesce(nullif(strpos(context_summary, '\nTask state: '), 0),"
                " nullif(strpos(context_summary, '\nLast steps'), 0),"
                " length(context_summary) + 1),"
                " 1000), 0))), 'C')",
                persisted=True,
            ),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episodes")),
        sa.UniqueConstraint(
            "project_id", "session_id", name=op.f("uq_episodes_project_id_session_id")
        ),
        sa.UniqueConstraint("source_event_id", name=op.f("uq_episodes_source_event_id")),
        postgresql_with={"fillfactor": 50},
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
    if _server_has_lz4():
        for table, column in LZ4_COLUMNS:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4")


def downgrade() -> None:
    op.drop_index(
        op.f("ix_lifecycle_events_project_id_session_id_occurred_at"), table_name="lifecycle_events"
    )
    op.drop_table("lifecycle_events")
    op.drop_index("ix_episodes_search_vector", table_name="episodes", postgresql_using="gin")
    op.drop_index(op.f("ix_episodes_project_id_occurred_at"), table_name="episodes")
    op.drop_table("episodes")
