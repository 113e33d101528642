"""A turn's id is unique per (project, user), not per project.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26

Before, ``(project_id, turn_id)`` was unique: a user remembering an id another user of the
project held got a conflict (an existence oracle across users, and a way to claim ids another
user would use). Now two unique indexes key a turn: ``(project_id, turn_id, user_id)`` among the
turns of named users, and ``(project_id, turn_id)`` among those of no user (the anonymous
bucket is one user: Postgres would take two nulls as distinct). ``turn_id`` leads, so a lookup
by ``(project_id, turn_id)`` reads the index.

Rows already stored keep their ``id`` and ``source_event_id`` (derived from the project and the
turn's id): nothing is rewritten. New turns derive both from the project, the user and the id
(``worker.user_memory.turns.turn_uuid``), and are found by their columns, never by derivation.

Downgrade refuses while an id is held by more than one user of a project (the old key cannot
hold them): forget one of them first.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "uq_episodes_project_id_turn_id_user_id",
        "episodes",
        ["project_id", "turn_id", "user_id"],
        unique=True,
        postgresql_where=sa.text("turn_id IS NOT NULL"),
    )
    op.create_index(
        "uq_episodes_project_id_turn_id_no_user",
        "episodes",
        ["project_id", "turn_id"],
        unique=True,
        postgresql_where=sa.text("turn_id IS NOT NULL AND user_id IS NULL"),
    )
    op.drop_constraint("uq_episodes_project_id_turn_id", "episodes", type_="unique")


def downgrade() -> None:
    op.execute(
        "DO $$ BEGIN IF EXISTS (SELECT 1 FROM episodes WHERE turn_id IS NOT NULL"
        " GROUP BY project_id, turn_id HAVING count(*) > 1) THEN RAISE EXCEPTION"
        " 'cannot downgrade below 0007: a turn id is held by more than one user of a project"
        " (forget one of them first)'; END IF; END $$"
    )
    op.create_unique_constraint(
        "uq_episodes_project_id_turn_id", "episodes", ["project_id", "turn_id"]
    )
    op.drop_index("uq_episodes_project_id_turn_id_no_user", table_name="episodes")
    op.drop_index("uq_episodes_project_id_turn_id_user_id", table_name="episodes")
