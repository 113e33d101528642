"""User memory (``worker.user_memory``): per-turn episodes, pinned blocks, bi-temporal facts,
the change feed's outbox, and erasures that name a user.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25

- ``episodes`` gains what a turn has (``turn_id``, ``input``, ``output``, ``tool_calls``,
  ``tool_transcript``) and ``consolidated_at`` (the extractor ran on it). One session may now
  hold many turns, so ``(project_id, session_id)`` is unique only among session episodes
  (``turn_id`` null), and ``(project_id, turn_id)`` among turns. ``search_vector`` now reads a
  turn's input and output too: a generated column cannot be altered, so it is dropped and added
  again, which rewrites ``episodes`` (and rebuilds its GIN index) once: on a large table,
  migrate when the consolidator may wait for it. A partial index finds the session episodes
  whose lessons are not yet facts (``ix_episodes_unconsolidated_sessions``).
- ``memory_blocks``: a user's pinned blocks (``user_key`` '' is the anonymous bucket).
- ``facts``: bi-temporal facts, searched by words (``search_vector``).
- ``memory_changes``: the change feed's outbox (rows live until published, then deleted).
- ``erasures.user_id``: a forget may name a user.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SUMMARY = (
    "substr(context_summary,"
    " coalesce(nullif(strpos(context_summary, '\nTask state: '), 0),"
    " nullif(strpos(context_summary, '\nLast steps'), 0),"
    " length(context_summary) + 1),"
    " greatest(least("
    "coalesce(nullif(strpos(context_summary, '\nVariables ('), 0),"
    " length(context_summary) + 1)"
    " - coalesce(nullif(strpos(context_summary, '\nTask state: '), 0),"
    " nullif(strpos(context_summary, '\nLast steps'), 0),"
    " length(context_summary) + 1),"
    " 1000), 0))"
)
_LESSONS = (
    " || setweight(jsonb_to_tsvector('english'::regconfig, lessons_learned,"
    " '[\"string\"]'::jsonb), 'B')"
)
SEARCH_VECTOR_0001 = (
    "setweight(to_tsvector('english'::regconfig, coalesce(task_description, '')), 'A')"
    f"{_LESSONS} || setweight(to_tsvector('english'::regconfig, outcome || ' ' || {_SUMMARY}),"
    " 'C')"
)
SEARCH_VECTOR_0005 = (
    "setweight(to_tsvector('english'::regconfig, coalesce(task_description, input, '')), 'A')"
    f"{_LESSONS} || setweight(to_tsvector('english'::regconfig, coalesce(output, '')), 'B')"
    " || setweight(to_tsvector('english'::regconfig,"
    f" CASE WHEN turn_id IS NULL THEN outcome || ' ' || {_SUMMARY} ELSE '' END), 'C')"
)
"""``worker.db.models.SEARCH_VECTOR_SQL`` before and after this revision."""
FACT_SEARCH = (
    "to_tsvector('english'::regconfig,"
    " subject || ' ' || replace(predicate, '_', ' ') || ' ' || object)"
)
_JSONB = postgresql.JSONB(astext_type=sa.Text())
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    for name, kind in (
        ("turn_id", sa.Text()),
        ("input", sa.Text()),
        ("output", sa.Text()),
        ("tool_calls", _JSONB),
        ("tool_transcript", _JSONB),
        ("consolidated_at", _WHEN),
    ):
        op.add_column("episodes", sa.Column(name, kind, nullable=True))
    op.drop_constraint("uq_episodes_project_id_session_id", "episodes", type_="unique")
    op.create_index(
        "uq_episodes_project_id_session_id",
        "episodes",
        ["project_id", "session_id"],
        unique=True,
        postgresql_where=sa.text("turn_id IS NULL"),
    )
    op.create_unique_constraint(
        op.f("uq_episodes_project_id_turn_id"), "episodes", ["project_id", "turn_id"]
    )
    _search_vector(SEARCH_VECTOR_0005)
    op.create_index(
        "ix_episodes_unconsolidated_sessions",
        "episodes",
        ["id"],
        postgresql_where=sa.text("consolidated_at IS NULL AND turn_id IS NULL"),
    )

    op.create_table(
        "memory_blocks",
        sa.Column("project_id", sa.Text(), nullable=False),
        sa.Column("user_key", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("pinned_order", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", _WHEN, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("project_id", "user_key", "name", name=op.f("pk_memory_blocks")),
    )
    op.create_table(
        "facts",
        sa.Column("project_id", sa.Text(), nullable=False),
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=True),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("predicate", sa.Text(), nullable=False),
        sa.Column("object", sa.Text(), nullable=False),
        sa.Column("confidence", sa.Double(), nullable=False),
        sa.Column("valid_from", _WHEN, nullable=False),
        sa.Column("valid_until", _WHEN, nullable=True),
        sa.Column("recorded_at", _WHEN, nullable=False),
        sa.Column("sources", _JSONB, server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("embedding", postgresql.ARRAY(sa.Double()), nullable=True),
        sa.Column("embedding_model", sa.Text(), nullable=True),
        sa.Column(
            "search_vector",
            postgresql.TSVECTOR(),
            sa.Computed(FACT_SEARCH, persisted=True),
            nullable=True,
        ),
        sa.PrimaryKeyConstraint("project_id", "id", name=op.f("pk_facts")),
    )
    op.create_index(
        op.f("ix_facts_project_id_user_id_subject_predicate"),
        "facts",
        ["project_id", "user_id", "subject", "predicate"],
        unique=False,
    )
    op.create_index(
        op.f("ix_facts_project_id_user_id_recorded_at"),
        "facts",
        ["project_id", "user_id", "recorded_at"],
        unique=False,
    )
    op.create_index("ix_facts_search_vector", "facts", ["search_vector"], postgresql_using="gin")
    op.create_table(
        "memory_changes",
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("project_id", sa.Text(), nullable=False),
        sa.Column("payload", _JSONB, nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_memory_changes")),
    )
    op.create_index(
        op.f("ix_memory_changes_project_id_seq"),
        "memory_changes",
        ["project_id", "seq"],
        unique=False,
    )
    op.add_column("erasures", sa.Column("user_id", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("erasures", "user_id")
    op.drop_index(op.f("ix_memory_changes_project_id_seq"), table_name="memory_changes")
    op.drop_table("memory_changes")
    op.drop_index("ix_facts_search_vector", table_name="facts")
    op.drop_index(op.f("ix_facts_project_id_user_id_recorded_at"), table_name="facts")
    op.drop_index(op.f("ix_facts_project_id_user_id_subject_predicate"), table_name="facts")
    op.drop_table("facts")
    op.drop_table("memory_blocks")
    op.drop_index("ix_episodes_unconsolidated_sessions", table_name="episodes")
    op.execute("DELETE FROM episodes WHERE turn_id IS NOT NULL")
    _search_vector(SEARCH_VECTOR_0001)
    op.drop_constraint(op.f("uq_episodes_project_id_turn_id"), "episodes", type_="unique")
    op.drop_index("uq_episodes_project_id_session_id", table_name="episodes")
    op.create_unique_constraint(
        "uq_episodes_project_id_session_id", "episodes", ["project_id", "session_id"]
    )
    for name in (
        "consolidated_at",
        "tool_transcript",
        "tool_calls",
        "output",
        "input",
        "turn_id",
    ):
        op.drop_column("episodes", name)


def _search_vector(expression: str) -> None:
    """Replace ``episodes.search_vector`` (a generated column cannot be altered)."""
    op.drop_index("ix_episodes_search_vector", table_name="episodes")
    op.drop_column("episodes", "search_vector")
    op.add_column(
        "episodes",
        sa.Column(
            "search_vector",
            postgresql.TSVECTOR(),
            sa.Computed(expression, persisted=True),
            nullable=False,
        ),
    )
    op.create_index(
        "ix_episodes_search_vector", "episodes", ["search_vector"], postgresql_using="gin"
    )
