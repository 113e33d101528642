"""A forget that could not clear every place is owed: ``erasures.completed_at``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26

``completed_at`` is when every place was cleared; null: the forget is owed, and a retry or the
consolidator's next pass finishes it to exactly its scope (``worker.erasure.owed``). Rows
written before this revision were complete forgets or are taken as such: their time is
``forgotten_at``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("erasures", sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE erasures SET completed_at = forgotten_at")
    op.create_index(
        "ix_erasures_owed",
        "erasures",
        ["forgotten_at"],
        unique=False,
        postgresql_where=sa.text("completed_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_erasures_owed", table_name="erasures")
    op.drop_column("erasures", "completed_at")
