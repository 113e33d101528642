"""Episodes belong to a user: the nullable ``episodes.user_id`` (the spawn's ``user_id``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25

Adding a nullable column without a default changes only the catalog (no table rewrite). The
index ``(project_id, user_id, occurred_at)`` serves ``recall``/``list_episodes`` with
``user_id``; building it (in the migration's transaction) holds inserts into ``episodes`` back
for as long as it takes on a large table: migrate when the consolidator may wait that long.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("episodes", sa.Column("user_id", sa.Text(), nullable=True))
    op.create_index(
        op.f("ix_episodes_project_id_user_id_occurred_at"),
        "episodes",
        ["project_id", "user_id", "occurred_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_episodes_project_id_user_id_occurred_at"), table_name="episodes")
    op.drop_column("episodes", "user_id")
