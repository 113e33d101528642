"""A session's episode per life: ``episodes.life``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27

A session id may be spawned again once its tombstone is gone (a new life, named by its spawn:
16 hex digits of the SHA-1 of the spawn's ``event_id``, as the apply function keeps it). The
unique index on ``(project_id, session_id)`` of session episodes let only the first life have
one: the next life's terminate was stored in ``lifecycle_events`` and its episode silently
dropped. Now the index is on ``(project_id, session_id, life)``: one episode per life, and a
replayed or redelivered terminate of a life still none more.

Existing rows get ``life`` ``''``: each was its session id's only episode, so ``''`` names that
one life (the terminate results they came from carry no ``life`` either, so a replay of them
finds them). Downgrade puts back one episode per session id: it refuses while a session id has
episodes of more than one life (forget or delete all but one of each first).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "uq_episodes_project_id_session_id"
_NEW = "uq_episodes_project_id_session_id_life"


def upgrade() -> None:
    # A constant default: Postgres 11+ adds the column without rewriting the table.
    op.add_column(
        "episodes", sa.Column("life", sa.Text(), server_default=sa.text("''"), nullable=False)
    )
    op.create_index(
        _NEW,
        "episodes",
        ["project_id", "session_id", "life"],
        unique=True,
        postgresql_where=sa.text("turn_id IS NULL"),
    )
    op.drop_index(_OLD, table_name="episodes")


def downgrade() -> None:
    reused = op.get_bind().execute(
        sa.text(
            "SELECT project_id, session_id FROM episodes WHERE turn_id IS NULL"
            " GROUP BY project_id, session_id HAVING count(*) > 1 LIMIT 1"
        )
    )
    first = reused.first()
    if first is not None:
        raise RuntimeError(
            f"session {first[0]}/{first[1]} has episodes of more than one life (episodes.life):"
            " revision 0008 keeps one per session id; forget or delete the others first"
        )
    op.create_index(
        _OLD,
        "episodes",
        ["project_id", "session_id"],
        unique=True,
        postgresql_where=sa.text("turn_id IS NULL"),
    )
    op.drop_index(_NEW, table_name="episodes")
    op.drop_column("episodes", "life")
