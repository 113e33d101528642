"""A user's turns by session: an index on ``episodes (project_id, user_id, session_id)``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27

Recall reads the whole sessions of its best turns
(``worker.user_memory.recall_sessions.read_context_sessions``), and the inspector a session's
messages, by ``project_id = … AND user_id = … AND session_id = ANY(…)``: no index served that,
so each read went through all of the user's turns (10,000 turns: ~20 ms of the recall page,
BENCHMARKS.md, the memory inspector). Partial, ``WHERE turn_id IS NOT NULL``: only turns are
read this way, so the session episodes the consolidator writes cost it nothing. Downgrade
drops the index (nothing is lost).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_episodes_project_id_user_id_session_id"


def upgrade() -> None:
    op.create_index(
        INDEX,
        "episodes",
        ["project_id", "user_id", "session_id"],
        postgresql_where=sa.text("turn_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="episodes")
