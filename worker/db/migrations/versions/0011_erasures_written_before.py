"""A forget covers what was written before it: ``erasures.written_before``, and rows stamped
when they are written.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27

An erasure decided what it covers by a row's ``occurred_at``, a time the client gives: a turn
remembered after a forget but dated before it was taken as forgotten (never embedded, deleted
when an owed forget was finished), and a turn dated in the future but written before the forget
outlived an owed one. ``written_before`` is the instant the forget took effect: it covers a row
written before it (``recorded_at``) whose ``occurred_at`` is in the forget's range (``before``,
``since``: about the data). Null, every row written before this migration: the rule it was
written under (``occurred_at`` before ``cutoff``), so no existing erasure covers more or less.
``recorded_at`` of episodes and lifecycle events defaults to ``clock_timestamp()`` (the
moment of the INSERT, after the writer took its project lock) rather than ``now()`` (when its
transaction began, possibly before a forget it waited for). Downgrade drops the column and
restores the defaults (the erasures written since then cover by ``cutoff`` again).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("erasures", sa.Column("written_before", _WHEN, nullable=True))
    for table in ("episodes", "lifecycle_events"):
        op.alter_column(table, "recorded_at", server_default=sa.text("clock_timestamp()"))


def downgrade() -> None:
    for table in ("episodes", "lifecycle_events"):
        op.alter_column(table, "recorded_at", server_default=sa.text("now()"))
    op.drop_column("erasures", "written_before")
